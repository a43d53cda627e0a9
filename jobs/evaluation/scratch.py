"""Where a cell keeps its resumable training state until its record is written."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from jobs.config.run import ExtractConfig, repeval_home
from storage_schema import keys, record_keys
from storage_schema.provenance import stable_hash

__all__ = ["remove_scratch", "scratch_folder"]


def scratch_folder(store: Any, extract: ExtractConfig, kind: str, run_id: str, part: str | None = None) -> Path:
    """Where a run keeps its resumable state (see the module doc)."""
    key = record_keys.scratch_key(kind, run_id, part)
    if extract.scratch_dir:
        return Path(extract.scratch_dir) / key.removeprefix(keys.SCRATCH + "/")
    if store.backend.local:
        return Path(store.backend.path(key))
    return repeval_home() / "scratch" / stable_hash(store.url, 16) / key.removeprefix(keys.SCRATCH + "/")


def remove_scratch(store: Any, extract: ExtractConfig, kind: str, run_id: str) -> None:
    """Delete a recorded run's scratch folder (its states are no longer needed)."""
    shutil.rmtree(scratch_folder(store, extract, kind, run_id), ignore_errors=True)
