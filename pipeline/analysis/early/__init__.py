"""Early estimates of a new encoder's scores from a small chosen part of each dataset."""

from pipeline.analysis.early.coverage import CoverageState, coverage_state, gross_miss
from pipeline.analysis.early.estimate import (
    MIN_HISTORY, Estimate, HistoryModel, LineTrial, PairedHistoryModel, conformal_half_width, jackknife_plus, line_trial,
    min_history,
    stratified_change, stratified_estimate, weighted_accuracy,
)
from pipeline.analysis.early.subsets import anchor_rows, allocate, stratified_rows
from pipeline.analysis.early.verdicts import CALIBRATED, EARLY_VERDICTS, detectable_difference, early_verdict

__all__ = [
    "CALIBRATED", "EARLY_VERDICTS", "MIN_HISTORY", "CoverageState", "Estimate", "HistoryModel", "LineTrial",
    "PairedHistoryModel", "allocate", "anchor_rows", "conformal_half_width", "coverage_state", "detectable_difference", "early_verdict",
    "gross_miss", "jackknife_plus", "line_trial", "min_history", "stratified_change", "stratified_estimate",
    "stratified_rows",
    "weighted_accuracy",
]
