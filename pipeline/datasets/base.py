"""The dataset adapter interface and helpers shared by the adapters."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from pipeline.datasets.hashing import Hasher
from pipeline.errors import CorruptImageError, DatasetError, unknown_name
from pipeline.names import validate_name

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".ppm", ".tif", ".tiff", ".webp")

METRICS = ("top1", "mean_per_class", "map11", "miou", "angular")
#: Keys of ``describe()`` that are derived, not constructor parameters.
DESCRIBED_ONLY = ("adapter", "version", "name", "class_names", "splits", "feature_dim")
#: Where a dataset without an authors' validation split gets one: a share of train.
TRAIN_FRACTION_VALIDATION = "train_fraction"


class DatasetAdapter(ABC):
    """A labelled dataset with named splits, in a fixed, sorted sample order.

    Subclasses set ``class_names`` and ``splits`` in ``__init__`` and implement ``labels``,
    ``sample_ids``, ``fingerprint`` and ``describe``; image datasets implement
    ``load_image``, precomputed ones set ``has_images = False`` and implement ``features``.
    Instances must stay picklable (DataLoader workers receive them).

    Metadata the rest of the system reads (class attributes, so a config can be checked
    before any file is read):

    ``metric``
        The score the literature reports on this dataset: ``"top1"``,
        ``"mean_per_class"`` (mean of per-class accuracies) or ``"map11"`` (the VOC 2007
        devkit's 11-point mean average precision). An instance built with
        ``mean_per_class=True`` reports ``"mean_per_class"``.
    ``multi_label``
        True when ``labels`` returns an (n, C) array instead of (n,) class indices (see
        ``labels``); protocols that need one class per sample refuse such datasets.
    ``train_split``, ``val_split``, ``test_split``
        The splits the papers fit on, select hyperparameters on and score on.
        ``val_split`` is None where the authors publish no validation split: the probe
        then holds out a stratified, seeded 20 % of train (``validation`` says which).
    ``pooled_split``
        A split holding every sample of the official splits (few-shot episodes draw from
        all of a dataset), or None.
    ``dense_task``
        ``"segmentation"`` or ``"normals"`` for a dataset with per-pixel targets (metric
        ``miou`` or ``angular``; see :mod:`pipeline.datasets.adapters.dense`), else None.

    Parameters
    ----------
    name : str
        The dataset's name in the store (validated: it becomes a key component).
    mean_per_class : bool or None
        Report mean per-class accuracy instead of top-1 (None: the class's ``metric``).
    """

    adapter: ClassVar[str] = ""  # set by @register_dataset
    version: ClassVar[str] = "1"  # bump when the content of a generated dataset changes
    has_images: ClassVar[bool] = True
    has_image_files: ClassVar[bool] = False  # each sample is an image file (``encoded_image``)
    metric: str = "top1"  # class default; an instance may override it (mean_per_class=True)
    multi_label: ClassVar[bool] = False
    train_split: ClassVar[str] = "train"
    val_split: ClassVar[str | None] = None
    test_split: ClassVar[str] = "test"
    pooled_split: ClassVar[str | None] = None
    dense_task: ClassVar[str | None] = None

    def __init__(self, name: str, mean_per_class: bool | None = None) -> None:
        self.name = validate_name(name, "dataset name")
        if mean_per_class is not None and not self.multi_label:
            self.metric = "mean_per_class" if mean_per_class else "top1"
        self.mean_per_class = self.metric == "mean_per_class"
        self.class_names: list[str] = []
        self.splits: tuple[str, ...] = ()

    def check_split(self, split: str) -> str:
        """Return ``split`` if this dataset has it, else raise an error listing the splits.

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            ``split``.
        """
        if split not in self.splits:
            raise unknown_name(f"split of dataset {self.name!r}", split, self.splits)
        return split

    def num_samples(self, split: str) -> int:
        """Number of (usable) samples in ``split``.

        Parameters
        ----------
        split : str

        Returns
        -------
        int
        """
        return len(self.labels(split))

    @abstractmethod
    def labels(self, split: str) -> np.ndarray:
        """Labels in sample order.

        Single-label datasets: class indices, int64 (n,). Multi-label datasets: int64
        (n, C), one column per class: 1 the class is present, 0 absent, -1 present only
        as objects marked "difficult" (ignored for that class when fitting and scoring, as
        the VOC devkit does). ``labels == 1`` is the binary label array and
        ``labels < 0`` the difficult mask.

        Parameters
        ----------
        split : str

        Returns
        -------
        numpy.ndarray
        """

    @abstractmethod
    def sample_ids(self, split: str) -> list[str]:
        """Stable string ids in sample order (relative path or index).

        Parameters
        ----------
        split : str

        Returns
        -------
        list of str
        """

    @abstractmethod
    def fingerprint(self, split: str) -> str:
        """Content hash of the split: data, labels, class names and order.

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            Hexadecimal SHA-256.
        """

    def labels_fingerprint(self, split: str) -> str:
        """The fingerprint stored with the split's labels: what they were made from.

        An image dataset's labels belong to its images, so this is :meth:`fingerprint`.
        A dataset whose rows are one encoder's features overrides it with a hash of the
        labels alone: every encoder's features of the dataset share one labels array, and
        the next encoder's file must not restamp it (that made every earlier record's
        labels look changed).

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            Hexadecimal SHA-256.
        """
        return self.fingerprint(split)

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """JSON-able parameters for provenance.

        Returns
        -------
        dict
            The derived keys plus the constructor parameters, from which
            ``make_dataset`` rebuilds the dataset.
        """

    def load_image(self, split: str, i: int) -> Image.Image:
        """Sample ``i`` of ``split`` as an RGB image.

        Parameters
        ----------
        split : str
        i : int
            Position in the split's sample order.

        Returns
        -------
        PIL.Image.Image
        """
        raise DatasetError(f"Dataset {self.name!r} ({self.adapter}) holds precomputed features, not images")

    def encoded_image(self, split: str, i: int) -> bytes:
        """The encoded file of sample ``i`` (JPEG, PNG... bytes), for decoding elsewhere
        (on a GPU); only where ``has_image_files``.

        Parameters
        ----------
        split : str
        i : int
            Position in the split's sample order.

        Returns
        -------
        bytes
        """
        raise DatasetError(f"Dataset {self.name!r} ({self.adapter}) has no image files to read as bytes")

    def features(self, split: str) -> np.ndarray:
        """Precomputed features (n, d) of ``split``.

        Parameters
        ----------
        split : str

        Returns
        -------
        numpy.ndarray
        """
        raise DatasetError(f"Dataset {self.name!r} ({self.adapter}) holds images, not precomputed features")

    def feature_shape(self, split: str) -> tuple[int, int]:
        """(rows, width) of the precomputed features of ``split``.

        Parameters
        ----------
        split : str

        Returns
        -------
        tuple of (int, int)
        """
        shape = self.features(split).shape
        return int(shape[0]), int(shape[1])

    def feature_dtype(self, split: str) -> np.dtype:
        """The float dtype of the precomputed features of ``split`` (as ``feature_rows`` gives them).

        Parameters
        ----------
        split : str

        Returns
        -------
        numpy.dtype
        """
        return np.dtype(self.features(split).dtype)

    def feature_rows(self, split: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the precomputed features of ``split`` (an adapter that
        reads them from disk reads only those).

        Parameters
        ----------
        split : str
        start, stop : int
            The rows' range.

        Returns
        -------
        numpy.ndarray
        """
        return np.ascontiguousarray(self.features(split)[start:stop])

    def skipped(self, split: str) -> list[str]:
        """Ids of samples dropped because they could not be read.

        Parameters
        ----------
        split : str

        Returns
        -------
        list of str
        """
        self.check_split(split)
        return []

    @property
    def fingerprint_mode(self) -> str:
        """How ``fingerprint`` sees files: ``"content"`` (their bytes), ``"stat"`` (the file
        list with sizes and modification times) or ``"generated"`` (no files)."""
        return "content"

    @property
    def validation(self) -> dict[str, Any]:
        """Where hyperparameters are selected: the authors' split, or a share of train."""
        if self.val_split is not None:
            return {"source": "split", "split": self.val_split}
        return {"source": TRAIN_FRACTION_VALIDATION, "fraction": 0.2, "stratified": not self.multi_label,
                "seeded": True, "drawn_by": "the probe (its val_fraction and seed settings)"}

    def info(self, split: str) -> dict[str, Any]:
        """What ``repeval datasets show`` prints for one split (JSON-able).

        Parameters
        ----------
        split : str

        Returns
        -------
        dict
            ``split``, ``samples``, ``classes`` (classes present in the split),
            ``skipped`` (ids), ``fingerprint`` and ``fingerprint_mode``.
        """
        labels = self.labels(self.check_split(split))
        if self.multi_label:
            present = int(np.count_nonzero((labels == 1).any(axis=0)))
        else:
            present = int(np.unique(labels).size)
        return {"split": split, "samples": int(len(labels)), "classes": present,
                "skipped": list(self.skipped(split)), "fingerprint": self.fingerprint(split),
                "fingerprint_mode": self.fingerprint_mode}

    def _base_description(self) -> dict[str, Any]:
        """The derived keys (``DESCRIBED_ONLY``) plus ``mean_per_class`` where the adapter
        takes it; ``describe`` adds the constructor parameters, so that
        ``make_dataset(adapter, name=..., **params)`` rebuilds the dataset from it."""
        out = {
            "adapter": self.adapter,
            "version": self.version,
            "name": self.name,
            "class_names": list(self.class_names),
            "splits": list(self.splits),
        }
        if "mean_per_class" in inspect.signature(type(self).__init__).parameters:
            out["mean_per_class"] = self.mean_per_class
        return out

    def metadata(self) -> dict[str, Any]:
        """What the rest of the system reads about the dataset, for provenance (JSON-able).

        Returns
        -------
        dict
            ``metric``, ``multi_label``, ``validation``, ``fingerprint_mode`` and the
            train/val/test/pooled split names.
        """
        return {"metric": self.metric, "multi_label": self.multi_label, "validation": self.validation,
                "fingerprint_mode": self.fingerprint_mode, "train_split": self.train_split,
                "val_split": self.val_split, "test_split": self.test_split, "pooled_split": self.pooled_split}

    def __repr__(self) -> str:
        kind = type(self).__name__
        return f"{kind}(name={self.name!r}, splits={self.splits}, classes={len(self.class_names)})"


def validate_splits(splits: list[str] | tuple[str, ...], dataset: str) -> tuple[str, ...]:
    """Split names become store keys: validate each, refuse duplicates and an empty list."""
    if not splits:
        raise DatasetError(f"Dataset {dataset!r} has no splits")
    for split in splits:
        validate_name(split, f"split name of dataset {dataset!r}")
    if len(set(splits)) != len(splits):
        raise DatasetError(f"Dataset {dataset!r} has duplicate split names: {list(splits)}")
    return tuple(splits)


def decode_rgb(source: Any, what: str) -> Image.Image:
    """Decode an image (a path or a binary file object) fully as RGB, or raise
    CorruptImageError naming ``what``."""
    try:
        with Image.open(source) as img:
            img.load()  # decode now: a truncated file fails here, not later in a worker
            return img.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise CorruptImageError(f"Cannot decode {what}: {exc}") from exc


def open_rgb(path: Path) -> Image.Image:
    """Decode an image file fully as RGB, or raise CorruptImageError naming the file."""
    return decode_rgb(path, f"image {str(path)!r}")


class FileBackedDataset(DatasetAdapter):
    """An adapter whose samples live in files: its fingerprint comes from each file's size
    and modification time, or, with ``content_hash``, from the files' bytes."""

    content_hash: bool = False

    @property
    def fingerprint_mode(self) -> str:
        return "content" if self.content_hash else "stat"

    def _file_fingerprint(self, split: str, base: str, files: list[str], stats: np.ndarray,
                          *parts: list[str] | np.ndarray) -> str:
        """Hash of split, class names, ``parts`` (ids, labels ...) and the files' (size, mtime)
        rows or bytes; cached in ``self._fingerprints``. File names are not hashed: where
        they matter a caller passes them among ``parts`` (so a root given one folder up or
        down gives the same fingerprint)."""
        cache = self.__dict__.setdefault("_fingerprints", {})
        if split not in cache:
            h = Hasher(f"{self.adapter}/v{self.version}/{self.fingerprint_mode}").text(split).texts(self.class_names)
            for part in parts:
                h.array(part) if isinstance(part, np.ndarray) else h.texts(list(part))
            if self.content_hash:
                for file in files:
                    h.file(Path(base) / file)
            else:
                h.array(stats)
            cache[split] = h.hexdigest()
        return cache[split]
