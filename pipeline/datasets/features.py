"""Precomputed feature arrays: one ``.npz`` file or a folder of ``.npy`` files.

Convention (both forms): ``<split>_features`` (n, d) and ``<split>_labels`` (n,) integer
class indices per split, plus optional ``class_names`` (1-D string array; default
``"0".."K-1"``). In a folder each array is ``<name>.npy``. Nothing is loaded with pickle.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.datasets._registry import register_dataset
from pipeline.datasets.base import DatasetAdapter, validate_splits
from pipeline.datasets.hashing import Hasher
from pipeline.errors import DataValidationError, DatasetError

_FEATURES, _LABELS, _CLASS_NAMES = "_features", "_labels", "class_names"
_MAX_LISTED = 10


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
            self._features[split] = _check_features(feats, f"{src.name}: {split + _FEATURES}")
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
        return self._features[self.check_split(split)]

    def labels(self, split: str) -> np.ndarray:
        return self._labels[self.check_split(split)].copy()

    def sample_ids(self, split: str) -> list[str]:
        return [str(i) for i in range(self.num_samples(split))]

    def fingerprint(self, split: str) -> str:
        self.check_split(split)
        if split not in self._fingerprints:
            h = Hasher(f"{self.adapter}/v{self.version}").text(split).texts(self.class_names)
            self._fingerprints[split] = h.array(self._features[split]).array(self._labels[split]).hexdigest()
        return self._fingerprints[split]

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
            return {p.stem: np.load(p, allow_pickle=False) for p in files}
    except (OSError, ValueError) as exc:
        raise DatasetError(f"Cannot read precomputed features from {str(src)!r}: {exc}") from exc
    raise DatasetError(
        f"Precomputed features path {str(src)!r} is neither an .npz file nor a folder of .npy files"
    )


def _check_features(feats: np.ndarray, what: str) -> np.ndarray:
    if feats.ndim != 2 or feats.shape[0] == 0 or feats.shape[1] == 0:
        raise DatasetError(f"{what} must be a non-empty 2-D array (n, d), got shape {feats.shape}")
    if feats.dtype.kind not in "fiu":
        raise DatasetError(f"{what} must be numeric, got dtype {feats.dtype}")
    if feats.dtype.kind != "f":
        feats = feats.astype(np.float32)
    bad = ~np.isfinite(feats)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
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
