"""Load an encoder and make sure its weights are the file the run planned to read."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.errors import WeightsChangedError

__all__ = ["file_signature", "load_checked", "weights_file"]


def weights_file(spec: Any) -> Path | None:
    """The checkpoint file ``spec`` reads (None: pretrained or random weights)."""
    if getattr(spec, "weights_kind", None) != "checkpoint":
        return None
    return Path(spec.weights).expanduser()


def file_signature(path: str | os.PathLike | None) -> list[int] | None:
    """``[size, mtime_ns, inode]`` of a file (None when there is no file or it cannot be
    read): what tells a rewritten or replaced checkpoint from the one seen before."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [int(st.st_size), int(st.st_mtime_ns), int(st.st_ino)]


def _what(sig: list[int] | None) -> str:
    if sig is None:
        return "missing"
    when = datetime.fromtimestamp(sig[1] / 1e9, timezone.utc).isoformat(timespec="milliseconds")
    return f"{sig[0]} bytes, modified {when}"


def load_checked(spec: Any, expected: list[int] | None = None, **load_options: Any):
    """``load_encoder(spec, **load_options)``, refused when its checkpoint is not the planned file."""
    # deferred: torch and timm load in the worker that extracts
    from pipeline.encoders import load_encoder

    path = weights_file(spec)
    before = file_signature(path)
    # a scan's signature is [size, mtime_ns]; a plan's own stat adds the inode
    if path is not None and expected is not None and before is not None and before[:len(expected)] != list(expected):
        raise WeightsChangedError(
            f"checkpoint {path} was rewritten after this run was planned ({_what(list(expected))} then, "
            f"{_what(before)} now): nothing is extracted from it and its cells are not evaluated (no record from mixed "
            "weights); the next run or scan takes it")
    encoder = load_encoder(spec, **load_options)
    after = file_signature(path)
    if path is not None and after != before:
        raise WeightsChangedError(
            f"checkpoint {path} changed while it was read ({_what(before)} before, {_what(after)} after): "
            "what was loaded is not one file's weights, so nothing is extracted from it; the next run or scan takes it")
    return encoder
