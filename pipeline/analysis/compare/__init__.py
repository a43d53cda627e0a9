"""Paired comparison of two encoders: score differences, intervals, tests and verdicts."""

from pipeline.analysis.compare.evidence import (
    EPISODE_SAMPLER_VERSION, check_paired, episodes_fingerprint, evidence_sha256, labels_fingerprint,
)
from pipeline.analysis.compare.paired import (
    CLASSIFICATION_METRICS, PairedComparison, compare_episodes, compare_predictions, compare_scores, compare_values,
)
from pipeline.analysis.compare.stats import benjamini_hochberg, mcnemar_exact, paired_t_test, percentile_interval
from pipeline.analysis.compare.verdicts import VERDICTS, CellVerdict, SettingSummary, decide_verdicts, summarise_by_setting

__all__ = [
    "CLASSIFICATION_METRICS", "EPISODE_SAMPLER_VERSION", "VERDICTS", "CellVerdict", "PairedComparison",
    "SettingSummary", "benjamini_hochberg", "check_paired", "compare_episodes", "compare_predictions",
    "compare_scores", "compare_values", "decide_verdicts", "episodes_fingerprint", "evidence_sha256", "labels_fingerprint", "mcnemar_exact",
    "paired_t_test", "percentile_interval", "summarise_by_setting",
]
