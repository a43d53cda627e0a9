"""Which file names are checkpoints, and the name a file gives its encoder."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.errors import CheckpointError

SAFETENSORS_EXTENSIONS = (".safetensors",)
PICKLE_EXTENSIONS = (".pth", ".pt", ".bin", ".ckpt", ".pth.tar", ".tar")
CHECKPOINT_EXTENSIONS = SAFETENSORS_EXTENSIONS + PICKLE_EXTENSIONS


def checkpoint_extension(name: str | os.PathLike[str]) -> str | None:
    """The checkpoint extension a file name ends with (``.pth.tar`` before ``.tar``), or None."""
    lower = Path(name).name.lower()
    return next((e for e in sorted(CHECKPOINT_EXTENSIONS, key=len, reverse=True) if lower.endswith(e)), None)


def checkpoint_stem(name: str | os.PathLike[str]) -> str:
    """The file name without its checkpoint extension (``moco.pth.tar`` -> ``moco``)."""
    base = Path(name).name
    ext = checkpoint_extension(base)
    return base[:-len(ext)] if ext else Path(base).stem


def checked_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as given (a symlink keeps its own name), refused unless it is an existing
    file with a checkpoint extension."""
    path = Path(path).expanduser()
    if checkpoint_extension(path) is None:
        suffix = path.suffix or "(none)"
        raise CheckpointError(
            f"Checkpoint {str(path)!r} has unsupported extension {suffix!r}; "
            f"valid extensions: {', '.join(CHECKPOINT_EXTENSIONS)}"
        )
    if not path.is_file():
        target = f" (a link to {os.readlink(path)!r}, which is missing)" if path.is_symlink() else ""
        raise CheckpointError(f"Checkpoint file {str(path)!r} does not exist{target}")
    return path
