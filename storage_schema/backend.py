"""Where the bytes live: a local folder or any fsspec URL.

The Zarr hierarchy is opened through zarr's own stores (LocalStore for paths, FsspecStore
for URLs). repeval's bookkeeping (chunk-done markers, completion records, leases, the
results ledger) lives beside it under ``_repeval/`` and goes through this small
key-value layer, whose two primitives carry the concurrency design:

* ``write_atomic``: readers see the old bytes or the new bytes, never a torn file;
* ``create_exclusive``: exactly one of several racing creators succeeds.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import fsspec
import zarr
from zarr.abc.store import Store

SIDE = "_repeval"  # bookkeeping prefix inside the store root; never a zarr node


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


class Backend:
    """Byte-level access to a store root, local or remote."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, read_only: bool = False):
        self.url = str(url)
        self.storage_options = dict(storage_options or {})
        self.read_only = read_only
        self.local = _is_local(self.url)
        if self.local:
            self.root = str(Path(self.url.removeprefix("file://")).expanduser().resolve())
            self.fs = fsspec.filesystem("file")
        else:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self.root = self.root.rstrip("/")

    # -- zarr -------------------------------------------------------------------------
    def zarr_store(self) -> Store:
        if self.local:
            return zarr.storage.LocalStore(self.root, read_only=self.read_only)
        return zarr.storage.FsspecStore.from_url(
            self.url, storage_options=self.storage_options or None, read_only=self.read_only
        )

    def redacted_url(self) -> str:
        """The URL without credentials, safe for provenance, logs and reports."""
        if "://" in self.url and "@" in self.url.split("://", 1)[1].split("/", 1)[0]:
            scheme, rest = self.url.split("://", 1)
            return f"{scheme}://{rest.split('@', 1)[1]}"
        return self.url if not self.local else self.root

    # -- key/value ----------------------------------------------------------------------
    def path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def exists(self, key: str) -> bool:
        return self.fs.exists(self.path(key))

    def read(self, key: str) -> bytes | None:
        try:
            with self.fs.open(self.path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def write_atomic(self, key: str, data: bytes) -> None:
        path = self.path(key)
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.partial"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:  # an object-store PUT is atomic
            self.fs.pipe_file(path, data)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists; True when this call created it."""
        path = self.path(key)
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.partial"
            with open(tmp, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, path)  # atomic and fails if the target exists, also on NFS
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        try:  # s3fs and others implement mode "xb" as a conditional create
            with self.fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False

    def list(self, prefix: str, dirs_only: bool = False) -> list[str]:
        """Names directly under ``prefix`` (files and folders), sorted; [] if absent."""
        try:
            entries = self.fs.ls(self.path(prefix), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(
            e["name"].rstrip("/").rsplit("/", 1)[-1]
            for e in entries
            if not dirs_only or e["type"] == "directory"
        )

    def delete(self, key: str, recursive: bool = False) -> None:
        try:
            self.fs.rm(self.path(key), recursive=recursive)
        except FileNotFoundError:
            pass
