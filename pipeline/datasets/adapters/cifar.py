"""CIFAR-10 and CIFAR-100 from the "python version" archives (pickled batches)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.base import FileBackedDataset, validate_splits
from pipeline.datasets.layout import locate, require_file
from pipeline.datasets.listing import stat_files
from pipeline.errors import DatasetError

# What numpy arrays need to be rebuilt from a pickle, in numpy 1 and numpy 2 spellings, and
# the codec call protocol-2 pickles written by Python 3 use for bytes (string -> bytes only).
_ARRAY_GLOBALS = {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray")
                  for n in ("_reconstruct", "scalar")} | {("numpy", "ndarray"), ("numpy", "dtype"),
                                                          ("_codecs", "encode")}
_SIDE = 32


class _ArraysOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ARRAY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load the global {module}.{name} (only numpy arrays are allowed)")


def load_batch(path: Path, what: str) -> dict[str, Any]:
    """One pickled CIFAR batch or meta file as a dict with str keys."""
    # Only numpy arrays are rebuilt: a file asking the unpickler for any other code is refused.
    require_file(path, what)
    try:
        with open(path, "rb") as fh:
            data = _ArraysOnlyUnpickler(fh, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise DatasetError(f"{what}: cannot read {str(path)!r} as a CIFAR batch: {exc}") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{what}: {str(path)!r} holds a {type(data).__name__}, not a CIFAR batch dict")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in data.items()}


class _CifarDataset(FileBackedDataset):
    """Shared reader; subclasses name the folder, files and keys."""

    folder: ClassVar[str]
    meta_file: ClassVar[str]
    names_key: ClassVar[str]
    label_key: ClassVar[str]
    batch_files: ClassVar[dict[str, tuple[str, ...]]]
    pooled_split = "all"

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, content_hash: bool = False) -> None:
        super().__init__(name if name is not None else self.adapter)
        root_path = Path(root).expanduser()
        if not root_path.is_dir():
            raise DatasetError(f"{self.adapter}: root folder {str(root_path)!r} does not exist")
        self.root = root_path
        self.content_hash = bool(content_hash)
        base = locate(root_path, self.meta_file, [".", self.folder], self.adapter)
        self._base = str(base)
        meta = load_batch(base / self.meta_file, self.adapter)
        if self.names_key not in meta:
            raise DatasetError(f"{self.adapter}: {str(base / self.meta_file)!r} has no {self.names_key!r}")
        self.class_names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta[self.names_key]]
        self.splits = validate_splits(list(self.batch_files) + [self.pooled_split], self.name)
        self._labels: dict[str, np.ndarray] = {}
        self._stats: dict[str, np.ndarray] = {}
        self._pixels: dict[str, np.ndarray] = {}
        for split, files in self.batch_files.items():
            labels, pixels = zip(*(self._read_batch(base / f) for f in files))
            self._labels[split] = np.concatenate(labels)
            self._pixels[split] = np.concatenate(pixels)
            self._stats[split] = stat_files(self._base, files)[0]
        parts = list(self.batch_files)
        self._labels[self.pooled_split] = np.concatenate([self._labels[s] for s in parts])
        self._stats[self.pooled_split] = np.concatenate([self._stats[s] for s in parts])

    def _read_batch(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        batch = load_batch(path, self.adapter)
        if "data" not in batch or self.label_key not in batch:
            raise DatasetError(f"{self.adapter}: {str(path)!r} lacks 'data' or {self.label_key!r}")
        data = np.asarray(batch["data"])
        labels = np.asarray(batch[self.label_key], dtype=np.int64).ravel()
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * _SIDE * _SIDE:
            raise DatasetError(f"{self.adapter}: {str(path)!r} 'data' must be uint8 (n, 3072), got "
                               f"{data.dtype} {data.shape}")
        if len(labels) != len(data):
            raise DatasetError(f"{self.adapter}: {str(path)!r} has {len(data)} images but {len(labels)} labels")
        bad = np.flatnonzero((labels < 0) | (labels >= len(self.class_names)))
        if bad.size:
            raise DatasetError(f"{self.adapter}: {str(path)!r} image {bad[0]} has the unknown class index "
                               f"{labels[bad[0]]}; {len(self.class_names)} classes")
        return labels, data.reshape(-1, 3, _SIDE, _SIDE).transpose(0, 2, 3, 1)

    def _split_pixels(self, split: str) -> np.ndarray:
        if split not in self._pixels:  # a DataLoader worker: read again, once per process
            base = Path(self._base)
            self._pixels[split] = np.concatenate([self._read_batch(base / f)[1] for f in self.batch_files[split]])
        return self._pixels[split]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pixels"] = {}  # workers reread the batches instead of receiving 150 MB each
        return state

    def labels(self, split: str) -> np.ndarray:
        return self._labels[self.check_split(split)].copy()

    def sample_ids(self, split: str) -> list[str]:
        self.check_split(split)
        if split == self.pooled_split:
            return [f"{s}/{i:05d}" for s in self.batch_files for i in range(len(self._labels[s]))]
        return [f"{i:05d}" for i in range(len(self._labels[split]))]

    def load_image(self, split: str, i: int) -> Image.Image:
        n = len(self._labels[self.check_split(split)])
        if not 0 <= i < n:
            raise IndexError(f"Sample {i} out of range for split {split!r} of {self.name!r} ({n} samples)")
        if split == self.pooled_split:
            for part in self.batch_files:
                if i < len(self._labels[part]):
                    return Image.fromarray(self._split_pixels(part)[i])
                i -= len(self._labels[part])
        return Image.fromarray(self._split_pixels(split)[i])

    def fingerprint(self, split: str) -> str:
        """Class names, labels and the batch files' sizes and times (``content_hash``: bytes).

        Parameters
        ----------
        split : str
            The split.

        Returns
        -------
        str
        """
        self.check_split(split)
        parts = self.batch_files if split == self.pooled_split else [split]
        files = [f for s in parts for f in self.batch_files[s]]
        return self._file_fingerprint(split, self._base, files, self._stats[split], files, self._labels[split])

    def describe(self) -> dict[str, Any]:
        return {**self._base_description(), "root": str(self.root), "content_hash": self.content_hash}


@register_dataset("cifar10")
class Cifar10Dataset(_CifarDataset):
    """CIFAR-10: ``root/cifar-10-batches-py/`` (or that folder itself) with ``batches.meta``
    (``label_names``), ``data_batch_1`` .. ``data_batch_5`` (train, 50,000) and
    ``test_batch`` (test, 10,000). Ids are the index within the split."""

    folder = "cifar-10-batches-py"
    meta_file = "batches.meta"
    names_key = "label_names"
    label_key = "labels"
    batch_files = {"train": tuple(f"data_batch_{k}" for k in range(1, 6)), "test": ("test_batch",)}


@register_dataset("cifar100")
class Cifar100Dataset(_CifarDataset):
    """CIFAR-100 with its 100 fine labels: ``root/cifar-100-python/`` (or that folder
    itself) with ``meta`` (``fine_label_names``), ``train`` (50,000) and ``test`` (10,000)."""

    folder = "cifar-100-python"
    meta_file = "meta"
    names_key = "fine_label_names"
    label_key = "fine_labels"
    batch_files = {"train": ("train",), "test": ("test",)}
