"""Precomputed feature arrays: one ``.npz`` file or a folder of ``.npy`` files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.base import DatasetAdapter, validate_splits
from pipeline.datasets.hashing import Hasher
from pipeline.errors import DataValidationError, DatasetError

_FEATURES, _LABELS, _CLASS_NAMES = "_features", "_labels", "class_names"
_MAX_LISTED = 10
_BLOCK_BYTES = 64 << 20  # rows read at a time from a mapped .npy


@register_dataset("features")
class PrecomputedFeaturesDataset(DatasetAdapter):
    """Labelled feature vectors stored by another tool; ``has_images`` is False.

    Parameters
    ----------
    path : str or os.PathLike
        One ``.npz`` file or a folder of ``.npy`` files (see the module docstring).
    name : str, optional
        Dataset name in the store (default: the file's stem or the folder's name).
    mean_per_class : bool
        Report mean per-class accuracy instead of top-1.
    """

    has_images = False

    def __init__(
        self, path: str | os.PathLike[str], name: str | None = None, mean_per_class: bool = False
    ) -> None:
        src = Path(path).expanduser()
        default_name = src.stem if src.suffix == ".npz" else src.resolve().name
        super().__init__(name if name is not None else default_name, mean_per_class)
        self.path = src
        arrays = _read_arrays(src)
        split_names = sorted(k[: -len(_FEATURES)] for k in arrays if k.endswith(_FEATURES))
        expected = {_CLASS_NAMES} | {s + _FEATURES for s in split_names} | {s + _LABELS for s in split_names}
        unknown = sorted(set(arrays) - expected)
        if unknown or not split_names:
            raise DatasetError(
                f"{src.name}: unexpected array(s) {unknown or '(no <split>_features found)'}; expected "
                "'<split>_features', '<split>_labels' and optionally 'class_names'"
            )
        self.splits = validate_splits(split_names, self.name)
        self._features: dict[str, np.ndarray] = {}
        self._labels: dict[str, np.ndarray] = {}
        dims = {}
        for split in self.splits:
            feats, labels = arrays[split + _FEATURES], arrays.get(split + _LABELS)
            if labels is None:
                raise DatasetError(f"{src.name}: {split + _FEATURES!r} has no matching {split + _LABELS!r}")
            self._features[split] = _check_features(feats, f"{src.name}: {split + _FEATURES}",
                                                    values=not isinstance(feats, np.memmap))
            self._labels[split] = _check_labels(labels, len(feats), f"{src.name}: {split + _LABELS}")
            dims[split] = feats.shape[1]
        if len(set(dims.values())) > 1:
            raise DatasetError(f"{src.name}: feature widths differ between splits: {dims}")
        num_classes = max(int(lab.max()) for lab in self._labels.values()) + 1
        if _CLASS_NAMES in arrays:
            names = arrays[_CLASS_NAMES]
            if names.ndim != 1 or names.dtype.kind not in "US":
                raise DatasetError(
                    f"{src.name}: class_names must be a 1-D string array, got {names.dtype} {names.shape}"
                )
            self.class_names = [str(n) for n in names.tolist()]
            if len(self.class_names) < num_classes:
                raise DatasetError(
                    f"{src.name}: labels go up to {num_classes - 1} but only "
                    f"{len(self.class_names)} class_names are given"
                )
        else:
            self.class_names = [str(k) for k in range(num_classes)]
        self._fingerprints: dict[str, str] = {}

    def features(self, split: str) -> np.ndarray:
        """The whole (n, d) array (a memory map for a folder of .npy files: prefer ``feature_rows``).

        Parameters
        ----------
        split : str

        Returns
        -------
        numpy.ndarray
        """
        feats = self._features[self.check_split(split)]
        return feats if feats.dtype.kind == "f" else feats.astype(np.float32)

    def feature_shape(self, split: str) -> tuple[int, int]:
        """(rows, width) of ``split``'s features, without reading them.

        Parameters
        ----------
        split : str

        Returns
        -------
        tuple of (int, int)
        """
        shape = self._features[self.check_split(split)].shape
        return int(shape[0]), int(shape[1])

    def feature_dtype(self, split: str) -> np.dtype:
        """The dtype ``feature_rows`` returns: the stored one, float32 for integers.

        Parameters
        ----------
        split : str

        Returns
        -------
        numpy.dtype
        """
        dtype = self._features[self.check_split(split)].dtype
        return dtype if dtype.kind == "f" else np.dtype(np.float32)

    def feature_rows(self, split: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``split``'s features, copied, in their stored float dtype.

        A memory-mapped file is read through a map of just these rows, closed afterwards,
        so reading a whole split block by block never holds more than one block.

        Parameters
        ----------
        split : str
        start, stop : int
            The rows' range.

        Returns
        -------
        numpy.ndarray
        """
        feats = self._features[self.check_split(split)]
        stop = min(stop, feats.shape[0])
        if isinstance(feats, np.memmap):
            row_bytes = feats.shape[1] * feats.dtype.itemsize
            part = np.memmap(feats.filename, dtype=feats.dtype, mode="r", offset=feats.offset + start * row_bytes,
                             shape=(stop - start, feats.shape[1]))
            rows = np.array(part)
            del part
        else:
            rows = np.array(feats[start:stop])
        return rows if rows.dtype.kind == "f" else rows.astype(np.float32)

    def block_rows(self, split: str) -> int:
        """Rows per block of about 64 MiB.

        Parameters
        ----------
        split : str

        Returns
        -------
        int
        """
        n, d = self.feature_shape(split)
        return max(1, min(n, _BLOCK_BYTES // max(1, d * self.feature_dtype(split).itemsize)))

    def labels(self, split: str) -> np.ndarray:
        return self._labels[self.check_split(split)].copy()

    def sample_ids(self, split: str) -> list[str]:
        return [str(i) for i in range(self.num_samples(split))]

    def fingerprint(self, split: str) -> str:
        self.check_split(split)
        if split not in self._fingerprints:
            h = Hasher(f"{self.adapter}/v{self.version}").text(split).texts(self.class_names)
            feats, step, what = self._features[split], self.block_rows(split), f"{self.path.name}: {split + _FEATURES}"
            if isinstance(feats, np.memmap):  # block by block, each block's values checked on the way
                blocks = (_check_features(self.feature_rows(split, i, i + step), what, row_offset=i)
                          for i in range(0, feats.shape[0], step))
                h.array_blocks(feats.dtype if feats.dtype.kind == "f" else np.dtype(np.float32), feats.shape, blocks)
            else:
                h.array(self.features(split))
            self._fingerprints[split] = h.array(self._labels[split]).hexdigest()
        return self._fingerprints[split]

    def labels_fingerprint(self, split: str) -> str:
        """The labels, class names and split alone: the features are one encoder's.

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            Hexadecimal SHA-256.
        """
        self.check_split(split)
        return Hasher(f"{self.adapter}/v{self.version}/labels").text(split).texts(self.class_names).array(
            self._labels[split]).hexdigest()

    def describe(self) -> dict[str, Any]:
        dim = next(iter(self._features.values())).shape[1]
        return {**self._base_description(), "path": str(self.path), "feature_dim": int(dim)}


def _read_arrays(src: Path) -> dict[str, np.ndarray]:
    try:
        if src.is_file() and src.suffix == ".npz":
            with np.load(src, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
        if src.is_dir():
            files = sorted(p for p in src.iterdir() if p.suffix == ".npy" and not p.name.startswith("."))
            if not files:
                raise DatasetError(f"Feature folder {str(src)!r} holds no .npy files")
            # features stay on disk (memory maps); labels and class names are small
            return {p.stem: np.load(p, allow_pickle=False, mmap_mode="r" if p.stem.endswith(_FEATURES) else None)
                    for p in files}
    except (OSError, ValueError) as exc:
        why = str(exc)
        if "Python objects" in why:  # what a memory map says of an object array
            why = "an array holds Python objects, which only pickle could load; pickle is never used"
        raise DatasetError(f"Cannot read precomputed features from {str(src)!r}: {why}") from exc
    raise DatasetError(
        f"Precomputed features path {str(src)!r} is neither an .npz file nor a folder of .npy files"
    )


def _check_features(feats: np.ndarray, what: str, values: bool = True, row_offset: int = 0) -> np.ndarray:
    """Shape and dtype of ``feats``; with ``values``, that every value is finite (rows
    numbered from ``row_offset`` in the error)."""
    if feats.ndim != 2 or feats.shape[0] == 0 or feats.shape[1] == 0:
        raise DatasetError(f"{what} must be a non-empty 2-D array (n, d), got shape {feats.shape}")
    if feats.dtype.kind not in "fiu":
        raise DatasetError(f"{what} must be numeric, got dtype {feats.dtype}")
    if feats.dtype.kind != "f" and values:
        feats = feats.astype(np.float32)
    if not values:
        return feats
    bad = ~np.isfinite(feats)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1)) + row_offset
        shown = ", ".join(str(r) for r in rows[:_MAX_LISTED]) + (", ..." if len(rows) > _MAX_LISTED else "")
        raise DataValidationError(
            f"{what} contains {int(np.isnan(feats).sum())} NaN and {int(np.isinf(feats).sum())} Inf values "
            f"in {len(rows)} row(s): {shown}"
        )
    return feats


def _check_labels(labels: np.ndarray, n: int, what: str) -> np.ndarray:
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DatasetError(f"{what} must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if len(labels) != n:
        raise DatasetError(f"{what} has {len(labels)} labels for {n} feature rows")
    if labels.min() < 0:
        raise DatasetError(f"{what} has negative labels (min {int(labels.min())})")
    return labels.astype(np.int64)
