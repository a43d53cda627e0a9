"""Saved training state of one fine-tuning run: atomic writes, RNG capture, identity check."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.encoders.checkpoints.formats import container_format
from pipeline.encoders.checkpoints.pickle_budget import check_pickle_budget
from pipeline.encoders.checkpoints.reading import torch_message
from pipeline.errors import CheckpointError
from pipeline.terminal import short

STATE_FILE = "state.pt"
FORMAT = 1

__all__ = ["STATE_FILE", "capture_rng", "load_state", "restore_rng", "run_identity", "save_state"]


def run_identity(fields: dict[str, Any]) -> str:
    """What a saved state must match: SHA-256 of the JSON of ``fields`` (sorted keys)."""
    text = json.dumps({"format": FORMAT, **fields}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def capture_rng(device: torch.device) -> dict[str, Any]:
    """The process-wide RNG states: torch (CPU, and the CUDA device in use), Python, NumPy."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss),
                  float(cached)),
        "cuda": None,
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Put back the RNG states of :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_state(scratch_dir: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``scratch_dir/state.pt`` atomically (temporary file, fsync, rename)."""
    scratch_dir.mkdir(parents=True, exist_ok=True)
    final = scratch_dir / STATE_FILE
    tmp = scratch_dir / f".{STATE_FILE}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        torch.save({"format": FORMAT, **state}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(scratch_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def load_state(scratch_dir: Path, identity: str, what: str = "fine-tuning") -> dict[str, Any] | None:
    """The saved state of the run ``identity``, or None when ``scratch_dir`` holds none."""
    path = scratch_dir / STATE_FILE
    if not path.is_file():
        return None
    try:  # a scratch folder is a folder like any other: its file is read under the checkpoints' budget
        check_pickle_budget(path, container_format(path) or "")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError as exc:
        raise CheckpointError(f"Saved {what} state {str(path)!r} cannot be read: {exc}") from exc
    except Exception as exc:  # torch raises several types for a damaged file
        raise CheckpointError(f"Saved {what} state {str(path)!r} cannot be read: {torch_message(str(exc))}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"Saved {what} state {str(path)!r} has an unknown format "
                              f"{short(state.get('format')) if isinstance(state, dict) else type(state).__name__!r}")
    if state.get("identity") != identity:
        raise CheckpointError(
            f"Scratch folder {str(scratch_dir)!r} holds the state of another {what} run "
            f"(identity {str(state.get('identity'))[:12]}..., this run {identity[:12]}...): other weights, "
            "data, settings or grid point. Give each run its own scratch folder, or delete the old state."
        )
    return state
