"""Fine-tuning protocol (Ericsson et al. 2021, A.2): a grid of resumable training runs,
selection on validation, a refit on train + validation, one test.

Entry points: :func:`grid_points` lists the runs of a :class:`FinetuneSettings`;
:func:`run_grid_point` is one resumable run (a unit of work for a scheduler);
:func:`select_best` and :func:`finetune_result` combine the runs; :func:`run_finetune`
does all of it in one process.
"""

from pipeline.finetune.optim import cosine_lr, make_optimizer, make_scheduler, optimizer_weight_decay
from pipeline.finetune.result import finetune_result, run_finetune, select_best
from pipeline.finetune.settings import (
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
from pipeline.finetune.unit import REFIT, SELECT, STAGES, FinetuneClassifier, resolve_device, run_grid_point

__all__ = [
    "AUGMENTATIONS",
    "CENTER_CROP",
    "DEFAULT_LRS",
    "DEFAULT_WEIGHT_DECAYS",
    "RANDOM_RESIZED_CROP_FLIP",
    "REFIT",
    "SELECT",
    "STAGES",
    "DatasetSplits",
    "FinetuneClassifier",
    "FinetuneSettings",
    "GridPoint",
    "cosine_lr",
    "finetune_result",
    "grid_points",
    "make_optimizer",
    "make_scheduler",
    "optimizer_weight_decay",
    "resolve_device",
    "run_finetune",
    "run_grid_point",
    "select_best",
]
