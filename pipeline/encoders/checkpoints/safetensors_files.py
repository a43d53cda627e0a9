"""safetensors checkpoints: the tensors, the header alone (shapes and dtypes as meta
tensors, or its ``__metadata__``, read without torch), and a torn file named as such."""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import CheckpointError

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["read_safetensors", "safetensors_metadata"]


def read_safetensors(path: str | os.PathLike[str], meta: bool = False) -> dict[str, Tensor]:
    """The tensors of a safetensors file, on the CPU, or (``meta``) only their names,
    shapes and dtypes as meta tensors (no tensor bytes read)."""
    import torch  # deferred: the header's metadata (safetensors_metadata) is read without torch

    path = Path(path)
    _check_complete(path)
    if meta:
        from safetensors import safe_open

        with _readable(path, "safetensors checkpoint"), safe_open(str(path), framework="pt") as f:
            return {k: torch.empty(tuple(f.get_slice(k).get_shape()), dtype=_dtype_of(f.get_slice(k).get_dtype()),
                                   device="meta") for k in f.keys()}
    from safetensors.torch import load_file

    with _readable(path, "safetensors checkpoint"):
        return load_file(str(path), device="cpu")


def safetensors_metadata(path: str | os.PathLike[str]) -> Mapping[str, object]:
    """The ``__metadata__`` of a safetensors file's header (strings; no tensor is read)."""
    from safetensors import safe_open

    path = Path(path)
    with _readable(path, "the safetensors header of"), safe_open(str(path), framework="numpy") as handle:
        return handle.metadata() or {}


@contextlib.contextmanager
def _readable(path: Path, what: str) -> Iterator[None]:
    """What safetensors raises on a file it cannot read, as a CheckpointError naming it."""
    from safetensors import SafetensorError

    try:
        yield
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot read {what} {path.name!r}: {exc}") from exc


def _dtype_of(code: str) -> torch.dtype:
    import torch  # deferred: as in read_safetensors, its only caller

    names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
             "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
    return getattr(torch, names.get(code, "float32"))


def _check_complete(path: Path) -> None:
    """Refuse a safetensors file shorter than its header says: the usual sign of a checkpoint
    still being copied or written, which deserves a clearer message than a header error."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            needed = 8 + n
            if needed <= size:
                header = json.loads(f.read(n))
                needed += max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                              default=0)
    except (struct.error, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return  # garbled rather than short: safetensors' own error says more
    if needed > size:
        raise CheckpointError(f"safetensors checkpoint {path.name!r} is truncated: its header describes "
                              f"{needed} bytes, the file holds {size} (still being written?)")
