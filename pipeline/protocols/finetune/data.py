"""Images for fine-tuning: the model's own timm transforms, the held-out validation draw,
and a step-indexed, seeded sample stream that makes a resumed run see exactly the batches
and augmentations an uninterrupted one sees."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from pipeline.datasets import TorchImageDataset
from pipeline.errors import DataValidationError
from pipeline.protocols.finetune.settings import RANDOM_RESIZED_CROP_FLIP, DatasetSplits

__all__ = [
    "SeededTrainingImages",
    "StepBatchSampler",
    "eval_loader",
    "derived_seed",
    "eval_transform",
    "held_out_validation",
    "train_transform",
    "training_loader",
]

_ORDER_STREAM = 0  # SeedSequence streams: sample order and per-draw augmentation never share seeds
_AUGMENT_STREAM = 1


def derived_seed(*entropy: int) -> int:
    """A 63-bit seed from integers, via NumPy's SeedSequence (distinct inputs, unrelated seeds)."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1, dtype=np.uint64)[0] >> 1)


def train_transform(data_config: dict[str, Any], augmentation: str) -> Callable[[Image.Image], Tensor]:
    """timm's transform for ``data_config``: random resized crop (scale 0.08-1) and a
    horizontal flip with p = 0.5 (no colour jitter), or the evaluation centre crop."""
    if augmentation == RANDOM_RESIZED_CROP_FLIP:
        return create_transform(**data_config, is_training=True, hflip=0.5, color_jitter=None)
    return eval_transform(data_config)


def eval_transform(data_config: dict[str, Any]) -> Callable[[Image.Image], Tensor]:
    """timm's evaluation transform (resize, centre crop, normalise) for ``data_config``."""
    return create_transform(**data_config, is_training=False)


def held_out_validation(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified draw of ``val_fraction`` of the samples (scikit-learn's
    StratifiedShuffleSplit, ``random_state=seed``), as the linear probe draws it."""
    from sklearn.model_selection import StratifiedShuffleSplit

    labels = np.asarray(labels)
    splitter = StratifiedShuffleSplit(n_splits=1, test_size=val_fraction, random_state=seed)
    try:
        train, val = next(splitter.split(np.zeros((labels.size, 1)), labels))
    except ValueError as exc:
        counts = np.unique(labels, return_counts=True)[1]
        raise DataValidationError(
            f"Cannot hold out a stratified {val_fraction:g} validation split from {labels.size} train "
            f"samples of {counts.size} classes (smallest class: {counts.min() if counts.size else 0} "
            f"samples): {exc}. Give the dataset's own validation split (val_split) or change val_fraction."
        ) from None
    return np.sort(train).astype(np.int64), np.sort(val).astype(np.int64)


class SeededTrainingImages(Dataset):
    """Training samples drawn by position: item ``(p, k)`` is sample ``k`` transformed under
    RNGs seeded from ``(seed, p)``, with its label."""

    def __init__(self, adapter: Any, samples: Sequence[tuple[str, int]], labels: np.ndarray,
                 transform: Callable[[Image.Image], Tensor], seed: int) -> None:
        self.adapter = adapter
        self.samples = [(str(s), int(i)) for s, i in samples]
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: tuple[int, int]) -> tuple[Tensor, int]:
        position, k = key
        split, index = self.samples[k]
        image = self.adapter.load_image(split, index)
        seed = derived_seed(self.seed, _AUGMENT_STREAM, position)
        # Private RNG states: the transform's draws neither depend on nor disturb the
        # process-wide generators that dropout and other code use. Transforms draw from
        # torch's CPU default generator; torch.manual_seed would also seed every
        # accelerator (0.3 ms a call), so only that generator is seeded and restored.
        cpu = torch.default_generator
        torch_state, py_state = cpu.get_state(), random.getstate()
        try:
            cpu.manual_seed(seed)
            random.seed(seed)
            tensor = self.transform(image)
        finally:
            cpu.set_state(torch_state)
            random.setstate(py_state)
        return tensor, int(self.labels[k])


class StepBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of steps ``start_step .. steps - 1``; each batch lists ``(position, k)``."""
    # The samples form one endless stream of epochs, each a seeded permutation of all
    # ``n`` samples; step ``t`` takes stream positions ``t * batch_size`` to
    # ``(t + 1) * batch_size - 1`` (a batch may span two epochs; no sample is dropped).

    def __init__(self, n: int, batch_size: int, steps: int, seed: int, start_step: int = 0) -> None:
        if n < 1:
            raise DataValidationError("fine-tuning needs at least one training sample, got 0")
        self.n, self.batch_size, self.steps, self.seed = int(n), int(batch_size), int(steps), int(seed)
        self.start_step = int(start_step)
        self._epoch: tuple[int, np.ndarray] | None = None

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The permutation of sample indices in ``epoch``."""
        if self._epoch is None or self._epoch[0] != epoch:
            gen = torch.Generator().manual_seed(derived_seed(self.seed, _ORDER_STREAM, epoch))
            self._epoch = (epoch, torch.randperm(self.n, generator=gen).numpy())
        return self._epoch[1]

    def batch(self, step: int) -> list[tuple[int, int]]:
        """``(position, sample index)`` of every draw of ``step``."""
        out = []
        for position in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, offset = divmod(position, self.n)
            out.append((position, int(self.epoch_order(epoch)[offset])))
        return out

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for step in range(self.start_step, self.steps):
            yield self.batch(step)

    def __len__(self) -> int:
        return max(self.steps - self.start_step, 0)


def training_loader(images: SeededTrainingImages, sampler: StepBatchSampler, num_workers: int,
                    pin_memory: bool) -> DataLoader:
    """DataLoader over ``images`` in the sampler's step order."""
    return DataLoader(images, batch_sampler=sampler, num_workers=num_workers, pin_memory=pin_memory,
                      generator=_private_generator())


def eval_loader(splits: DatasetSplits, split: str, indices: Sequence[int] | None,
                transform: Callable[[Image.Image], Tensor], batch_size: int, num_workers: int,
                pin_memory: bool) -> DataLoader:
    """Batches of ``split`` (or of the listed samples) in order."""
    dataset = TorchImageDataset(splits.adapter, split, transform, indices)
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      pin_memory=pin_memory, generator=_private_generator())


def _private_generator() -> torch.Generator:
    """A DataLoader draws its workers' base seed when an iterator starts, from the
    process-wide generator unless given its own; that extra draw would shift the dropout
    stream of a resumed run. Worker seeds do not matter here: every draw seeds itself."""
    return torch.Generator().manual_seed(0)
