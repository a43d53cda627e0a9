"""Tar shards in the webdataset layout CLIP_benchmark publishes its suites in."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from PIL import Image

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.base import FileBackedDataset, decode_rgb, validate_splits
from pipeline.datasets.layout import read_lines, require_file
from pipeline.datasets.listing import stat_files
from pipeline.errors import CorruptImageError, DatasetError

IMAGE_KEYS = ("webp", "png", "jpg", "jpeg")  # CLIP_benchmark's preference order
_BLOCK = 512


def split_member_name(name: str) -> tuple[str, str]:
    """webdataset's convention: the key is the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def index_shard(path: Path) -> dict[str, dict[str, tuple[int, int]]]:
    """key -> {extension: (data offset, size)} of one tar shard, headers only."""
    # A member whose data runs past the end of the file, or a shard that does not end with
    # the tar end-of-archive block (a cut or damaged header), is refused, naming the shard.
    size_on_disk = path.stat().st_size
    members: dict[str, dict[str, tuple[int, int]]] = {}
    try:
        with tarfile.open(path, mode="r:") as tar:
            end = 0  # where the next header starts: after the last member's padded data
            for info in tar:
                end = info.offset_data + -(-info.size // _BLOCK) * _BLOCK
                if not info.isfile():
                    continue
                if info.offset_data + info.size > size_on_disk:
                    raise DatasetError(f"webdataset: member {info.name!r} of {str(path)!r} is truncated: it needs "
                                       f"{info.offset_data + info.size} bytes, the shard has {size_on_disk}")
                key, ext = split_member_name(info.name)
                members.setdefault(key, {})[ext] = (info.offset_data, info.size)
    except tarfile.TarError as exc:
        raise DatasetError(f"webdataset: {str(path)!r} is not a readable tar file: {exc}") from None
    with open(path, "rb") as fh:
        fh.seek(end)
        block = fh.read(_BLOCK)
    if len(block) < _BLOCK or block.count(0) != _BLOCK:
        raise DatasetError(f"webdataset: {str(path)!r} is truncated or damaged after byte {end} (no tar "
                           "end-of-archive block follows the last readable member)")
    return members


@register_dataset("webdataset")
class WebDatasetShards(FileBackedDataset):
    """Labelled images in webdataset tar shards (CLIP_benchmark layout), read in place.

    ``splits`` defaults to every sub-folder of ``root`` holding ``nshards.txt``. Ids are
    the sample keys, which must be unique within a split. A ``root/dataset_type.txt`` other
    than ``classification`` (multilabel, retrieval) is refused.

    Parameters
    ----------
    root : str or os.PathLike
        The folder holding ``classnames.txt`` and the split folders.
    name : str, optional
        Dataset name in the store (default: the root folder's name).
    splits : list or tuple of str, optional
        Split folders to read (default: all found).
    mean_per_class : bool
        Report mean per-class accuracy instead of top-1.
    content_hash : bool
        Fingerprint the shards' bytes instead of their sizes and modification times.
    """

    def __init__(self, root: str | os.PathLike[str], name: str | None = None,
                 splits: list[str] | tuple[str, ...] | None = None, mean_per_class: bool = False,
                 content_hash: bool = False) -> None:
        root_path = Path(root).expanduser()
        super().__init__(name if name is not None else root_path.resolve().name, mean_per_class)
        if not root_path.is_dir():
            raise DatasetError(f"webdataset: root folder {str(root_path)!r} does not exist")
        self.root = root_path
        self.content_hash = bool(content_hash)
        kind_file = root_path / "dataset_type.txt"
        if kind_file.is_file():
            kind = kind_file.read_text(encoding="utf-8", errors="replace").strip().lower()
            if kind not in ("", "classification"):
                raise DatasetError(f"webdataset: {str(kind_file)!r} says {kind!r}; only single-label "
                                   "classification shards (.cls labels) are read")
        self.class_names = read_lines(root_path / "classnames.txt", "webdataset")
        if splits is None:
            splits = sorted(e.name for e in os.scandir(root_path)
                            if e.is_dir() and (Path(e.path) / "nshards.txt").is_file())
            if not splits:
                raise DatasetError(f"webdataset: no split folder with nshards.txt under {str(root_path)!r} "
                                   f"(expected e.g. {str(root_path / 'test' / 'nshards.txt')!r})")
        self.splits = validate_splits(list(splits), self.name)
        self._shards: dict[str, list[str]] = {}
        self._index: dict[str, np.ndarray] = {}  # (n, 3) int64: shard, offset, size
        self._ids: dict[str, list[str]] = {}
        self._labels: dict[str, np.ndarray] = {}
        self._stats: dict[str, np.ndarray] = {}
        self._handles: dict[str, BinaryIO] = {}
        for split in self.splits:
            self._read_split(split)

    def _read_split(self, split: str) -> None:
        count_file = require_file(self.root / split / "nshards.txt", "webdataset")
        text = count_file.read_text(encoding="utf-8", errors="replace").strip()
        if not text.isdigit() or int(text) < 1:
            raise DatasetError(f"webdataset: {str(count_file)!r} must hold the shard count (>= 1), got {text!r}")
        shards = [f"{split}/{k}.tar" for k in range(int(text))]
        for shard in shards:
            require_file(self.root / shard, "webdataset")
        rows: dict[str, tuple[int, int, int, int]] = {}
        for s, shard in enumerate(shards):
            path = self.root / shard
            members = index_shard(path)
            with open(path, "rb") as fh:
                for key, parts in members.items():
                    image = next((ext for ext in IMAGE_KEYS if ext in parts), None)
                    if image is None or "cls" not in parts:
                        lacking = "an image (.webp/.png/.jpg/.jpeg)" if image is None else "a .cls label"
                        raise DatasetError(f"webdataset: sample {key!r} of {str(path)!r} has no {lacking}")
                    if key in rows:
                        raise DatasetError(f"webdataset: sample key {key!r} appears in {str(path)!r} and in "
                                           f"{str(self.root / shards[rows[key][0]])!r}")
                    label = self._label(fh, parts["cls"], f"member {key}.cls of {str(path)!r}")
                    rows[key] = (s, *parts[image], label)
        if not rows:
            raise DatasetError(f"webdataset: split {split!r} ({str(self.root / split)!r}) holds no samples")
        ids = sorted(rows)
        table = np.array([rows[k] for k in ids], dtype=np.int64)
        self._shards[split], self._ids[split] = shards, ids
        self._index[split], self._labels[split] = table[:, :3], table[:, 3].copy()
        self._stats[split] = stat_files(str(self.root), shards)[0]

    def _label(self, fh: BinaryIO, where: tuple[int, int], what: str) -> int:
        fh.seek(where[0])
        text = fh.read(where[1]).decode("utf-8", errors="replace").strip()
        if not text.lstrip("-").isdigit() or not 0 <= int(text) < len(self.class_names):
            raise DatasetError(f"webdataset: {what}: unknown class index {text!r} (classnames.txt names "
                               f"{len(self.class_names)} classes)")
        return int(text)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = {}  # open files stay in their process
        return state

    def labels(self, split: str) -> np.ndarray:
        return self._labels[self.check_split(split)].copy()

    def sample_ids(self, split: str) -> list[str]:
        return list(self._ids[self.check_split(split)])

    def load_image(self, split: str, i: int) -> Image.Image:
        index = self._index[self.check_split(split)]
        if not 0 <= i < len(index):
            raise IndexError(f"Sample {i} out of range for split {split!r} of {self.name!r} ({len(index)} samples)")
        shard, offset, size = (int(v) for v in index[i])
        name = self._shards[split][shard]
        if name not in self._handles:
            self._handles[name] = open(self.root / name, "rb")  # noqa: SIM115 (kept open for random access)
        fh = self._handles[name]
        fh.seek(offset)
        data = fh.read(size)
        where = f"sample {self._ids[split][i]!r} of {str(self.root / name)!r}"
        if len(data) != size:
            raise CorruptImageError(f"Cannot decode {where}: the shard ends after {len(data)} of {size} bytes")
        return decode_rgb(io.BytesIO(data), where)

    def fingerprint(self, split: str) -> str:
        """Class names, keys, labels and the shards' sizes and times (``content_hash``: bytes).

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            Hexadecimal SHA-256.
        """
        self.check_split(split)
        return self._file_fingerprint(split, str(self.root), self._shards[split], self._stats[split],
                                      self._shards[split], self._ids[split], self._labels[split])

    def describe(self) -> dict[str, Any]:
        return {**self._base_description(), "root": str(self.root), "content_hash": self.content_hash}
