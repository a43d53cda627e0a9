"""A torch Dataset view of an image adapter, for DataLoader workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from pipeline.datasets.base import DatasetAdapter
from pipeline.errors import DatasetError


class TorchImageDataset(Dataset):
    """Items ``(transform(image), index)`` of one split; picklable when adapter and transform are.

    ``indices`` selects samples (default all, in order); the returned index is the adapter's
    sample index, so batches can be written back in place.

    Parameters
    ----------
    adapter : DatasetAdapter
        An image dataset.
    split : str
        One of its splits.
    transform : callable
        PIL image -> tensor (the encoder's evaluation transform).
    indices : sequence of int, optional
        The samples to serve (default: all, in order).
    """

    def __init__(
        self,
        adapter: DatasetAdapter,
        split: str,
        transform: Callable[[Image.Image], Tensor],
        indices: Sequence[int] | None = None,
    ) -> None:
        if not adapter.has_images:
            raise DatasetError(
                f"Dataset {adapter.name!r} holds precomputed features; there are no images to load"
            )
        n = adapter.num_samples(adapter.check_split(split))
        chosen = list(range(n)) if indices is None else [int(i) for i in indices]
        out_of_range = [i for i in chosen if not 0 <= i < n]
        if out_of_range:
            raise DatasetError(
                f"indices {out_of_range[:10]} out of range for split {split!r} of "
                f"{adapter.name!r} ({n} samples)"
            )
        self.adapter = adapter
        self.split = split
        self.transform = transform
        self.indices = chosen

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> tuple[Tensor, int]:
        i = self.indices[k]
        return self.transform(self.adapter.load_image(self.split, i)), i
