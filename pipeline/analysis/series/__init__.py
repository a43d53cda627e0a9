"""Checkpoint series: the training step of each checkpoint (:mod:`.steps`), and
best-so-far bookkeeping with regression flags (:mod:`.best`)."""

from pipeline.analysis.series.best import BestSoFar, SeriesCheck, best_checkpoints, best_so_far, check_newest
from pipeline.analysis.series.steps import (
    STEP_METADATA_KEYS, CheckpointStep, checkpoint_step, compile_step_pattern, order_series, read_step_metadata,
    series_name, step_from_name,
)

__all__ = [
    "STEP_METADATA_KEYS", "BestSoFar", "CheckpointStep", "SeriesCheck", "best_checkpoints", "best_so_far",
    "check_newest", "checkpoint_step", "compile_step_pattern", "order_series", "read_step_metadata",
    "series_name", "step_from_name",
]
