"""A synthetic 4-class texture task: scattered disks, rings, bars or crosses."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.base import DatasetAdapter, validate_splits
from pipeline.datasets.hashing import Hasher
from pipeline.errors import ConfigError

SIZE = 32
CLASS_NAMES = ("disk", "ring", "bar", "cross")
_HALF_WIDTH = 0.8  # of bar and cross strokes, px
_RING_WIDTH = 1.3  # px
_YY, _XX = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)


def render_texture(label: int, rng: np.random.Generator) -> np.ndarray:
    """One image of class ``label`` as float32 (32, 32) in [0, 1].

    Parameters
    ----------
    label : int
        Class index (disk, ring, bar, cross).
    rng : numpy.random.Generator
        Draws the elements and the noise.

    Returns
    -------
    numpy.ndarray
    """
    k = int(rng.integers(5, 10))
    half = rng.uniform(2.0, 4.0, k).astype(np.float32)[:, None, None]
    cx, cy = (rng.uniform(0.0, SIZE - 1.0, (2, k)).astype(np.float32)[:, :, None, None])
    theta = rng.uniform(0.0, np.pi, k).astype(np.float32)[:, None, None]
    contrast = rng.uniform(0.2, 0.6, k).astype(np.float32)[:, None, None]
    background = np.float32(rng.uniform(0.3, 0.5))
    dx, dy = _XX - cx, _YY - cy
    u = dx * np.cos(theta) + dy * np.sin(theta)  # element-aligned coordinates
    v = -dx * np.sin(theta) + dy * np.cos(theta)
    name = CLASS_NAMES[label]
    if name == "disk":
        mask = u * u + v * v <= half * half
    elif name == "ring":
        d = np.sqrt(u * u + v * v)
        mask = (d <= half) & (d >= half - _RING_WIDTH)
    elif name == "bar":
        mask = (np.abs(u) <= half) & (np.abs(v) <= _HALF_WIDTH)
    else:
        along_u = (np.abs(u) <= half) & (np.abs(v) <= _HALF_WIDTH)
        along_v = (np.abs(v) <= half) & (np.abs(u) <= _HALF_WIDTH)
        mask = along_u | along_v
    # Overlapping elements take the brighter one, so contrast stays within its range.
    img = background + (mask * contrast).max(axis=0)
    img += rng.normal(0.0, 0.05, (SIZE, SIZE)).astype(np.float32)
    return np.clip(img, 0.0, 1.0)


@register_dataset("textures")
class TexturesDataset(DatasetAdapter):
    """Synthetic textures; ``n_per_class`` maps split to images per class (default train 200, test 100).

    Samples are class-major (all disks, then rings, ...); ids are the index in the split.
    The fingerprint hashes the generator parameters and version, not the pixels.

    Parameters
    ----------
    name : str, optional
        Dataset name in the store (default ``textures``).
    n_per_class : mapping, optional
        Split -> images per class (default ``{"train": 200, "test": 100}``).
    seed : int
        Seed of the drawing.
    mean_per_class : bool
        Report mean per-class accuracy instead of top-1.
    """

    version = "1"

    def __init__(
        self,
        name: str | None = None,
        n_per_class: Mapping[str, int] | None = None,
        seed: int = 0,
        mean_per_class: bool = False,
    ) -> None:
        super().__init__(name if name is not None else "textures", mean_per_class)
        counts = dict(n_per_class) if n_per_class is not None else {"train": 200, "test": 100}
        self.splits = validate_splits(list(counts), self.name)
        for split, n in counts.items():
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ConfigError(f"textures n_per_class[{split!r}] must be a positive int, got {n!r}")
        self.n_per_class = counts
        self.seed = int(seed)
        self.class_names = list(CLASS_NAMES)

    def labels(self, split: str) -> np.ndarray:
        n = self.n_per_class[self.check_split(split)]
        return np.repeat(np.arange(len(CLASS_NAMES), dtype=np.int64), n)

    def sample_ids(self, split: str) -> list[str]:
        return [str(i) for i in range(self.num_samples(split))]

    def render(self, split: str, i: int) -> np.ndarray:
        """Sample ``i`` of ``split`` as float32 (32, 32) in [0, 1].

        Parameters
        ----------
        split : str
        i : int
            Position in the split.

        Returns
        -------
        numpy.ndarray
        """
        n = self.n_per_class[self.check_split(split)]
        if not 0 <= i < n * len(CLASS_NAMES):
            raise IndexError(
                f"Sample {i} out of range for split {split!r} of {self.name!r} ({n * len(CLASS_NAMES)} samples)"
            )
        rng = np.random.default_rng([self.seed, zlib.crc32(split.encode()), i])
        return render_texture(i // n, rng)

    def images(self, split: str) -> np.ndarray:
        """Every sample of ``split`` as float32 (n, 32, 32).

        Parameters
        ----------
        split : str

        Returns
        -------
        numpy.ndarray
        """
        return np.stack([self.render(split, i) for i in range(self.num_samples(split))])

    def load_image(self, split: str, i: int) -> Image.Image:
        grey = np.round(self.render(split, i) * 255.0).astype(np.uint8)
        return Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2))

    @property
    def fingerprint_mode(self) -> str:
        return "generated"

    def fingerprint(self, split: str) -> str:
        h = Hasher(f"{self.adapter}/v{self.version}").text(self.check_split(split)).texts(self.class_names)
        return h.text(f"seed={self.seed};n_per_class={self.n_per_class[split]};size={SIZE}").hexdigest()

    def describe(self) -> dict[str, Any]:
        return {**self._base_description(), "n_per_class": dict(self.n_per_class), "seed": self.seed}
