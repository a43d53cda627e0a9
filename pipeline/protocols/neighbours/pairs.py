"""What the k-NN search and its registry entry share without torch: the metric and vote
weighting pairs that have a meaning (checked at config load by the ``knn`` entry, and by
``KNNClassifier``), and the budget of the search's kept queries (which its memory model counts)."""

from __future__ import annotations

from pipeline.errors import ConfigError, unknown_name

__all__ = ["KNN_METRICS", "QUERY_CACHE_BYTES", "check_metric_weights"]

#: The k-NN search keeps its normalised queries when they fit this (converting them once,
#: not once per buffer of train rows); larger query sets are converted chunk by chunk.
QUERY_CACHE_BYTES = 64 << 20

#: k-NN metrics and the vote weightings valid with each.
KNN_METRICS: dict[str, tuple[str, ...]] = {"cosine": ("exp", "uniform"), "euclidean": ("uniform",)}


def check_metric_weights(metric: str, weights: str) -> None:
    """Refuse a k-NN metric/weights pair that has no meaning (exp weights need cosine)."""
    if metric not in KNN_METRICS:
        raise unknown_name("metric", metric, KNN_METRICS)
    if weights not in KNN_METRICS[metric]:
        raise ConfigError(
            f"weights={weights!r} is not defined for metric={metric!r}; valid weights for "
            f"{metric!r}: {', '.join(KNN_METRICS[metric])} ('exp' weights exp(s / tau) need "
            "cosine similarities s)"
        )
