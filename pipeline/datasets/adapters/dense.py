"""Datasets with per-pixel ground truth (semantic segmentation, surface normals): the shared
part of their adapters."""

from __future__ import annotations

import inspect
import os
from abc import abstractmethod
from pathlib import Path
from typing import ClassVar

import numpy as np
from PIL import Image

from pipeline.datasets.layout import is_image_name, require_dir
from pipeline.datasets.listing import Listing, PublishedDataset, stat_files
from pipeline.errors import DatasetError

__all__ = ["DENSE_TASKS", "IGNORE_INDEX", "DenseDataset", "read_png"]

#: What a dense dataset's targets are.
DENSE_TASKS = ("segmentation", "normals")
#: The class index of pixels no segmentation metric counts.
IGNORE_INDEX = 255
_SHOWN = 3


def read_png(path: str, what: str) -> Image.Image:
    """A target image, fully decoded; a missing or undecodable file, or one whose real format
    is not the one its extension names (a TIFF named ``.png``), is a DatasetError naming it."""
    expected = _FORMATS.get(os.path.splitext(path)[1].lower())
    try:
        with Image.open(path) as img:
            real = img.format
            if expected is None or real == expected:
                img.load()
                return img.copy()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetError(f"{what}: cannot read the target {path!r}: {exc}") from None
    # a TIFF of int32 named .png: other values, another dtype than the format promises
    raise DatasetError(f"{what}: the target {path!r} is a {real} file, not the {expected} its name says; "
                       "save it in its own format")


# the format a target's extension promises (Pillow's name for it)
_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF", ".bmp": "BMP"}


class DenseDataset(PublishedDataset):
    """A published dataset whose samples have a per-pixel target beside their image.

    Subclasses set ``dense_task`` and implement ``_read`` (returning the official splits as
    ``Listing``s whose labels are zeros, after filling ``self._target_files`` with the
    target files of every sample id, per split) and ``_decode_target`` (one sample's
    files to its target array).

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

    pooled_split = None
    ignore_index: ClassVar[int] = IGNORE_INDEX

    def __init_subclass__(cls, **kwargs) -> None:
        # load_target calls every adapter's decoder one way: a subclass whose decoder takes
        # other parameters fails here, when it is defined, not on its first run's first image
        super().__init_subclass__(**kwargs)
        own, expected = inspect.signature(cls._decode_target), inspect.signature(DenseDataset._decode_target)
        if list(own.parameters) != list(expected.parameters):
            raise TypeError(f"{cls.__name__}._decode_target{own} must take the parameters "
                            f"{tuple(expected.parameters)}, as DenseDataset.load_target calls it")

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, skip_bad: bool = False,
                 content_hash: bool = False) -> None:
        self._target_files: dict[str, dict[str, tuple[str, ...]]] = {}
        super().__init__(root, name, skip_bad, content_hash)
        self._targets: dict[str, list[tuple[str, ...]]] = {}
        self._target_stats: dict[str, np.ndarray] = {}
        for split in self.splits:
            by_id = self._target_files[split]
            self._targets[split] = [by_id[i] for i in self._ids[split]]
            flat = [f for files in self._targets[split] for f in files]
            stats, missing = stat_files(self._root_dir, flat)
            if missing:
                shown = ", ".join(repr(os.path.join(self._root_dir, flat[i])) for i in missing[:_SHOWN])
                raise DatasetError(f"Dataset {self.name!r}: {len(missing)} target file(s) of split {split!r} are "
                                   f"missing: {shown}" + (f" (and {len(missing) - _SHOWN} more)"
                                                          if len(missing) > _SHOWN else ""))
            self._target_stats[split] = stats

    @staticmethod
    def listing(ids: list[str], files: list[str], source: str) -> Listing:
        """The split's listing: its ids and image files, one 0 label per image.

        Parameters
        ----------
        ids, files : list of str
            Sample ids and their image files.
        source : str
            What listed them, for messages.

        Returns
        -------
        Listing
        """
        return Listing(ids, files, np.zeros(len(ids), dtype=np.int64), source)

    def target_files(self, split: str, i: int) -> tuple[str, ...]:
        """The files sample ``i``'s target is read from (relative to the root).

        Parameters
        ----------
        split : str
        i : int

        Returns
        -------
        tuple of str
        """
        files = self._targets[self.check_split(split)]
        if not 0 <= i < len(files):
            raise IndexError(f"Sample {i} out of range for split {split!r} of {self.name!r} ({len(files)} samples)")
        return files[i]

    def load_target(self, split: str, i: int) -> np.ndarray:
        """Sample ``i``'s target at its image's size (see the module doc for its form).

        Parameters
        ----------
        split : str
        i : int

        Returns
        -------
        numpy.ndarray
            (H, W) uint8 for segmentation, (H, W, 3) float32 for normals.
        """
        paths = [self._path(f) for f in self.target_files(split, i)]
        target = self._decode_target(paths)
        width, height = self._image_size(split, i)
        if target.shape[:2] != (height, width):
            raise DatasetError(f"{self.adapter}: target {paths[0]!r} is {target.shape[1]} x {target.shape[0]} "
                               f"pixels but its image is {width} x {height}; they must match")
        return target

    def _image_size(self, split: str, i: int) -> tuple[int, int]:
        with Image.open(self._path(self._files[split][i])) as img:
            return img.size

    @abstractmethod
    def _decode_target(self, paths: list[str]) -> np.ndarray:
        """One sample's target from its files (absolute paths)."""

    def fingerprint(self, split: str) -> str:
        """Hash of ids, skipped ids and, per image and target file, its size and modification
        time (``content_hash``: its bytes); cached.

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            Hexadecimal SHA-256.
        """
        self.check_split(split)
        targets = [f for files in self._targets[split] for f in files]
        stats = np.concatenate([self._stats[split], self._target_stats[split]])
        return self._file_fingerprint(split, self._root_dir, self._files[split] + targets, stats,
                                      self._ids[split], self._labels[split], self._skipped[split], targets)

    def info(self, split: str) -> dict:
        """What ``repeval datasets show`` prints for one split (JSON-able).

        Parameters
        ----------
        split : str

        Returns
        -------
        dict
            As for every adapter, with ``classes`` the dataset's classes and ``task``.
        """
        out = super().info(split)
        out.update(classes=len(self.class_names), task=self.dense_task)
        return out

    @property
    def validation(self) -> dict:
        """Where hyperparameters are selected: the ``segmentation`` protocol holds out a
        seeded share of the train images (its ``val_fraction``); ``normals`` selects nothing."""
        if self.val_split is not None:
            return {"source": "split", "split": self.val_split}
        if self.dense_task == "segmentation":
            return {"source": "train_fraction", "fraction": 0.1, "stratified": False, "seeded": True,
                    "drawn_by": "the segmentation protocol (its val_fraction and seed settings)"}
        return {"source": "none", "why": "the normals protocol trains with one learning rate"}

    def metadata(self) -> dict:
        """The adapter's metadata (see ``DatasetAdapter.metadata``) with ``dense_task`` and
        ``ignore_index``.

        Returns
        -------
        dict
        """
        return {**super().metadata(), "dense_task": self.dense_task, "ignore_index": self.ignore_index}


def class_map(values: np.ndarray, n_classes: int, path: str, what: str) -> np.ndarray:
    """A segmentation target's values as uint8 class indices, refusing values beyond the classes."""
    bad = ((values >= n_classes) | (values < 0)) & (values != IGNORE_INDEX)
    if bad.any():  # every value checked before the cast: -150 would wrap to class 105
        found = values[bad]
        shown = int(found.min()) if found.min() < 0 else int(found.max())
        raise DatasetError(f"{what}: {path!r} holds label {shown}; labels are 0 to "
                           f"{n_classes - 1} and {IGNORE_INDEX} (ignored)")
    return values.astype(np.uint8)


def image_ids(folder: Path, what: str) -> dict[str, str]:
    """Image file stem -> file name of every image in ``folder``."""
    require_dir(folder, what)
    return {os.path.splitext(e.name)[0]: e.name for e in os.scandir(folder) if e.is_file() and is_image_name(e.name)}
