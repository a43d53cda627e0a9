"""The readouts over sampled subsets, ``fewshot`` (episodes) and ``lowshot`` (N images per
class), registered with their defaults, ranges and memory models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.cell import CellShape
from pipeline.protocols.episodic.fewshot import fewshot_episodes
from pipeline.protocols.fit_warnings import at_chance_warning
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.evidence import Evidence, class_indices
from pipeline.protocols.linear.protocols import ridge_terms
from pipeline.protocols.memory import (
    F8, RUNTIME, feature_rows, features, indices, labels, matrix, peak, work,
)
from pipeline.protocols.registry import SEED, Bound, EvalData, ProtocolResult, at_least, register_protocol
from pipeline.protocols.transforms import TRANSFORM_NAMES

__all__ = ["fewshot_memory", "lowshot_memory"]

# Elements of the few-shot sampling key and feature blocks (as in fewshot).
_FEWSHOT_BLOCK = (1 << 20) + (1 << 21)


def fewshot_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """Few-shot episodes (stream the train split): the rows the episodes use, index arrays."""
    per_episode = int(s.get("n_way", 5)) * (int(s.get("n_shot", 20)) + int(s.get("n_query", 15)))
    used = int(s.get("n_episodes", 600)) * per_episode
    cached = feature_rows(min(c.n_train, used), c) if s.get("pool", "all") == "all" else 0
    return peak(features=features(c, streams=True), labels=labels(c), cached_train_rows=cached,
                episode_rows=indices(used, arrays=3), pool=indices(c.n_train + c.n_test + c.n_val, arrays=3),
                blocks=work(_FEWSHOT_BLOCK, copies=4, itemsize=F8), runtime=RUNTIME)


def lowshot_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """Low-shot sweep (streams the train split): one sample kept, the ridge terms."""
    shots = [n for n in s.get("shots", []) if isinstance(n, int)]
    sample_rows = min(c.n_train, max(shots, default=0) * c.n_classes)
    svd_route = matrix(c.dim, c.dim, copies=8)  # the ridge's SVD route below 2d rows
    return peak(features=features(c, streams=True), labels=labels(c), sample=feature_rows(sample_rows, c),
                permutations=indices(c.n_train, arrays=3), solver=max(ridge_terms(c), svd_route),
                predictions=indices(c.n_test), runtime=RUNTIME)


@register_protocol(
    "fewshot", version=1,
    defaults={"n_way": 5, "n_shot": 20, "n_query": 15, "n_episodes": 600, "seed": 0, "pool": "all"},
    choices={"pool": ("all", "test")},
    bounds={"n_way": at_least(2), "n_shot": at_least(1), "n_query": at_least(1),
            "n_episodes": Bound(1, 100_000), "seed": SEED},
    runs_on_device=True, streams_train=True, memory=fewshot_memory,
    metrics=("score", "mean", "ci95", "std"), primary_metric="mean",
    description="N-way K-shot nearest-centroid episodes with a 95% CI (Ericsson 2021)",
    cheap_settings={"n_way": 2, "n_shot": 2, "n_query": 2, "n_episodes": 5}, slow=True,
)
def _fewshot(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    device = resolve_device(s["device"])
    d = data.X_test.shape[1]
    if s["pool"] == "all":  # Ericsson sample episodes from train, val and test pooled (no copy)
        train = data.X_train if data.X_train is not None else (data.train_blocks, len(data.y_train))
        parts = [train, data.X_test] + ([data.X_val] if data.X_val is not None else [])
        labels = [data.y_train, data.y_test] + ([data.y_val] if data.X_val is not None else [])
        rows, y = FeatureRows(parts, d), np.concatenate(labels)
    else:
        rows, y = FeatureRows.of(data.X_test), data.y_test
    res = fewshot_episodes(rows, y, n_way=s["n_way"], n_shot=s["n_shot"], n_query=s["n_query"],
                           n_episodes=s["n_episodes"], seed=s["seed"], device=device)
    # the episodes depend on the pool's labels and the seed only: another encoder's cell on
    # the same data draws the same ones, so their episode accuracies pair up
    evidence = Evidence.of_episodes(np.asarray(y).astype(np.int64), res.accuracies, seed=s["seed"], n_way=s["n_way"], n_shot=s["n_shot"],
                                    n_query=s["n_query"])

    chance = at_chance_warning(res.mean, 1.0 / s["n_way"], f"1/{s['n_way']} of an episode's ways")
    return ProtocolResult({"score": res.mean, "mean": res.mean, "ci95": res.ci95, "std": res.std},
                          {"eligible_classes": len(res.eligible_classes), "device": str(device)}, chance,
                          evidence=evidence)


@register_protocol(
    "lowshot", version=3,  # 2: its logistic probe selects C as logistic 2 does; 3: as logistic 3 does
    defaults={"shots": [1, 2, 4, 8, 16, 32, 64, 128, "all"], "n_seeds": 5, "probe": "ridge",
              "transform": "l2", "seed": 0, "on_insufficient": "skip"},
    choices={"probe": ("ridge", "logistic"), "transform": TRANSFORM_NAMES, "on_insufficient": ("raise", "skip")},
    bounds={"n_seeds": Bound(1, 1000), "seed": SEED},
    runs_on_device=True, streams_train=True, memory=lowshot_memory, metrics=("score",),
    description="accuracy with N train images per class, 5 samples each (ImageNet-CoG)",
    cheap_settings={"shots": [1, 2], "n_seeds": 1}, slow=True,
)
def _lowshot(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: scipy, scikit-learn and torch load when a cell runs, not when the registry is read
    from pipeline.protocols.episodic.lowshot import lowshot_curve

    device = resolve_device(s["device"])
    res = lowshot_curve(data.train_rows(), data.y_train, data.X_test, data.y_test, shots=s["shots"],
                        n_seeds=s["n_seeds"], probe=s["probe"], transform=s["transform"], seed=s["seed"],
                        on_insufficient=s["on_insufficient"], device=device)
    metrics: dict[str, Any] = {"curve": {str(k): float(v) for k, v in res.mean.items()},
                               "curve_std": {str(k): float(v) for k, v in res.std.items()}}
    full = [k for k in res.mean if k == "all"]
    headline = full[0] if full else list(res.mean)[-1]
    metrics["score"] = float(res.mean[headline])
    fits = [(run.shots, run.repetition, run.predictions) for run in res.runs]
    evidence = None
    if all(class_indices(np.asarray(p), data.n_classes) for _, _, p in fits) and class_indices(
            np.asarray(data.y_test), data.n_classes):
        evidence = Evidence.of_fits(data.y_test, fits, data.n_classes, headline)
    return ProtocolResult(metrics, {"skipped": {str(k): v for k, v in res.skipped.items()}, "device": str(device)},
                          evidence=evidence)
