"""Torch Dataset views of an image adapter, for DataLoader workers: decoded and
transformed images, or the image files' bytes (decoded on the extraction device)."""

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


class EncodedImageDataset(Dataset):
    """Items ``(file bytes as a uint8 tensor, index)`` of one split, decoded elsewhere (a GPU)."""
    # For adapters whose samples are image files (``has_image_files``); DataLoader workers
    # then only read files, and :func:`collate_encoded` keeps the variable-length bytes
    # as a list.

    def __init__(self, adapter: DatasetAdapter, split: str) -> None:
        if not adapter.has_image_files:
            raise DatasetError(f"Dataset {adapter.name!r} ({adapter.adapter}) has no image files to decode elsewhere")
        self.adapter = adapter
        self.split = adapter.check_split(split)

    def __len__(self) -> int:
        return self.adapter.num_samples(self.split)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        import torch

        return torch.frombuffer(bytearray(self.adapter.encoded_image(self.split, i)), dtype=torch.uint8), i


def collate_encoded(batch: list[tuple[Tensor, int]]) -> tuple[list[Tensor], Tensor]:
    """A batch of encoded files, kept as a list (their lengths differ)."""
    import torch

    return [data for data, _ in batch], torch.tensor([i for _, i in batch], dtype=torch.int64)
