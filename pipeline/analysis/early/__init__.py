"""Early estimates of a new encoder's scores from a small chosen part of each dataset.

``subsets`` chooses the rows (a seeded stratified sample, or anchor rows chosen from how
earlier encoders did on each test image), ``estimate`` turns a score on those rows into an
estimate of the full figure with an interval (sampling theory, or a predictor calibrated
on the history by jackknife+: from the early score, or from its change since the
checkpoint before), ``verdicts`` draws early verdicts only where the interval allows
(and, for a sampling estimate, a paired test too), and ``coverage`` says whether the
intervals have held.
"""

from pipeline.analysis.early.coverage import CoverageState, coverage_state
from pipeline.analysis.early.estimate import (
    MIN_HISTORY, Estimate, HistoryModel, PairedHistoryModel, jackknife_plus, min_history, stratified_estimate,
    weighted_accuracy,
)
from pipeline.analysis.early.subsets import anchor_rows, allocate, stratified_rows
from pipeline.analysis.early.verdicts import CALIBRATED, EARLY_VERDICTS, detectable_difference, early_verdict

__all__ = [
    "CALIBRATED", "EARLY_VERDICTS", "MIN_HISTORY", "CoverageState", "Estimate", "HistoryModel", "PairedHistoryModel",
    "allocate", "anchor_rows", "coverage_state", "detectable_difference", "early_verdict", "jackknife_plus",
    "min_history", "stratified_estimate", "stratified_rows", "weighted_accuracy",
]
