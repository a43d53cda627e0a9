"""Provenance attributes of feature arrays and the fingerprint that identifies them."""

from __future__ import annotations

import hashlib
import json
import platform
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

# Bump when the way features are computed changes (pooling, layer naming...): every
# stored array then counts as stale and is re-extracted.
FEATURE_CODE_VERSION = 1

_LIBRARIES = ("repeval", "torch", "torchvision", "timm", "numpy", "zarr")


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for lib in _LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = "not installed"
    return out


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def stable_hash(obj: Any, length: int = 32) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def array_fingerprint(
    *, weights_fingerprint: str, data_config: dict, layer: str, pooling: str,
    dataset_fingerprint: str, split: str, dtype: str, arch: str, compute_precision: str = "float32",
) -> str:
    """What the features depend on. Anything else (time, host, file names) is left out so
    that identical weights under another file name reuse the features."""
    return stable_hash(
        {
            "code": FEATURE_CODE_VERSION, "weights": weights_fingerprint, "arch": arch,
            "data_config": data_config, "layer": layer, "pooling": pooling,
            "dataset": dataset_fingerprint, "split": split, "dtype": dtype,
            "precision": compute_precision,  # float16 autocast features differ from float32 ones
        }
    )


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
