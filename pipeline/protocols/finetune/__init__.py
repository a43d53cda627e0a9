"""Fine-tuning protocol (Ericsson et al. 2021, A.2): a grid of resumable training runs,
selection on validation, a refit on train + validation, one test.

Entry points: :func:`grid_points` lists the runs of a :class:`FinetuneSettings`;
:func:`run_grid_point` is one resumable run (a unit of work for a scheduler);
:func:`select_best` and :func:`finetune_result` combine the runs; :func:`run_finetune`
does all of it in one process.

Importing the package is cheap: the settings need neither torch nor timm (a config is
validated without them); the training code is imported from its module on first use.
"""

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
