"""The feature store: a Zarr v3 hierarchy plus repeval's bookkeeping beside it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import zarr
from zarr.errors import ContainsGroupError

from pipeline.errors import (
    ArrayNotFoundError, IncompleteArrayError, ReadOnlyStoreError, SchemaVersionError, StaleArrayError,
)
from storage_schema import keys
from storage_schema.arrays import ArrayStatus, StoredArray, damaged_chunks
from storage_schema.backend import Backend, credential_errors, write_errors
from storage_schema.leases import DEFAULT_TTL, Lease
from storage_schema.provenance import now_iso
from storage_schema.writing import ArraySpec, ArrayWriter, Produce, WriteResult

SCHEMA_VERSION = 1
SCHEMA_ATTR = "repeval_schema_version"
DEFAULT_STORE = "./repeval-store"


class FeatureStore:
    """Open (and on first write, create) a repeval store at a path or fsspec URL.

    Parameters
    ----------
    url : str
        A local folder or an fsspec URL (``s3://bucket/prefix``).
    read_only : bool
        Open for consumers: every write raises ReadOnlyStoreError, and a missing store is
        an error instead of being created.
    storage_options : dict, optional
        Passed to fsspec (credentials, endpoint).
    """

    def __init__(self, url: str = DEFAULT_STORE, *, read_only: bool = False,
                 storage_options: dict[str, Any] | None = None):
        self.backend = Backend(str(url), storage_options, read_only=read_only)
        self.read_only = read_only
        self.url = self.backend.redacted_url()
        self._zstore = self.backend.zarr_store()
        with credential_errors(self.url):  # the first read of an object store: a worker without its keys
            self.root = self._open_root()
        self._writer = ArrayWriter(self.backend, self._zstore, self._stored_status)

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
        """Raise ReadOnlyStoreError when the store was opened read-only."""
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.url!r} was opened read-only")

    def lease(self, key: str, ttl: float = DEFAULT_TTL, heartbeat: float | None = None) -> Lease:
        """The write lease of ``key`` (not yet acquired; use it as a context manager).

        Parameters
        ----------
        key : str
            The leased group (:func:`storage_schema.keys.features_group_key`).
        ttl : float
            Seconds without a heartbeat after which the lease may be taken over.
        heartbeat : float, optional
            Seconds between heartbeats; a quarter of ``ttl`` by default.

        Returns
        -------
        Lease
            The lease object.
        """
        self.check_writable()
        return Lease(self.backend, key, ttl=ttl, heartbeat=heartbeat)

    # -- status -------------------------------------------------------------------------
    def _open_zarr(self, key: str) -> zarr.Array | None:
        # zarr_format=3: the store writes only v3 arrays, and probing for v2 metadata costs
        # two more requests per open on an object store
        try:
            return zarr.open_array(self._zstore, path=key, mode="r", zarr_format=3)
        except (FileNotFoundError, KeyError, zarr.errors.NodeTypeValidationError):
            return None

    def _stored_status(self, key: str) -> ArrayStatus | None:
        """Status of the array stored at ``key`` itself (aliases not followed)."""
        arr = self._open_zarr(key)
        if arr is None:
            return None
        attrs = dict(arr.attrs)
        fp = attrs.get("fingerprint", "")
        done = frozenset(int(n) for n in self.backend.list(keys.chunk_markers_key(key, fp)) if n.isdigit())
        complete = self.backend.exists(keys.completion_key(key, fp))
        return ArrayStatus(key, fp, tuple(arr.shape), str(arr.dtype), int(arr.chunks[0]), done, complete, attrs)

    def _alias_status(self, key: str) -> ArrayStatus | None:
        """Status of the alias ``key``; None if there is none, or its target changed since."""
        try:
            if keys.feature_key(*keys.parse_feature_key(key)) != key:
                return None
        except ValueError:  # only valid feature keys are ever aliased
            return None
        raw = self.backend.read(keys.alias_key(key))
        if raw is None:
            return None
        record = json.loads(raw)
        target = self._stored_status(record["target"])
        if target is None or target.fingerprint != record["fingerprint"]:
            return None  # the target was replaced: the alias serves nothing any more
        attrs = {**target.attrs, **record.get("attrs", {}), "alias_of": target.key}
        return dataclasses.replace(target, key=key, attrs=attrs, alias_of=target.key)

    def status(self, key: str) -> ArrayStatus | None:
        """What the store knows about the array at ``key``, without reading its data.

        Parameters
        ----------
        key : str
            A feature or labels key; an alias is resolved to the array holding its rows.

        Returns
        -------
        ArrayStatus or None
            None when no array (nor alias) is at ``key``.
        """
        return self._stored_status(key) or self._alias_status(key)

    def open_array(self, key: str, fingerprint: str | None = None) -> StoredArray:
        """Open a complete array for reading.

        Parameters
        ----------
        key : str
            A feature or labels key (or an alias).
        fingerprint : str, optional
            When given, the stored fingerprint must equal it.

        Returns
        -------
        StoredArray
            The array.

        Raises
        ------
        ArrayNotFoundError
            No array at ``key``; the message lists what is nearby.
        StaleArrayError
            The array was made from other weights, preprocessing or data.
        IncompleteArrayError
            Not every chunk is written yet.
        """
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
        array = zarr.open_array(self._zstore, path=st.storage_key, mode="r", zarr_format=3)
        return StoredArray(array, st, self.backend.read)

    def _nearby(self, key: str) -> str:
        parent = keys.group_of(key)
        names = self.backend.list(parent, dirs_only=True)
        return f"{parent!r} holds: {', '.join(names)}" if names else f"nothing under {parent!r}"

    def labels(self, dataset: str, split: str) -> StoredArray:
        """The labels of a split.

        Parameters
        ----------
        dataset, split : str
            The dataset and split names.

        Returns
        -------
        StoredArray
            The complete labels array.
        """
        return self.open_array(keys.labels_key(dataset, split))

    def features(self, model: str, dataset: str, split: str, layer: str,
                 fingerprint: str | None = None) -> StoredArray:
        """The features of one layer of one encoder on one split.

        Parameters
        ----------
        model, dataset, split, layer : str
            The names in the feature key.
        fingerprint : str, optional
            When given, the stored fingerprint must equal it.

        Returns
        -------
        StoredArray
            The complete feature array.
        """
        return self.open_array(keys.feature_key(model, dataset, split, layer), fingerprint)

    def find_complete(self, fingerprint: str) -> ArrayStatus | None:
        """A complete stored array holding ``fingerprint``, under whatever key.

        Parameters
        ----------
        fingerprint : str
            An array fingerprint.

        Returns
        -------
        ArrayStatus or None
            The array, or None when no complete array holds it.
        """
        raw = self.backend.read(keys.fingerprint_index_key(fingerprint))
        if raw is None:
            return None
        st = self._stored_status(json.loads(raw)["key"])
        return st if st is not None and st.complete and st.fingerprint == fingerprint else None

    # -- writing (lease holder only) -----------------------------------------------------
    def write_arrays(self, lease: Lease, arrays: Sequence[ArraySpec], produce: Produce, *,
                     chunks: Mapping[str, Iterable[int]] | None = None, complete: bool = True) -> WriteResult:
        """Write arrays chunk by chunk; the store's only way of writing rows.

        Parameters
        ----------
        lease : Lease
            The held lease of the arrays' group.
        arrays : sequence of ArraySpec
            The arrays (an array of the same fingerprint and layout is resumed).
        produce : callable
            Given the chunks each array needs (by key), yields ``(chunk, {key: rows})``.
        chunks : mapping, optional
            The chunks to write per key instead of the missing ones (a repair).
        complete : bool
            Write the completion records at the end.

        Returns
        -------
        WriteResult
            The chunks each array needed and whether a write resumed.
        """
        self.check_writable()
        return self._writer.write_arrays(lease, arrays, produce, chunks=chunks, complete=complete)

    def write_alias(self, lease: Lease, key: str, target: ArrayStatus, attrs: Mapping[str, Any]) -> None:
        """Serve the complete array ``target`` under ``key`` as well, with ``key``'s own provenance.

        Parameters
        ----------
        lease : Lease
            The held lease of ``key``'s group.
        key : str
            The feature key readers will ask for.
        target : ArrayStatus
            A complete stored array with the fingerprint ``key`` would have.
        attrs : mapping
            ``key``'s provenance where it differs from the target's.
        """
        self.check_writable()
        self._writer.write_alias(lease, key, target, attrs)

    def write_labels(self, dataset: str, split: str, labels: np.ndarray, attrs: dict[str, Any],
                     lease_ttl: float = DEFAULT_TTL) -> StoredArray:
        """Store a split's labels once; a no-op when the same fingerprint is complete.

        Parameters
        ----------
        dataset, split : str
            The dataset and split names.
        labels : numpy.ndarray
            One integer label per sample.
        attrs : dict
            Provenance; must hold ``fingerprint`` (the dataset's).
        lease_ttl : float
            TTL of the labels' lease, in seconds.

        Returns
        -------
        StoredArray
            The complete labels array.
        """
        key = keys.labels_key(dataset, split)
        fp = attrs["fingerprint"]
        st = self.status(key)
        if st is not None and st.complete and st.fingerprint == fp:
            return self.open_array(key)
        self.check_writable()
        labels = np.asarray(labels, dtype=np.int64)
        spec = ArraySpec(key, labels.shape, max(len(labels), 1), "int64", attrs)
        with self.lease(keys.labels_group_key(dataset, split), ttl=lease_ttl) as lease:
            st = self.status(key)  # another process may have finished while we waited
            if not (st is not None and st.complete and st.fingerprint == fp):
                self.write_arrays(lease, [spec], lambda todo: [(0, {key: labels})])
        return self.open_array(key)

    # -- listing ------------------------------------------------------------------------
    def iter_feature_keys(self) -> Iterator[str]:
        """Every feature key of the store, stored or aliased, in name order.

        Returns
        -------
        iterator of str
            The keys.
        """
        found = set(self._walk_features(aliases=False)) | set(self._walk_features(aliases=True))
        yield from sorted(found, key=lambda k: k.split("/"))

    def _walk_features(self, aliases: bool) -> Iterator[str]:
        b = self.backend

        def folder(*names: str) -> str:
            prefix = keys.features_prefix(*names)
            return keys.aliases_dir(prefix) if aliases else prefix

        for model in b.list(folder(), dirs_only=True):
            for dataset in b.list(folder(model), dirs_only=True):
                for split in b.list(folder(model, dataset), dirs_only=True):
                    if aliases:
                        for name in b.list(folder(model, dataset, split)):
                            if name.endswith(".json"):
                                yield keys.features_prefix(model, dataset, split, name.removesuffix(".json"))
                        continue
                    for layer in b.list(folder(model, dataset, split), dirs_only=True):
                        key = keys.features_prefix(model, dataset, split, layer)
                        if b.exists(keys.node_metadata_key(key)):
                            yield key

    def iter_label_keys(self) -> Iterator[str]:
        """Every labels key of the store, and every dense split's targets after its labels.

        Returns
        -------
        iterator of str
            The keys, in name order.
        """
        b = self.backend
        for dataset in b.list(keys.datasets_prefix(), dirs_only=True):
            for split in b.list(keys.datasets_prefix(dataset), dirs_only=True):
                targets = sorted(n for n in b.list(keys.datasets_prefix(dataset, split), dirs_only=True)
                                 if n.startswith(f"{keys.TARGETS}-"))
                for name in (keys.LABELS, *targets):
                    key = keys.datasets_prefix(dataset, split, name)
                    if b.exists(keys.node_metadata_key(key)):
                        yield key

    def list_arrays(self) -> list[ArrayStatus]:
        """The status of every array: labels first, then features (aliases included).

        Returns
        -------
        list of ArrayStatus
            One per array key.
        """
        out = []
        for key in [*self.iter_label_keys(), *self.iter_feature_keys()]:
            st = self.status(key)
            if st is not None:
                out.append(st)
        return out

    def damaged_chunks(self, key: str) -> list[int]:
        """Chunks of ``key`` whose stored bytes fail their crc32c checksum (reads every chunk).

        Parameters
        ----------
        key : str
            An array key (an alias is checked through its target).

        Returns
        -------
        list of int
            The damaged chunks, in order.
        """
        st = self.status(key)
        if st is None:
            raise ArrayNotFoundError(f"no array {key!r} in store {self.url!r}; {self._nearby(key)}")
        array = zarr.open_array(self._zstore, path=st.storage_key, mode="r", zarr_format=3)
        return damaged_chunks(array, range(st.n_chunks), self.backend.read)

    def __repr__(self) -> str:
        return f"FeatureStore({self.url!r}, read_only={self.read_only})"
