"""Where the bytes live: a local folder or any fsspec URL."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import zarr
from zarr.abc.store import Store

from pipeline.errors import ReadOnlyStoreError, StoreError, StoreFullError

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # disk, quota, file size limit (RLIMIT_FSIZE)


@contextlib.contextmanager
def write_errors(url: str, what: str) -> Iterator[None]:
    """Turn a full or read-only file system into an error naming the store and the write."""
    try:
        yield
    except (ReadOnlyStoreError, StoreFullError):
        raise
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise ReadOnlyStoreError(
                f"store {url!r} is on a read-only file system (writing {what}); open it with "
                "read_only=True to read it, or choose a writable store"
            ) from exc
        if exc.errno in _FULL:
            raise StoreFullError(
                f"store {url!r}: {exc.strerror} while writing {what}. A chunk counts as done only "
                "after its write, so nothing partial is used: free space (or raise the limit) and "
                "rerun to resume"
            ) from exc
        raise


_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError")  # botocore's (s3fs), by name: no import


@contextlib.contextmanager
def credential_errors(url: str) -> Iterator[None]:
    """Turn an object store's "no credentials" into a StoreError naming the host and process."""
    # A Dask or Prefect worker started without the store's credentials otherwise fails with
    # botocore's ``Unable to locate credentials``, which says neither where nor what to set.
    try:
        yield
    except Exception as exc:  # noqa: BLE001  re-raised unless it is the credentials error
        cause: BaseException | None = exc
        while cause is not None and type(cause).__name__ not in _NO_CREDENTIALS:
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        import socket

        raise StoreError(
            f"no credentials for the object store {url!r} on host {socket.gethostname()} (process {os.getpid()}): "
            f"{type(cause).__name__}: {str(cause)[:200]}; every process that opens the store needs them in its "
            "environment (this one may be a Dask or Prefect worker): AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE") from None


def redact_url(url: str) -> str:
    """``url`` without the user info (``user:password@``) of its authority."""
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    authority, sep, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}://{authority.rsplit('@', 1)[1]}{sep}{path}"


def url_has_password(url: str) -> bool:
    """Whether ``url`` carries a password (``scheme://user:password@...``)."""
    if "://" not in url:
        return False
    authority = url.split("://", 1)[1].partition("/")[0]
    return "@" in authority and ":" in authority.rsplit("@", 1)[0]


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def local_root(url: str | None) -> str | None:
    """The resolved folder of a local store's URL: the anchor of what a store records about
    local files (a path kept relative to it names the same file when the store, its configs
    and its data are moved or mounted elsewhere together)."""
    if not url or not _is_local(str(url)):
        return None
    return str(Path(str(url).removeprefix("file://")).expanduser().resolve())


def store_base(store: Any) -> str | None:
    """:func:`local_root` of an open store."""
    backend = store.backend
    return backend.root if backend.local else None


def portable_path(path: str, base: str | None) -> str:
    """A local file's path as a store records it."""
    real = str(Path(path).expanduser().resolve())
    return os.path.relpath(real, base) if base else real


def portable_paths(value: Any, base: str | None) -> Any:
    """Plain values (``pipeline.plain.to_plain``) with every absolute path made portable."""
    if isinstance(value, str) and base and os.path.isabs(value):
        return portable_path(value, base)
    if isinstance(value, list):
        return [portable_paths(v, base) for v in value]
    if isinstance(value, dict):
        return {k: portable_paths(v, base) for k, v in value.items()}
    return value


def local_path(path: str, base: str | None) -> str:
    """The inverse of :func:`portable_path`: a recorded path as a path here."""
    return os.path.normpath(os.path.join(base, path)) if base and not os.path.isabs(path) else path


class Backend:
    """Byte-level access to a store root, local or remote.

    Keys are ``/``-separated paths relative to the root (built by
    :mod:`storage_schema.keys`).

    Parameters
    ----------
    url : str
        A local folder or an fsspec URL.
    storage_options : dict, optional
        Passed to fsspec.
    read_only : bool
        Refuse every write with ReadOnlyStoreError.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, read_only: bool = False):
        self.url = str(url)
        self.storage_options = dict(storage_options or {})
        self.read_only = read_only
        self.local = _is_local(self.url)
        if self.local:
            self.root = str(Path(self.url.removeprefix("file://")).expanduser().resolve())
            self.fs = fsspec.filesystem("file")
        else:
            # Other processes write leases, markers and ledger records all the time: a cached
            # directory listing would hide them (s3fs then even answers exists() from it).
            self.storage_options.setdefault("use_listings_cache", False)
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self.root = self.root.rstrip("/")

    # -- zarr -------------------------------------------------------------------------
    def zarr_store(self) -> Store:
        """The root as a Zarr store (LocalStore for folders, FsspecStore for URLs).

        Returns
        -------
        zarr.abc.store.Store
            The store, read-only when the backend is.
        """
        if self.local:
            return zarr.storage.LocalStore(self.root, read_only=self.read_only)
        return zarr.storage.FsspecStore.from_url(
            self.url, storage_options=self.storage_options or None, read_only=self.read_only
        )

    def redacted_url(self) -> str:
        """The URL without credentials, safe for provenance, logs and reports.

        Returns
        -------
        str
            The folder (local) or the redacted URL.
        """
        return redact_url(self.url) if not self.local else self.root

    # -- key/value ----------------------------------------------------------------------
    def path(self, key: str) -> str:
        """The file system path of ``key``.

        Parameters
        ----------
        key : str
            A store key.

        Returns
        -------
        str
            The root joined with ``key``.
        """
        return f"{self.root}/{key}"

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (a file or a folder).

        Parameters
        ----------
        key : str
            A store key.

        Returns
        -------
        bool
            True when it exists.
        """
        return self.fs.exists(self.path(key))

    def read(self, key: str) -> bytes | None:
        """The bytes of ``key`` in one read (a snapshot, even while another process rewrites it).

        Parameters
        ----------
        key : str
            A store key.

        Returns
        -------
        bytes or None
            The content, or None when there is no such file.
        """
        try:
            if not self.local:
                # One GET: a snapshot even while another process rewrites the object (a lease
                # heartbeat). A file object would HEAD first and then fail its ETag-pinned read.
                return self.fs.cat_file(self.path(key))
            with self.fs.open(self.path(key), "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def check_writable(self, key: str) -> None:
        """Refuse a write of ``key`` on a read-only handle, or outside the root.

        Every write primitive calls it, whoever calls them.

        Parameters
        ----------
        key : str
            The key about to be written.
        """
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.redacted_url()!r} was opened read-only (writing {key!r})")
        self.check_inside(key)

    def check_inside(self, key: str) -> None:
        """Refuse ``key`` when it resolves outside a local root (through a planted symlink).

        Names are validated already; this covers links made by someone with access to the
        folder.

        Parameters
        ----------
        key : str
            The key about to be written.
        """
        if self.local:
            real = os.path.realpath(self.path(key))
            if real != self.root and not real.startswith(self.root + os.sep):
                raise StoreError(f"{key!r} resolves to {real!r}, outside store {self.root!r} "
                                 "(a symbolic link in the store); refusing to write there")

    def write_atomic(self, key: str, data: bytes) -> None:
        """Write ``data`` to ``key``: readers see the old bytes or the new, never a torn file.

        Parameters
        ----------
        key : str
            A store key.
        data : bytes
            The new content.
        """
        self.check_writable(key)
        with write_errors(self.redacted_url(), key):
            self._write_atomic(key, data)

    def _write_atomic(self, key: str, data: bytes) -> None:
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
        """Create ``key`` with ``data`` unless it exists: of racing creators exactly one wins.

        Parameters
        ----------
        key : str
            A store key.
        data : bytes
            The content.

        Returns
        -------
        bool
            True when this call created it.
        """
        self.check_writable(key)
        with write_errors(self.redacted_url(), key):
            return self._create_exclusive(key, data)

    def _create_exclusive(self, key: str, data: bytes) -> bool:
        path = self.path(key)
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.partial"
            try:
                with open(tmp, "wb") as f:  # a failed write (full disk) leaves no stray file
                    f.write(data)
                os.link(tmp, path)  # atomic and fails if the target exists, also on NFS
                return True
            except FileExistsError:
                return False
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        try:  # s3fs and others implement mode "xb" as a conditional create
            with self.fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False

    def list(self, prefix: str, dirs_only: bool = False) -> list[str]:
        """Names directly under ``prefix`` (files and folders).

        Parameters
        ----------
        prefix : str
            A folder key.
        dirs_only : bool
            List folders only.

        Returns
        -------
        list of str
            The names (not keys), sorted; empty when ``prefix`` does not exist.
        """
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
        """Remove ``key``; nothing happens when it does not exist.

        Parameters
        ----------
        key : str
            A store key.
        recursive : bool
            Remove a folder and everything under it.
        """
        self.check_writable(key)
        try:
            self.fs.rm(self.path(key), recursive=recursive)
        except FileNotFoundError:
            pass
