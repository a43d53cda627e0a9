"""Fine-tuning protocol (Ericsson et al. 2021, A.2): a grid of resumable training runs,
selection on validation, a refit on train + validation, one test."""

from __future__ import annotations

import importlib
from typing import Any

from pipeline.protocols.finetune.settings import (
    AUGMENTATIONS,
    CENTER_CROP,
    DEFAULT_LRS,
    DEFAULT_WEIGHT_DECAYS,
    RANDOM_RESIZED_CROP_FLIP,
    DatasetSplits,
    FinetuneSettings,
    GridPoint,
    grid_points,
)

_LAZY = {
    "cosine_lr": "optim", "make_optimizer": "optim", "make_scheduler": "optim", "optimizer_weight_decay": "optim",
    "finetune_result": "result", "run_finetune": "result", "select_best": "result",
    "REFIT": "unit", "SELECT": "unit", "STAGES": "unit", "FinetuneClassifier": "unit",
    "run_grid_point": "unit",
}

__all__ = sorted([*_LAZY, "AUGMENTATIONS", "CENTER_CROP", "DEFAULT_LRS", "DEFAULT_WEIGHT_DECAYS",
                  "RANDOM_RESIZED_CROP_FLIP", "DatasetSplits", "FinetuneSettings", "GridPoint", "grid_points"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"pipeline.protocols.finetune.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pipeline.protocols.finetune' has no attribute {name!r}")
