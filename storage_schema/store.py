"""The feature store: a Zarr v3 hierarchy plus repeval's bookkeeping beside it.

Invariants (ARCHITECTURE.md "The store"):
* the root's attributes carry the schema version; another version is refused on open;
* every array's attributes (provenance, fingerprint) are written once, at creation, by
  the lease holder; they are never rewritten, so no two processes ever write them;
* rows are written a whole chunk at a time, and each chunk is recorded as done (a marker
  under ``_repeval/state/<key>/<fingerprint>/chunks/``) only after its write returned;
* an array is complete, and readable, only once a completion record exists for the
  fingerprint in its attributes. Markers are keyed by fingerprint, so a replaced array
  never inherits the old array's progress.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.errors import ContainsGroupError

from pipeline.errors import (
    ArrayNotFoundError, CorruptChunkError, IncompleteArrayError, ReadOnlyStoreError, SchemaVersionError,
    StaleArrayError, StoreError,
)
from storage_schema import keys
from storage_schema.backend import SIDE, Backend, write_errors
from storage_schema.leases import DEFAULT_TTL, Lease
from storage_schema.provenance import now_iso

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SCHEMA_ATTR = "repeval_schema_version"
DEFAULT_STORE = "./repeval-store"


@dataclass(frozen=True)
class ArrayStatus:
    """What the store knows about one array, without reading its data."""

    key: str
    fingerprint: str
    shape: tuple[int, ...]
    dtype: str
    chunk_rows: int
    done_chunks: frozenset[int]
    complete: bool
    attrs: dict[str, Any] = field(repr=False)

    @property
    def n_chunks(self) -> int:
        return max(1, -(-self.shape[0] // self.chunk_rows)) if self.shape[0] else 0

    @property
    def fraction_done(self) -> float:
        return 1.0 if self.complete else len(self.done_chunks) / max(self.n_chunks, 1)

    def first_missing_chunk(self) -> int | None:
        return next((c for c in range(self.n_chunks) if c not in self.done_chunks), None)


class StoredArray:
    """A complete array opened for reading: numpy, dask or row slices."""

    def __init__(self, array: zarr.Array, status: ArrayStatus):
        self.array = array
        self.status = status

    key = property(lambda self: self.status.key)
    fingerprint = property(lambda self: self.status.fingerprint)
    shape = property(lambda self: self.status.shape)
    attrs = property(lambda self: self.status.attrs)

    def read(self, rows: slice | None = None) -> np.ndarray:
        rows = rows if rows is not None else slice(None)
        try:
            return self.array[rows]
        except ValueError as exc:
            if "checksum" not in str(exc):
                raise
            raise self._corruption(rows) from exc

    def _corruption(self, rows: slice) -> CorruptChunkError:
        """Name the chunks of ``rows`` that fail their crc32c."""
        chunk_rows = self.status.chunk_rows
        start, stop, _ = rows.indices(self.shape[0])
        bad = failing_chunks(self.array, chunk_rows, range(start // chunk_rows, -(-stop // chunk_rows)))
        return CorruptChunkError(
            f"{self.key!r}: chunk(s) {bad} fail their crc32c checksum (rows "
            f"{', '.join(f'{c * chunk_rows}-{min((c + 1) * chunk_rows, self.shape[0]) - 1}' for c in bad)}); "
            "the stored bytes were damaged after writing: re-extract the array"
        )

    def to_dask(self, rows_per_block: int | None = None):
        import dask.array as da  # readers only; keeps the write path free of dask

        chunks = (rows_per_block or self.status.chunk_rows,) + tuple(self.shape[1:])
        return da.from_zarr(self.array, chunks=chunks)

    def __repr__(self) -> str:
        return f"StoredArray({self.key!r}, shape={self.shape}, fingerprint={self.fingerprint[:12]})"


def failing_chunks(array: zarr.Array, chunk_rows: int, chunks: range) -> list[int]:
    """The chunks among ``chunks`` whose stored bytes fail their crc32c checksum."""
    bad = []
    for c in chunks:
        try:
            array[c * chunk_rows:(c + 1) * chunk_rows]
        except ValueError as exc:
            if "checksum" not in str(exc):
                raise
            bad.append(c)
    return bad


class FeatureStore:
    """Open (and on first write, create) a repeval store at a path or fsspec URL.

    ``read_only=True`` opens for consumers: every write raises ReadOnlyStoreError.
    """

    def __init__(self, url: str = DEFAULT_STORE, *, read_only: bool = False,
                 storage_options: dict[str, Any] | None = None):
        self.backend = Backend(str(url), storage_options, read_only=read_only)
        self.read_only = read_only
        self.url = self.backend.redacted_url()
        self._zstore = self.backend.zarr_store()
        self.root = self._open_root()

    # -- opening ------------------------------------------------------------------------
    def _open_root(self) -> zarr.Group:
        try:
            with write_errors(self.url, "the store's folder"):  # a writable open creates the folder
                root = zarr.open_group(self._zstore, mode="r" if self.read_only else "r+")
        except FileNotFoundError:
            if self.read_only:
                raise ArrayNotFoundError(f"no repeval store at {self.url!r}") from None
            root = self._create_root()
        version = root.attrs.get(SCHEMA_ATTR)
        if version is None:
            raise SchemaVersionError(
                f"{self.url!r} holds a Zarr hierarchy without {SCHEMA_ATTR!r}: not a repeval store; "
                "choose an empty folder or an existing repeval store"
            )
        if version != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"store {self.url!r} has schema version {version}; this repeval reads version "
                f"{SCHEMA_VERSION}. Use a new store path or a repeval release that reads version {version}."
            )
        return root

    def _create_root(self) -> zarr.Group:
        attrs = {SCHEMA_ATTR: SCHEMA_VERSION, "created": now_iso()}
        try:  # attributes go in with the group so no reader sees a root without a version
            with write_errors(self.url, "the store's root group"):
                return zarr.create_group(self._zstore, attributes=attrs, overwrite=False)
        except ContainsGroupError:  # another process created it first
            return zarr.open_group(self._zstore, mode="r+")

    def check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.url!r} was opened read-only")

    # -- bookkeeping keys --------------------------------------------------------------
    @staticmethod
    def _state(key: str, fingerprint: str) -> str:
        return f"{SIDE}/state/{key}/{fingerprint}"

    def lease(self, key: str, ttl: float = DEFAULT_TTL, heartbeat: float | None = None) -> Lease:
        self.check_writable()
        return Lease(self.backend, key, ttl=ttl, heartbeat=heartbeat)

    # -- status -------------------------------------------------------------------------
    def _open_array(self, key: str) -> zarr.Array | None:
        # zarr_format=3: the store writes only v3 arrays, and probing for v2 metadata costs
        # two more requests per open on an object store
        try:
            node = zarr.open_array(self._zstore, path=key, mode="r", zarr_format=3)
        except (FileNotFoundError, KeyError, zarr.errors.NodeTypeValidationError):
            return None
        return node

    def status(self, key: str) -> ArrayStatus | None:
        arr = self._open_array(key)
        if arr is None:
            return None
        attrs = dict(arr.attrs)
        fp = attrs.get("fingerprint", "")
        state = self._state(key, fp)
        done = frozenset(int(n) for n in self.backend.list(f"{state}/chunks") if n.isdigit())
        complete = self.backend.exists(f"{state}/complete.json")
        return ArrayStatus(key, fp, tuple(arr.shape), str(arr.dtype), int(arr.chunks[0]), done, complete, attrs)

    def open_array(self, key: str, fingerprint: str | None = None) -> StoredArray:
        """Open a complete array; ``fingerprint`` (when given) must match what is stored."""
        st = self.status(key)
        if st is None:
            raise ArrayNotFoundError(f"no array {key!r} in store {self.url!r}; {self._nearby(key)}")
        if fingerprint is not None and st.fingerprint != fingerprint:
            raise StaleArrayError(
                f"{key!r} was made from other weights, preprocessing or data "
                f"(stored fingerprint {st.fingerprint[:12]}, wanted {fingerprint[:12]}); re-extract it"
            )
        if not st.complete:
            raise IncompleteArrayError(
                f"{key!r} is incomplete: {len(st.done_chunks)} of {st.n_chunks} chunks written "
                "(an extraction is running or was interrupted; rerun it to resume)"
            )
        return StoredArray(zarr.open_array(self._zstore, path=key, mode="r", zarr_format=3), st)

    def _nearby(self, key: str) -> str:
        parent = key.rsplit("/", 1)[0]
        names = self.backend.list(parent, dirs_only=True)
        return f"{parent!r} holds: {', '.join(names)}" if names else f"nothing under {parent!r}"

    # -- writing (lease holder only) -----------------------------------------------------
    def create_array(self, lease: Lease, key: str, *, shape: tuple[int, ...], chunk_rows: int,
                     dtype: str, attrs: dict[str, Any]) -> zarr.Array:
        """Create (or replace a stale) array with its provenance; attributes are final."""
        self.check_writable()
        self.backend.check_inside(key)
        lease.check()
        if "fingerprint" not in attrs:
            raise StoreError(f"attributes of {key!r} need a 'fingerprint'")
        old = self.status(key)
        if old is not None:
            same_layout = old.shape == tuple(shape) and old.chunk_rows == chunk_rows
            if old.fingerprint == attrs["fingerprint"] and same_layout:
                raise StoreError(f"{key!r} already exists with this fingerprint; resume it instead")
            log.warning("replacing %s (fingerprint %s -> %s, chunk rows %d -> %d)", key, old.fingerprint[:12],
                        attrs["fingerprint"][:12], old.chunk_rows, chunk_rows)
            self.backend.delete(f"{SIDE}/state/{key}", recursive=True)
        floating = np.dtype(dtype).kind == "f"
        with warnings.catch_warnings(), write_errors(self.url, f"the metadata of {key!r}"):
            warnings.simplefilter("ignore", UserWarning)  # zarr warns about _repeval/ not being a node
            return zarr.create_array(
                self._zstore, name=key, shape=shape, dtype=dtype,
                chunks=(chunk_rows,) + tuple(shape[1:]),
                # crc32c: a flipped byte in a chunk file is detected on read
                compressors=[ZstdCodec(level=1), Crc32cCodec()],
                fill_value=np.nan if floating else 0,
                attributes={**attrs, "created": now_iso()},
                overwrite=True,
            )

    def open_writable(self, key: str) -> zarr.Array:
        """The existing array at ``key`` for the lease holder to resume writing."""
        self.check_writable()
        self.backend.check_inside(key)
        return zarr.open_array(self._zstore, path=key, mode="r+", zarr_format=3)

    def write_chunk(self, lease: Lease, array: zarr.Array, fingerprint: str, chunk: int,
                    rows: np.ndarray) -> None:
        """Write one whole chunk, then record it as done."""
        self.check_writable()
        lease.check()
        chunk_rows = array.chunks[0]
        start = chunk * chunk_rows
        stop = min(start + chunk_rows, array.shape[0])
        if rows.shape[0] != stop - start:
            raise StoreError(
                f"chunk {chunk} of {array.path!r} needs {stop - start} rows, got {rows.shape[0]}"
            )
        with write_errors(self.url, f"chunk {chunk} of {array.path!r}"):
            array[start:stop] = rows
        self.backend.write_atomic(f"{self._state(array.path, fingerprint)}/chunks/{chunk}", b"")

    def mark_complete(self, lease: Lease, key: str, fingerprint: str) -> None:
        self.check_writable()
        lease.check()
        st = self.status(key)
        if st is None or st.fingerprint != fingerprint:
            raise StoreError(f"cannot complete {key!r}: stored fingerprint differs")
        missing = sorted(set(range(st.n_chunks)) - st.done_chunks)
        if missing:
            raise IncompleteArrayError(f"cannot complete {key!r}: chunks {missing[:10]} not written")
        record = {"fingerprint": fingerprint, "completed": now_iso(), "rows": st.shape[0]}
        self.backend.write_atomic(f"{self._state(key, fingerprint)}/complete.json", json.dumps(record).encode())

    # -- labels -------------------------------------------------------------------------
    def write_labels(self, dataset: str, split: str, labels: np.ndarray, attrs: dict[str, Any],
                     lease_ttl: float = DEFAULT_TTL) -> StoredArray:
        """Store a split's labels once; a no-op when the same fingerprint is complete."""
        key = keys.labels_key(dataset, split)
        fp = attrs["fingerprint"]
        st = self.status(key)
        if st is not None and st.complete and st.fingerprint == fp:
            return self.open_array(key)
        self.check_writable()
        with self.lease(key.rsplit("/", 1)[0], ttl=lease_ttl) as lease:
            st = self.status(key)  # another process may have finished while we waited
            if not (st is not None and st.complete and st.fingerprint == fp):
                labels = np.asarray(labels, dtype=np.int64)
                chunk_rows = max(len(labels), 1)
                if st is not None and st.fingerprint == fp and (st.shape, st.chunk_rows) == (labels.shape, chunk_rows):
                    arr = self.open_writable(key)  # a writer died before completing these labels: finish
                else:
                    arr = self.create_array(lease, key, shape=labels.shape, chunk_rows=chunk_rows,
                                            dtype="int64", attrs=attrs)
                self.write_chunk(lease, arr, fp, 0, labels)
                self.mark_complete(lease, key, fp)
        return self.open_array(key)

    def labels(self, dataset: str, split: str) -> StoredArray:
        return self.open_array(keys.labels_key(dataset, split))

    def features(self, model: str, dataset: str, split: str, layer: str,
                 fingerprint: str | None = None) -> StoredArray:
        return self.open_array(keys.feature_key(model, dataset, split, layer), fingerprint)

    # -- listing ------------------------------------------------------------------------
    def iter_feature_keys(self) -> Iterator[str]:
        b = self.backend
        for model in b.list(keys.FEATURES, dirs_only=True):
            for dataset in b.list(f"{keys.FEATURES}/{model}", dirs_only=True):
                for split in b.list(f"{keys.FEATURES}/{model}/{dataset}", dirs_only=True):
                    for layer in b.list(f"{keys.FEATURES}/{model}/{dataset}/{split}", dirs_only=True):
                        if b.exists(f"{keys.FEATURES}/{model}/{dataset}/{split}/{layer}/zarr.json"):
                            yield f"{keys.FEATURES}/{model}/{dataset}/{split}/{layer}"

    def iter_label_keys(self) -> Iterator[str]:
        b = self.backend
        for dataset in b.list(keys.DATASETS, dirs_only=True):
            for split in b.list(f"{keys.DATASETS}/{dataset}", dirs_only=True):
                if b.exists(f"{keys.DATASETS}/{dataset}/{split}/labels/zarr.json"):
                    yield f"{keys.DATASETS}/{dataset}/{split}/labels"

    def damaged_chunks(self, key: str) -> list[int]:
        """Chunks of ``key`` whose stored bytes fail their crc32c checksum (reads every chunk)."""
        st = self.status(key)
        if st is None:
            raise ArrayNotFoundError(f"no array {key!r} in store {self.url!r}; {self._nearby(key)}")
        array = zarr.open_array(self._zstore, path=key, mode="r", zarr_format=3)
        return failing_chunks(array, st.chunk_rows, range(st.n_chunks))

    def list_arrays(self) -> list[ArrayStatus]:
        out = []
        for key in [*self.iter_label_keys(), *self.iter_feature_keys()]:
            st = self.status(key)
            if st is not None:
                out.append(st)
        return out

    def __repr__(self) -> str:
        return f"FeatureStore({self.url!r}, read_only={self.read_only})"
