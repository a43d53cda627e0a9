"""Which file names are checkpoints, and the name a file gives its encoder.

Kept apart from :mod:`pipeline.encoders.checkpoints.reading` (which imports torch) so that scanning a folder
and reading a config stay light.
"""

from __future__ import annotations

import os
from pathlib import Path

SAFETENSORS_EXTENSIONS = (".safetensors",)
PICKLE_EXTENSIONS = (".pth", ".pt", ".bin", ".ckpt", ".pth.tar", ".tar")
CHECKPOINT_EXTENSIONS = SAFETENSORS_EXTENSIONS + PICKLE_EXTENSIONS


def checkpoint_extension(name: str | os.PathLike[str]) -> str | None:
    """The checkpoint extension a file name ends with (``.pth.tar`` before ``.tar``), or None.

    Parameters
    ----------
    name : str or os.PathLike
        A file name or path.

    Returns
    -------
    str or None
        One of :data:`CHECKPOINT_EXTENSIONS` (lower case).
    """
    lower = Path(name).name.lower()
    return next((e for e in sorted(CHECKPOINT_EXTENSIONS, key=len, reverse=True) if lower.endswith(e)), None)


def checkpoint_stem(name: str | os.PathLike[str]) -> str:
    """The file name without its checkpoint extension (``moco.pth.tar`` -> ``moco``).

    Parameters
    ----------
    name : str or os.PathLike
        A file name or path.

    Returns
    -------
    str
        The name without the extension; without a known one, without its last suffix.
    """
    base = Path(name).name
    ext = checkpoint_extension(base)
    return base[:-len(ext)] if ext else Path(base).stem
