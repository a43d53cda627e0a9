"""The store's one write path: arrays written chunk by chunk by the holder of their lease."""

from __future__ import annotations

import json
import logging
import queue
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.codecs import Crc32cCodec, ZstdCodec

from pipeline.errors import IncompleteArrayError, StoreError
from storage_schema import keys
from storage_schema.arrays import ArrayStatus
from storage_schema.backend import Backend, write_errors
from storage_schema.leases import Lease
from storage_schema.provenance import now_iso

log = logging.getLogger(__name__)

Chunks = Iterable[tuple[int, Mapping[str, np.ndarray]]]
Produce = Callable[[Mapping[str, frozenset[int]]], Chunks]
_IN_FLIGHT = 2  # chunks queued for the writer thread: bounds memory


@dataclass(frozen=True)
class ArraySpec:
    """One array to write: its key, layout and provenance (with its fingerprint).

    Parameters
    ----------
    key : str
        Where the array goes (built by :mod:`storage_schema.keys`).
    shape : tuple of int
        Its shape, rows first.
    chunk_rows : int
        Rows per chunk; the unit of writing and of resuming.
    dtype : str
        The stored dtype.
    attrs : mapping
        Provenance, written once at creation; must hold ``fingerprint``.
    """

    key: str
    shape: tuple[int, ...]
    chunk_rows: int
    dtype: str
    attrs: Mapping[str, Any] = field(repr=False)

    def __post_init__(self) -> None:
        if "fingerprint" not in self.attrs:
            raise StoreError(f"attributes of {self.key!r} need a 'fingerprint'")
        if not isinstance(self.chunk_rows, int) or self.chunk_rows < 1:
            raise StoreError(f"chunk_rows of {self.key!r} must be a positive integer, got {self.chunk_rows!r}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def fingerprint(self) -> str:
        """The fingerprint recorded in the attributes."""
        return str(self.attrs["fingerprint"])

    @property
    def n_chunks(self) -> int:
        """Number of chunks along the rows."""
        return -(-self.shape[0] // self.chunk_rows)

    @classmethod
    def of(cls, status: ArrayStatus) -> ArraySpec:
        """The spec of an existing array, to rewrite some of its chunks (a repair).

        Parameters
        ----------
        status : ArrayStatus
            The stored array's status.

        Returns
        -------
        ArraySpec
            A spec that keeps the array as it is.
        """
        return cls(status.storage_key, status.shape, status.chunk_rows, status.dtype, status.attrs)


@dataclass
class WriteResult:
    """What :meth:`ArrayWriter.write_arrays` did.

    Parameters
    ----------
    chunks : dict
        The chunks each array needed, by key.
    resumed : bool
        Whether an array kept chunks written before (an interrupted write resumed).
    """

    chunks: dict[str, list[int]]
    resumed: bool


class ArrayWriter:
    """Writes arrays, aliases and their bookkeeping into one store."""

    def __init__(self, backend: Backend, zarr_store: Store, status: Callable[[str], ArrayStatus | None]):
        self.backend = backend
        self.zarr_store = zarr_store
        self.status = status
        self.url = backend.redacted_url()

    def write_arrays(self, lease: Lease, arrays: Sequence[ArraySpec], produce: Produce, *,
                     chunks: Mapping[str, Iterable[int]] | None = None, complete: bool = True) -> WriteResult:
        """Write ``arrays`` chunk by chunk from what ``produce`` yields."""
        self.backend.check_writable(keys.SIDE)
        lease.check()
        opened, todo, resumed = {}, {}, False
        for spec in arrays:
            opened[spec.key], done = self._prepare(lease, spec)
            wanted = set(range(spec.n_chunks)) - done if chunks is None else set(chunks.get(spec.key, ()))
            todo[spec.key] = frozenset(wanted)
            resumed = resumed or bool(done and wanted)
        specs = {spec.key: spec for spec in arrays}
        writer = _ChunkWriter(lambda chunk, key, rows: self._write_chunk(lease, opened[key], specs[key], chunk, rows))
        try:
            for chunk, blocks in produce(todo):
                writer.put(chunk, {k: rows for k, rows in blocks.items() if chunk in todo.get(k, ())})
        finally:
            writer.close()
        if complete:
            for spec in arrays:
                self._complete(lease, spec)
        return WriteResult({k: sorted(v) for k, v in todo.items()}, resumed)

    def write_alias(self, lease: Lease, key: str, target: ArrayStatus, attrs: Mapping[str, Any]) -> None:
        """Serve the complete array ``target`` under ``key`` too (identical rows)."""
        lease.check()
        if not target.complete or target.alias_of is not None:
            raise StoreError(f"cannot alias {key!r} to {target.key!r}: the target must be a complete stored array")
        if self.status(key) is not None:
            self._delete_array(key)
        record = {"target": target.key, "fingerprint": target.fingerprint, "attrs": dict(attrs), "created": now_iso()}
        self.backend.write_atomic(keys.alias_key(key), json.dumps(record, default=str).encode())

    # -- the steps ---------------------------------------------------------------------------
    def _prepare(self, lease: Lease, spec: ArraySpec) -> tuple[zarr.Array, set[int]]:
        """The array to write into and the chunks it already holds."""
        old = self.status(spec.key)
        if old is not None and old.fingerprint == spec.fingerprint and (old.shape, old.chunk_rows) == (
            spec.shape, spec.chunk_rows
        ):
            self.backend.check_inside(spec.key)
            return zarr.open_array(self.zarr_store, path=spec.key, mode="r+", zarr_format=3), set(old.done_chunks)
        if old is not None:
            log.warning("replacing %s (fingerprint %s -> %s, chunk rows %d -> %d)", spec.key, old.fingerprint[:12],
                        spec.fingerprint[:12], old.chunk_rows, spec.chunk_rows)
        return self._create(lease, spec, replaces=old is not None), set()

    def _create(self, lease: Lease, spec: ArraySpec, replaces: bool) -> zarr.Array:
        self.backend.check_inside(spec.key)
        lease.check()
        if replaces:
            self.backend.delete(keys.state_key(spec.key), recursive=True)
        self.backend.delete(keys.alias_key(spec.key))  # a real array replaces an alias
        floating = np.dtype(spec.dtype).kind == "f"
        with warnings.catch_warnings(), write_errors(self.url, f"the metadata of {spec.key!r}"):
            warnings.simplefilter("ignore", UserWarning)  # zarr warns about _repeval/ not being a node
            return zarr.create_array(
                self.zarr_store, name=spec.key, shape=spec.shape, dtype=spec.dtype,
                chunks=(spec.chunk_rows,) + spec.shape[1:],
                # crc32c: a flipped byte in a chunk file is detected on read
                compressors=[ZstdCodec(level=1), Crc32cCodec()],
                fill_value=np.nan if floating else 0,
                attributes={**spec.attrs, "created": now_iso()},
                overwrite=True,
            )

    def _write_chunk(self, lease: Lease, array: zarr.Array, spec: ArraySpec, chunk: int, rows: np.ndarray) -> None:
        lease.check()
        start = chunk * spec.chunk_rows
        stop = min(start + spec.chunk_rows, spec.shape[0])
        if rows.shape[0] != stop - start:
            raise StoreError(f"chunk {chunk} of {spec.key!r} needs {stop - start} rows, got {rows.shape[0]}")
        with write_errors(self.url, f"chunk {chunk} of {spec.key!r}"):
            array[start:stop] = rows
        self.backend.write_atomic(keys.chunk_marker_key(spec.key, spec.fingerprint, chunk), b"")

    def _complete(self, lease: Lease, spec: ArraySpec) -> None:
        lease.check()
        st = self.status(spec.key)
        if st is None or st.fingerprint != spec.fingerprint:
            raise StoreError(f"cannot complete {spec.key!r}: stored fingerprint differs")
        missing = sorted(set(range(st.n_chunks)) - st.done_chunks)
        if missing:
            raise IncompleteArrayError(f"cannot complete {spec.key!r}: chunks {missing[:10]} not written")
        record = {"fingerprint": spec.fingerprint, "completed": now_iso(), "rows": st.shape[0]}
        self.backend.write_atomic(keys.completion_key(spec.key, spec.fingerprint), json.dumps(record).encode())
        self.backend.write_atomic(keys.fingerprint_index_key(spec.fingerprint),
                                  json.dumps({"key": spec.key}).encode())

    def _delete_array(self, key: str) -> None:
        self.backend.delete(keys.state_key(key), recursive=True)
        self.backend.delete(key, recursive=True)


class _ChunkWriter:
    """Runs ``write(chunk, key, rows)`` on one background thread, at most two chunks queued."""

    def __init__(self, write: Callable[[int, str, np.ndarray], None]):
        self.write = write
        self.q: queue.Queue = queue.Queue(maxsize=_IN_FLIGHT)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="repeval-chunk-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.q.get()) is not None:
            if self.error is not None:
                continue  # drain after a failure
            chunk, blocks = item
            try:
                for key, rows in blocks.items():
                    self.write(chunk, key, rows)
            except BaseException as exc:  # re-raised on the producer's thread
                self.error = exc

    def put(self, chunk: int, blocks: Mapping[str, np.ndarray]) -> None:
        if self.error is not None:
            raise self.error
        self.q.put((chunk, blocks))

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
