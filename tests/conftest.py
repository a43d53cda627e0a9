"""Session-wide isolation: offline hub, a private PREFECT_HOME, no analytics, and a
working folder without .env/prefect.toml so local settings files cannot leak in."""

from __future__ import annotations

import os
import tempfile

_PREFECT_HOME = tempfile.mkdtemp(prefix="repeval-prefect-home-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.pop("PREFECT_API_URL", None)

import pytest  # noqa: E402


@pytest.fixture
def store_url(tmp_path):
    """A fresh local store location (the S3 variant lives with the scale-out tests)."""
    return str(tmp_path / "store")
