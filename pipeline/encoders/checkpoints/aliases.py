"""Whether two checkpoint files hold the same weights: a link, a copy, or the same state
saved twice by the training code under two names."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pipeline.encoders.checkpoints.facts import recall, remember
from pipeline.encoders.checkpoints.reading import read_checkpoint, tensor_mappings, weights_fingerprint

__all__ = ["content_fingerprint", "same_file", "same_weights", "sizes_close"]

_SIZE_SLACK = 64 * 1024  # bytes two saves of one state may differ by (record names in the archive)


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` are one file on disk (a symbolic or hard link of the other)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def sizes_close(a: int, b: int) -> bool:
    """Whether two file sizes may be one state saved twice: within 64 KiB, or a tenth of a percent."""
    return abs(a - b) <= max(_SIZE_SLACK, max(a, b) // 1000)


def content_fingerprint(path: str | os.PathLike[str]) -> str:
    """SHA-256 over every tensor mapping a checkpoint holds: each one's place in the file
    and :func:`pipeline.encoders.checkpoints.reading.weights_fingerprint`; independent of
    the file's name, format and other entries (epoch, optimizer, arguments)."""
    real = Path(path).resolve()
    known, out = recall(real, "content")  # this very file (size, modification time), read before
    if known:
        return str(out)
    digest = hashlib.sha256()
    for where, tensors in sorted(tensor_mappings(read_checkpoint(real)).items()):
        digest.update(f"{where}\x00{weights_fingerprint(tensors)}\n".encode())
    out = digest.hexdigest()
    remember(real, "content", out)
    return out


def same_weights(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two checkpoint files hold the same tensors: one file, or sizes close and
    equal content fingerprints."""
    if same_file(a, b):
        return True
    if not sizes_close(os.path.getsize(a), os.path.getsize(b)):
        return False
    return content_fingerprint(a) == content_fingerprint(b)
