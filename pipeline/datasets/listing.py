"""Image files listed per split: the shared core of every file-based adapter."""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from pipeline.datasets.base import FileBackedDataset, open_rgb, validate_splits
from pipeline.errors import ConfigError, CorruptImageError, DatasetError

_SHOWN = 3  # missing files named in one error line


@dataclass
class Listing:
    """One split as its split file lists it.

    ``files`` are paths relative to the adapter's root (or absolute); ``labels`` is (n,)
    class indices or (n, C) multi-label rows; ``source`` names what listed the samples
    (a split file) for error messages.

    Parameters
    ----------
    ids : list of str
        Sample ids, in sample order.
    files : list of str
        The image file of each sample.
    labels : numpy.ndarray
        Class indices (n,) or multi-label rows (n, C).
    source : str
        What listed the samples, for messages.
    """

    ids: list[str]
    files: list[str]
    labels: np.ndarray
    source: str

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.files = [f[2:] if f.startswith("./") else f for f in self.files]
        if not len(self.ids) == len(self.files) == len(self.labels):
            raise DatasetError(f"{self.source}: {len(self.ids)} ids, {len(self.files)} files and "
                               f"{len(self.labels)} labels do not match")


class ListedImageDataset(FileBackedDataset):
    """Images on disk listed per split; labels from the publisher's files.

    Each sample is one image file (``has_image_files``): extraction may read its bytes and
    decode them on the GPU (``extract.decode: device``).

    Subclasses parse their layout into one ``Listing`` per split and call
    ``_init_listings``. Samples are sorted by id. A file that is listed but absent is an
    error naming it (or, with ``skip_bad``, a skipped sample); ``skip_bad`` also decodes
    every image once and skips the undecodable ones.
    """

    has_image_files = True

    def _init_listings(self, root: Path, listings: dict[str, Listing], *, skip_bad: bool, content_hash: bool,
                       pooled: str | None = None) -> None:
        self.root = root
        self.skip_bad = bool(skip_bad)
        self.content_hash = bool(content_hash)
        self._root_dir = str(root)
        self._ids: dict[str, list[str]] = {}
        self._files: dict[str, list[str]] = {}
        self._labels: dict[str, np.ndarray] = {}
        self._stats: dict[str, np.ndarray] = {}
        self._skipped: dict[str, list[str]] = {}
        names = list(listings) + ([pooled] if pooled else [])
        self.splits = validate_splits(names, self.name)
        for split, listing in listings.items():
            self._add_split(split, listing)
        if pooled:
            self._pool(pooled, list(listings))

    def _add_split(self, split: str, listing: Listing) -> None:
        order = sorted(range(len(listing.ids)), key=listing.ids.__getitem__)
        ids = [listing.ids[i] for i in order]
        files = [listing.files[i] for i in order]
        labels = listing.labels[order]
        for a, b in zip(ids, ids[1:]):
            if a == b:
                raise DatasetError(f"{listing.source}: sample {a!r} is listed twice")
        stats, missing = stat_files(self._root_dir, files)
        bad: list[int] = list(missing)
        if missing and not self.skip_bad:
            shown = ", ".join(repr(os.path.join(self._root_dir, files[i])) for i in missing[:_SHOWN])
            more = f" (and {len(missing) - _SHOWN} more)" if len(missing) > _SHOWN else ""
            raise DatasetError(f"Dataset {self.name!r}: {len(missing)} image(s) listed in {listing.source} "
                               f"are missing or unreadable: {shown}{more}")
        if self.skip_bad:  # one full decode up front, so extraction never meets a bad file
            gone = set(missing)
            bad += [i for i in range(len(files)) if i not in gone and not _readable(self._path(files[i]))]
        if bad:
            keep = np.ones(len(ids), dtype=bool)
            keep[bad] = False
            self._skipped[split] = sorted(ids[i] for i in bad)
            ids = [x for x, k in zip(ids, keep) if k]
            files = [x for x, k in zip(files, keep) if k]
            labels, stats = labels[keep], stats[keep]
        else:
            self._skipped[split] = []
        if not ids:
            raise DatasetError(f"Dataset {self.name!r}: split {split!r} ({listing.source}) has no usable images")
        self._ids[split], self._files[split], self._labels[split], self._stats[split] = ids, files, labels, stats

    def _pool(self, pooled: str, parts: list[str]) -> None:
        """The pooled split: every official split's samples, ids prefixed by their split."""
        self._ids[pooled] = [f"{s}/{i}" for s in parts for i in self._ids[s]]
        self._files[pooled] = [f for s in parts for f in self._files[s]]
        self._labels[pooled] = np.concatenate([self._labels[s] for s in parts])
        self._stats[pooled] = np.concatenate([self._stats[s] for s in parts])
        self._skipped[pooled] = [f"{s}/{i}" for s in parts for i in self._skipped[s]]

    def _path(self, file: str) -> str:
        return os.path.join(self._root_dir, file)

    # -- the adapter interface -------------------------------------------------------------
    def labels(self, split: str) -> np.ndarray:
        return self._labels[self.check_split(split)].copy()

    def sample_ids(self, split: str) -> list[str]:
        return list(self._ids[self.check_split(split)])

    def skipped(self, split: str) -> list[str]:
        return list(self._skipped[self.check_split(split)])

    def load_image(self, split: str, i: int) -> Image.Image:
        files = self._files[self.check_split(split)]
        if not 0 <= i < len(files):
            raise IndexError(f"Sample {i} out of range for split {split!r} of {self.name!r} ({len(files)} samples)")
        return open_rgb(Path(self._path(files[i])))

    def encoded_image(self, split: str, i: int) -> bytes:
        files = self._files[self.check_split(split)]
        if not 0 <= i < len(files):
            raise IndexError(f"Sample {i} out of range for split {split!r} of {self.name!r} ({len(files)} samples)")
        try:
            with open(self._path(files[i]), "rb") as f:
                return f.read()
        except OSError as exc:
            raise CorruptImageError(f"Cannot read image {self._path(files[i])!r}: {exc}") from exc

    def fingerprint(self, split: str) -> str:
        """Hash of class names, ids, labels, skipped ids and, per file, its size and
        modification time (``content_hash``: its bytes instead); cached.

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            Hexadecimal SHA-256.
        """
        self.check_split(split)
        return self._file_fingerprint(split, self._root_dir, self._files[split], self._stats[split],
                                      self._ids[split], self._labels[split], self._skipped[split])

    def _listing_description(self) -> dict[str, Any]:
        return {**self._base_description(), "skip_bad": self.skip_bad, "content_hash": self.content_hash}

    def describe(self) -> dict[str, Any]:
        return {**self._listing_description(), "root": str(self.root)}


def stat_files(root: str, files: Iterable[str]) -> tuple[np.ndarray, list[int]]:
    """(n, 2) int64 [size, mtime_ns] per file (zeros where missing) and the missing indices."""
    files = list(files)
    stats = np.zeros((len(files), 2), dtype=np.int64)
    missing = []
    join, stat = os.path.join, os.stat
    for i, file in enumerate(files):
        try:
            st = stat(join(root, file))
        except (OSError, ValueError):  # absent, not a folder on the way, unreadable, a NUL in the name
            missing.append(i)
            continue
        stats[i, 0], stats[i, 1] = st.st_size, st.st_mtime_ns
    return stats, missing


def _readable(path: str) -> bool:
    try:
        open_rgb(Path(path))
    except CorruptImageError:
        return False
    return True


class PublishedDataset(ListedImageDataset):
    """A dataset in its publisher's layout under ``root``, with the publisher's splits.

    Subclasses implement ``_read(root)``: set ``class_names`` and return one ``Listing``
    per official split. Subclass-specific parameters are set before calling this
    ``__init__``. The pooled split (``pooled_split``, "all") joins the official ones.

    Parameters
    ----------
    root : str or os.PathLike
        The folder holding the publisher's files.
    name : str, optional
        Dataset name in the store (default: the adapter's name).
    skip_bad : bool
        Leave out missing or undecodable images (named in ``skipped``) instead of failing.
    content_hash : bool
        Fingerprint the files' bytes instead of their sizes and modification times.
    """

    pooled_split = "all"

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, skip_bad: bool = False,
                 content_hash: bool = False) -> None:
        super().__init__(name if name is not None else self.adapter)
        root_path = Path(root).expanduser()
        if not root_path.is_dir():
            raise DatasetError(f"{self.adapter}: root folder {str(root_path)!r} does not exist")
        listings = self._read(root_path)
        pooled = self.pooled_split if self.pooled_split not in listings else None
        self._init_listings(root_path, listings, skip_bad=skip_bad, content_hash=content_hash, pooled=pooled)

    @abstractmethod
    def _read(self, root: Path) -> dict[str, Listing]:
        """Parse the layout under ``root``: set ``class_names``, return the official splits."""


class PartitionedDataset(PublishedDataset):
    """A published dataset whose authors give ten alternative splits (partitions 1..10)."""

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, partition: int = 1,
                 skip_bad: bool = False, content_hash: bool = False) -> None:
        if isinstance(partition, bool) or not isinstance(partition, int) or not 1 <= partition <= 10:
            raise ConfigError(f"{self.adapter} partition must be an integer from 1 to 10, got {partition!r}")
        self.partition = partition
        super().__init__(root, name, skip_bad, content_hash)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "partition": self.partition}
