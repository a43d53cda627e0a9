"""Metric kinds: what a protocol's headline measures, what evidence a paired test pairs and
how its chance level is found."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["METRIC_KINDS", "MetricKind", "check_kind"]


@dataclass(frozen=True)
class MetricKind:
    """One kind of headline metric."""

    name: str
    evidence: tuple[str, ...]
    unit: str
    paired_test: str
    chance: str


METRIC_KINDS: dict[str, MetricKind] = {k.name: k for k in (
    MetricKind("classification", ("predictions", "fits", "episodes"), "test image (few-shot: episode)",
               "McNemar (top-1), paired randomization (mean per-class), paired t (episodes)",
               "the majority-class rate (1/K of the classes present for mean per-class accuracy; 1/n_way for "
               "episodes)"),
    MetricKind("multi-label", ("scores",), "test image (its per-class scores)", "paired randomization of mAP",
               "none: a class without a present test image is flagged undefined_ap instead"),
    MetricKind("retrieval", ("values",), "query (its own AP@R)", "paired t on per-query values, bootstrap interval",
               "the mean over queries of a random ranking's expected AP@R, (H_R + (R - H_R)(R - 1)/(N - 1)) / N"),
    MetricKind("regression", ("values",), "test image (its own error)", "paired t on per-image values, bootstrap "
               "interval", "the error of predicting the train mean"),
    MetricKind("dense", ("pixel_counts",), "test image (its pixel counts)", "paired randomization over images",
               "none"),
    MetricKind("audit", (), "none: an audit keeps no evidence", "none", "none"),
)}


def check_kind(kind: str, protocol: str) -> MetricKind:
    """The ``MetricKind`` named ``kind``; ValueError naming the valid kinds."""
    if kind not in METRIC_KINDS:
        raise ValueError(f"protocol {protocol!r}: kind {kind!r} is not one of {', '.join(METRIC_KINDS)}")
    return METRIC_KINDS[kind]
