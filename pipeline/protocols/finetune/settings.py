"""Fine-tuning settings, the hyper-parameter grid and the splits a run reads."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.names import validate_name
from pipeline.plain import to_plain
from pipeline.protocols.inputs.parameters import OPTIMIZER_MAX

RANDOM_RESIZED_CROP_FLIP = "random_resized_crop_flip"
CENTER_CROP = "center_crop"
AUGMENTATIONS = (RANDOM_RESIZED_CROP_FLIP, CENTER_CROP)
PRECISIONS = ("float32", "bfloat16")
DEFAULT_LRS = tuple(float(v) for v in np.logspace(-4, -1, 4))
DEFAULT_WEIGHT_DECAYS = (0.0,) + tuple(float(v) for v in np.logspace(-6, -3, 4))

__all__ = [
    "AUGMENTATIONS",
    "CENTER_CROP",
    "DEFAULT_LRS",
    "DEFAULT_WEIGHT_DECAYS",
    "DatasetSplits",
    "FinetuneSettings",
    "GridPoint",
    "RANDOM_RESIZED_CROP_FLIP",
    "grid_points",
]


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _check_int(name: str, value: object, low: int) -> None:
    if not _is_int(value) or value < low:
        raise ConfigError(f"finetune setting {name} must be an integer >= {low}, got {value!r}")


def _check_values(name: str, values: object, low: float, low_open: bool) -> tuple[float, ...]:
    """A non-empty sequence of finite numbers above ``low`` (strictly when ``low_open``) and
    at most ``OPTIMIZER_MAX`` (they are the optimizer's step sizes and decays)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ConfigError(f"finetune setting {name} must be a sequence of numbers, got {values!r}")
    out = tuple(values)
    if not out:
        raise ConfigError(f"finetune setting {name} must not be empty")
    sign = ">" if low_open else ">="
    for v in out:
        if (not _is_number(v) or not math.isfinite(float(v)) or (float(v) <= low if low_open else float(v) < low)
                or float(v) > OPTIMIZER_MAX):
            raise ConfigError(f"finetune setting {name}: every value must be a finite number {sign} {low:g} and "
                              f"<= {OPTIMIZER_MAX:g}, got {v!r}")
    if len(set(out)) != len(out):
        raise ConfigError(f"finetune setting {name} has duplicate values: {list(out)}")
    return tuple(float(v) for v in out)


@dataclass(frozen=True)
class FinetuneSettings:
    """Everything that decides a fine-tuning result, validated on construction.

    Parameters
    ----------
    steps : optimizer steps per training run (each grid point and the refit).
    batch_size : images per step.
    lrs : base learning rates of the grid.
    weight_decays : weight decays of the grid, before division by the learning rate.
    augmentations : training augmentations of the grid, from ``AUGMENTATIONS``.
    momentum : Nesterov momentum of SGD.
    val_fraction : stratified share of train held out for selection when the dataset has
        no validation split.
    seed : seeds the validation draw, the sample order, the augmentation and dropout.
    calibration_bins : equal-width confidence bins of the ECE.
    precision : ``float32``, or ``bfloat16`` autocast for the forward pass.
    save_every : steps between two saved training states (does not change the result).
    eval_batch_size : images per batch when computing logits (does not change the result
        beyond float rounding of batched kernels).
    num_workers : DataLoader worker processes (does not change the result).
    """

    steps: int = 5000
    batch_size: int = 64
    lrs: tuple[float, ...] = DEFAULT_LRS
    weight_decays: tuple[float, ...] = DEFAULT_WEIGHT_DECAYS
    augmentations: tuple[str, ...] = AUGMENTATIONS
    momentum: float = 0.9
    val_fraction: float = 0.2
    seed: int = 0
    calibration_bins: int = 15
    precision: str = "float32"
    save_every: int = 250
    eval_batch_size: int = 256
    num_workers: int = 4

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("batch_size", 1), ("calibration_bins", 1), ("save_every", 1),
                          ("eval_batch_size", 1), ("num_workers", 0), ("seed", 0)):
            _check_int(name, getattr(self, name), low)
        object.__setattr__(self, "lrs", _check_values("lrs", self.lrs, 0.0, low_open=True))
        object.__setattr__(self, "weight_decays", _check_values("weight_decays", self.weight_decays, 0.0, False))
        augs = self.augmentations
        if isinstance(augs, str) or not hasattr(augs, "__iter__") or not tuple(augs):
            raise ConfigError(f"finetune setting augmentations must be a non-empty sequence of "
                              f"{list(AUGMENTATIONS)}, got {augs!r}")
        augs = tuple(augs)
        for aug in augs:
            if aug not in AUGMENTATIONS:
                raise ConfigError(f"finetune setting augmentations: unknown augmentation {aug!r}; "
                                  f"valid choices: {', '.join(AUGMENTATIONS)}")
        if len(set(augs)) != len(augs):
            raise ConfigError(f"finetune setting augmentations has duplicates: {list(augs)}")
        object.__setattr__(self, "augmentations", augs)
        if not _is_number(self.momentum) or not 0.0 <= float(self.momentum) < 1.0:
            raise ConfigError(f"finetune setting momentum must be in [0, 1), got {self.momentum!r}")
        if not _is_number(self.val_fraction) or not 0.0 < float(self.val_fraction) < 1.0:
            raise ConfigError(f"finetune setting val_fraction must be in (0, 1), got {self.val_fraction!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"finetune setting precision must be one of {', '.join(PRECISIONS)}, "
                              f"got {self.precision!r}")

    def result_settings(self) -> dict[str, Any]:
        """The settings that decide the result: ``to_plain(self)`` without ``save_every``,
        ``eval_batch_size`` and ``num_workers`` (a record key must not change with them).

        Returns
        -------
        dict
        """
        out = to_plain(self)
        for name in ("save_every", "eval_batch_size", "num_workers"):
            out.pop(name)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FinetuneSettings:
        """Inverse of ``to_plain(settings)``; an unknown key is an error naming the valid ones
        (the probes' layer cannot use ``jobs.config.typed.from_plain``).

        Parameters
        ----------
        data : mapping
            Settings by name.

        Returns
        -------
        FinetuneSettings
        """
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ConfigError(f"Unknown finetune setting(s) {unknown}; valid settings: {', '.join(fields)}")
        return cls(**data)


@dataclass(frozen=True)
class GridPoint:
    """One training configuration of the grid.

    Parameters
    ----------
    lr : base learning rate (> 0).
    weight_decay : weight decay before the division by the learning rate (>= 0).
    augmentation : one of ``AUGMENTATIONS``.
    """

    lr: float
    weight_decay: float
    augmentation: str

    def __post_init__(self) -> None:
        if not _is_number(self.lr) or not math.isfinite(float(self.lr)) or float(self.lr) <= 0.0:
            raise ConfigError(f"grid point lr must be a finite number > 0, got {self.lr!r}")
        if (not _is_number(self.weight_decay) or not math.isfinite(float(self.weight_decay))
                or float(self.weight_decay) < 0.0):
            raise ConfigError(f"grid point weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if self.augmentation not in AUGMENTATIONS:
            raise ConfigError(f"grid point augmentation {self.augmentation!r} is not one of "
                              f"{', '.join(AUGMENTATIONS)}")
        object.__setattr__(self, "lr", float(self.lr))
        object.__setattr__(self, "weight_decay", float(self.weight_decay))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GridPoint:
        """Inverse of ``to_plain(point)`` (``{"lr", "weight_decay", "augmentation"}``), as a
        worker's result carries the point.

        Parameters
        ----------
        data : mapping
            ``lr``, ``weight_decay`` and ``augmentation``.

        Returns
        -------
        GridPoint
        """
        return cls(**data)


def grid_points(settings: FinetuneSettings) -> list[GridPoint]:
    """Every (lr, weight decay, augmentation) of ``settings`` in a fixed order.

    Parameters
    ----------
    settings : supplies ``lrs``, ``weight_decays`` and ``augmentations``.

    Returns
    -------
    list of GridPoint
        Learning rates as given, then weight decays, then augmentations. Ties in
        selection go to the earlier point, so this order is part of the result.
    """
    return [GridPoint(lr, wd, aug) for lr in settings.lrs for wd in settings.weight_decays
            for aug in settings.augmentations]


@dataclass(frozen=True)
class DatasetSplits:
    """An image dataset adapter and the names of the splits fine-tuning reads.

    Parameters
    ----------
    adapter : a ``pipeline.datasets`` adapter holding images.
    train_split, test_split : split names of the adapter.
    val_split : the dataset's own validation split, or None to hold out a stratified
        ``val_fraction`` of train.
    """

    adapter: Any
    train_split: str = "train"
    test_split: str = "test"
    val_split: str | None = None

    def __post_init__(self) -> None:
        if not getattr(self.adapter, "has_images", False):
            name = getattr(self.adapter, "name", self.adapter)
            raise ConfigError(f"fine-tuning needs an image dataset; {name!r} holds precomputed features")
        names = [self.train_split, self.test_split] + ([self.val_split] if self.val_split is not None else [])
        for split in names:
            validate_name(split, "split name")
            self.adapter.check_split(split)
        if len(set(names)) != len(names):
            raise ConfigError(f"fine-tuning splits must differ, got train={self.train_split!r}, "
                              f"val={self.val_split!r}, test={self.test_split!r}")

    @classmethod
    def of(cls, dataset: Any) -> DatasetSplits:
        """``dataset`` itself if it is a DatasetSplits, else its default splits
        (train / test, no validation split).

        Parameters
        ----------
        dataset : DatasetSplits or DatasetAdapter

        Returns
        -------
        DatasetSplits
        """
        return dataset if isinstance(dataset, DatasetSplits) else cls(dataset)
