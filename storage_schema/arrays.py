"""Stored arrays as readers see them: status without data, reads that name damaged chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import google_crc32c
import numpy as np
import zarr

from pipeline.errors import CorruptChunkError
from storage_schema import keys

ReadBytes = Callable[[str], "bytes | None"]  # a store-relative key -> its bytes, None if absent
_CRC_BYTES = 4


@dataclass(frozen=True)
class ArrayStatus:
    """What the store knows about one array, without reading its data.

    Parameters
    ----------
    key : str
        The array's key (for an alias, the key asked for, not where the rows live).
    fingerprint : str
        What the rows were computed from (weights, preprocessing, data, dtype).
    shape : tuple of int
        The array's shape, rows first.
    dtype : str
        The stored dtype.
    chunk_rows : int
        Rows per chunk.
    done_chunks : frozenset of int
        Chunks recorded as written.
    complete : bool
        Whether the completion record exists (the array is readable).
    attrs : dict
        Provenance attributes (an alias's own provenance overlaid on its target's).
    alias_of : str, optional
        For an alias, the key of the array holding the rows; None otherwise.
    """

    key: str
    fingerprint: str
    shape: tuple[int, ...]
    dtype: str
    chunk_rows: int
    done_chunks: frozenset[int]
    complete: bool
    attrs: dict[str, Any] = field(repr=False)
    alias_of: str | None = None

    @property
    def n_chunks(self) -> int:
        """Number of chunks along the rows (0 for an empty array)."""
        return max(1, -(-self.shape[0] // self.chunk_rows)) if self.shape[0] else 0

    @property
    def fraction_done(self) -> float:
        """Share of chunks written, 1.0 once complete."""
        return 1.0 if self.complete else len(self.done_chunks) / max(self.n_chunks, 1)

    @property
    def storage_key(self) -> str:
        """The key whose Zarr array holds the rows: the target of an alias, else ``key``."""
        return self.alias_of or self.key

    def first_missing_chunk(self) -> int | None:
        """The first chunk not yet written, or None when every chunk is.

        Returns
        -------
        int or None
            The chunk index where a resumed write starts.
        """
        return next((c for c in range(self.n_chunks) if c not in self.done_chunks), None)

    def chunk_range(self, rows: slice) -> range:
        """The chunks that hold ``rows``.

        Parameters
        ----------
        rows : slice
            A slice of rows (step 1).

        Returns
        -------
        range
            The indices of the chunks overlapping ``rows``.
        """
        start, stop, _ = rows.indices(self.shape[0])
        return range(start // self.chunk_rows, -(-stop // self.chunk_rows)) if stop > start else range(0)


def damaged_chunks(array: zarr.Array, chunks: Iterable[int], read_bytes: ReadBytes) -> list[int]:
    """The chunks among ``chunks`` whose stored bytes fail their crc32c."""
    bad = []
    for c in chunks:
        coords = (int(c),) + (0,) * (array.ndim - 1)
        raw = read_bytes(keys.chunk_data_key(array.path, array.metadata.encode_chunk_key(coords)))
        if raw is None:
            continue
        stored, payload = raw[-_CRC_BYTES:], raw[:-_CRC_BYTES]
        if len(raw) < _CRC_BYTES or np.uint32(google_crc32c.value(payload)).tobytes() != stored:
            bad.append(int(c))
    return bad


class StoredArray:
    """A complete array opened for reading: numpy, dask or row slices.

    Parameters
    ----------
    array : zarr.Array
        The Zarr array holding the rows.
    status : ArrayStatus
        Its status (key, fingerprint, provenance).
    read_bytes : callable
        Reads a store-relative key's bytes; used to name damaged chunks.
    """

    def __init__(self, array: zarr.Array, status: ArrayStatus, read_bytes: ReadBytes):
        self.array = array
        self.status = status
        self._read_bytes = read_bytes

    key = property(lambda self: self.status.key)
    fingerprint = property(lambda self: self.status.fingerprint)
    shape = property(lambda self: self.status.shape)
    attrs = property(lambda self: self.status.attrs)

    def read(self, rows: slice | None = None) -> np.ndarray:
        """Read rows into memory.

        Parameters
        ----------
        rows : slice, optional
            The rows to read; all of them by default.

        Returns
        -------
        numpy.ndarray
            The rows.

        Raises
        ------
        CorruptChunkError
            When a chunk of ``rows`` fails its checksum; the message names the chunks.
        """
        rows = rows if rows is not None else slice(None)
        try:
            return self.array[rows]
        except ValueError as exc:  # zarr's decoding error; whether a checksum failed is checked below
            bad = damaged_chunks(self.array, self.status.chunk_range(rows), self._read_bytes)
            if not bad:
                raise
            raise self._corruption(bad) from exc

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """Read some rows, in the order given (only their chunks are read).

        Parameters
        ----------
        rows : numpy.ndarray
            Row indices.

        Returns
        -------
        numpy.ndarray
            ``len(rows)`` rows.

        Raises
        ------
        CorruptChunkError
            When a chunk holding one of ``rows`` fails its checksum.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.empty((0, *self.shape[1:]), dtype=self.status.dtype)
        try:
            return self.array.oindex[rows]
        except ValueError as exc:  # zarr's decoding error; whether a checksum failed is checked below
            chunks = sorted({int(r) // self.status.chunk_rows for r in rows})
            bad = damaged_chunks(self.array, chunks, self._read_bytes)
            if not bad:
                raise
            raise self._corruption(bad) from exc

    def _corruption(self, bad: list[int]) -> CorruptChunkError:
        chunk_rows, n = self.status.chunk_rows, self.shape[0]
        spans = ", ".join(f"{c * chunk_rows}-{min((c + 1) * chunk_rows, n) - 1}" for c in bad)
        return CorruptChunkError(
            f"{self.key!r}: chunk(s) {bad} fail their crc32c checksum (rows {spans}); "
            "the stored bytes were damaged after writing: re-extract the array"
        )

    def to_dask(self, rows_per_block: int | None = None):
        """A lazy dask array over the rows.

        Parameters
        ----------
        rows_per_block : int, optional
            Rows per dask block; the chunk rows by default.

        Returns
        -------
        dask.array.Array
            The array, read chunk by chunk when computed.
        """
        import dask.array as da  # readers only; keeps the write path free of dask

        chunks = (rows_per_block or self.status.chunk_rows,) + tuple(self.shape[1:])
        return da.from_zarr(self.array, chunks=chunks)

    def __repr__(self) -> str:
        return f"StoredArray({self.key!r}, shape={self.shape}, fingerprint={self.fingerprint[:12]})"
