"""Typed, length-delimited SHA-256 for dataset fingerprints."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

_HASH_BLOCK = 1 << 20  # bytes read at a time when hashing a file


class Hasher:
    """SHA-256 with typed, length-delimited updates, so fields cannot run into each other."""

    def __init__(self, kind: str) -> None:
        self._h = hashlib.sha256()
        self.text(kind)

    def text(self, value: str) -> Hasher:
        """Add one text field."""
        data = value.encode()
        self._h.update(len(data).to_bytes(8, "little") + data)
        return self

    def texts(self, values: list[str]) -> Hasher:
        """Add a list of text fields, preceded by its length."""
        self.text(str(len(values)))
        for v in values:
            self.text(v)
        return self

    def array(self, arr: np.ndarray) -> Hasher:
        """Add an array: its dtype, shape and bytes."""
        arr = np.ascontiguousarray(arr)
        self.text(f"{arr.dtype.str}{arr.shape}")
        self._h.update(memoryview(arr.reshape(-1).view(np.uint8)))
        return self

    def array_blocks(self, dtype: np.dtype, shape: tuple[int, ...], blocks: Iterable[np.ndarray]) -> Hasher:
        """Add an array given as its row blocks, in order (read block by block, never whole):
        the digest :meth:`array` gives the whole array of that dtype and shape."""
        self.text(f"{np.dtype(dtype).str}{tuple(shape)}")
        for block in blocks:
            self._h.update(memoryview(np.ascontiguousarray(block, dtype=dtype).reshape(-1).view(np.uint8)))
        return self

    def file(self, path: Path) -> Hasher:
        """Add a file: its size, then its bytes, streamed (bounded memory)."""
        self.text(str(path.stat().st_size))
        with open(path, "rb") as fh:
            while block := fh.read(_HASH_BLOCK):
                self._h.update(block)
        return self

    def hexdigest(self) -> str:
        """The hash so far."""
        return self._h.hexdigest()
