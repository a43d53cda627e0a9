"""scikit-learn's 8x8 handwritten digits (bundled with sklearn, no download)."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image
from pipeline.datasets.registry import register_dataset
from pipeline.datasets.base import DatasetAdapter
from pipeline.datasets.hashing import Hasher
from pipeline.errors import ConfigError


@register_dataset("digits")
class DigitsDataset(DatasetAdapter):
    """1,797 8x8 grey digits (values 0..16 scaled to 0..255) as RGB images, classes "0".."9".

    Fixed stratified split: ``test_size=0.25`` with ``random_state=seed`` (default 0) gives
    1,347 train and 450 test images. Samples are in ascending original index; ids are that
    index.

    Parameters
    ----------
    name : str, optional
        Dataset name in the store (default ``digits``).
    test_size : float
        Share of the images in ``test``, in (0, 1).
    seed : int
        Seed of the stratified split.
    mean_per_class : bool
        Report mean per-class accuracy instead of top-1.
    """

    def __init__(
        self, name: str | None = None, test_size: float = 0.25, seed: int = 0, mean_per_class: bool = False
    ) -> None:
        from sklearn.datasets import load_digits  # heavy: imported when a digits dataset is built
        from sklearn.model_selection import train_test_split

        super().__init__(name if name is not None else "digits", mean_per_class)
        if not 0.0 < float(test_size) < 1.0:
            raise ConfigError(f"digits test_size must be in (0, 1), got {test_size!r}")
        self.test_size = float(test_size)
        self.seed = int(seed)
        bunch = load_digits()
        self._images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
        targets = bunch.target.astype(np.int64)
        self._targets = targets
        self.class_names = [str(k) for k in range(10)]
        self.splits = ("train", "test")
        train_idx, test_idx = train_test_split(
            np.arange(len(targets)), test_size=self.test_size, stratify=targets, random_state=self.seed
        )
        self._index = {"train": np.sort(train_idx), "test": np.sort(test_idx)}

    def labels(self, split: str) -> np.ndarray:
        return self._targets[self._index[self.check_split(split)]]

    def sample_ids(self, split: str) -> list[str]:
        return [str(i) for i in self._index[self.check_split(split)]]

    def load_image(self, split: str, i: int) -> Image.Image:
        grey = self._images[self._index[self.check_split(split)][i]]
        return Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2))

    def fingerprint(self, split: str) -> str:
        idx = self._index[self.check_split(split)]
        h = Hasher(f"{self.adapter}/v{self.version}").text(split).texts(self.class_names)
        return h.array(idx).array(self._images[idx]).array(self._targets[idx]).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {**self._base_description(), "test_size": self.test_size, "seed": self.seed}
