"""The built-in protocols of PROTOCOLS.md, registered by name with their default settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.calibration import calibration_report
from pipeline.protocols.fewshot import fewshot_episodes
from pipeline.protocols.invariance import invariance_audit
from pipeline.protocols.knn import check_metric_weights, knn_class_weights, topk_blocks
from pipeline.protocols.logistic import LogisticProbe
from pipeline.protocols.lowshot import lowshot_curve
from pipeline.protocols.multilabel import multilabel_logistic
from pipeline.protocols.metrics import accuracy_metrics
from pipeline.protocols.registry import SEED, Bound, EvalData, ProtocolResult, above, at_least, register_protocol
from pipeline.protocols.ridge import DEFAULT_ALPHAS, RidgeProbe
from pipeline.protocols.transforms import TRANSFORMS, make_transform

TRANSFORM_NAMES = tuple(TRANSFORMS)


def _fit_transform(name: str, X_train: np.ndarray, *others: np.ndarray | None):
    """Fit the transform on train only; apply it to train and every other split."""
    t = make_transform(name).fit(X_train)
    return (t.transform(X_train), *(None if o is None else t.transform(o) for o in others))


def _grid(value: Any, default: np.ndarray) -> np.ndarray | None:
    if value is None:
        return None
    return default if value == "default" else np.asarray(value, dtype=np.float64)


@register_protocol(
    "logistic", version=1,
    defaults={"transform": "l2", "Cs": "default", "C": 1.0, "val_fraction": 0.2, "tol": 1e-4,
              "max_iter": 1000, "seed": 0, "calibration_bins": 15},
    choices={"transform": TRANSFORM_NAMES},
    bounds={"C": above(0), "val_fraction": Bound(0, 1, low_open=True, high_open=True), "tol": above(0),
            "max_iter": at_least(1), "seed": SEED, "calibration_bins": at_least(1)},
    description="multinomial L2 logistic probe, L-BFGS, C selected on validation (Kornblith 2019)",
)
def _logistic(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    if np.ndim(data.y_train) == 2:  # multi-label rows: one binary probe per class, C by mAP
        return multilabel_logistic(data, s, _fit_transform)
    X_tr, X_va, X_te = _fit_transform(s["transform"], data.train(), data.X_val, data.X_test)
    y_tr = data.y_train
    if X_va is not None:  # a dataset-defined validation split selects C; the refit uses both
        val_mask = np.r_[np.zeros(len(y_tr), bool), np.ones(len(data.y_val), bool)]
        X_tr, y_tr = np.concatenate([X_tr, X_va]), np.concatenate([y_tr, data.y_val])
        tr, va = np.flatnonzero(~val_mask), np.flatnonzero(val_mask)
    else:  # the probe's own stratified draw, reproduced for calibration below
        val_mask = None
        from sklearn.model_selection import StratifiedShuffleSplit

        tr, va = next(StratifiedShuffleSplit(1, test_size=s["val_fraction"], random_state=s["seed"])
                      .split(X_tr, y_tr))
    probe = LogisticProbe(C=s["C"], Cs=s["Cs"], val_fraction=s["val_fraction"], tol=s["tol"],
                          max_iter=s["max_iter"], random_state=s["seed"]).fit(X_tr, y_tr, val_mask=val_mask)
    metrics = accuracy_metrics(data.y_test, probe.predict(X_te), data.mean_per_class)
    diagnostics = {"C": float(probe.C_), "n_iter": int(np.max(probe.n_iter_)), "converged": bool(probe.converged_),
                   "validation": "dataset split" if val_mask is not None else f"stratified {s['val_fraction']:g} of train"}
    if s["Cs"] is not None:
        # Calibration (Ericsson 4.7): T is fitted by NLL on the validation split of a
        # model that did not see it (the selected C on the train part), then applied to
        # the final model's test logits.
        held = LogisticProbe(C=probe.C_, tol=s["tol"], max_iter=s["max_iter"]).fit(X_tr[tr], y_tr[tr])
        cal = calibration_report(_logits(held, X_tr[va]), y_tr[va], _logits(probe, X_te), data.y_test,
                                 n_bins=s["calibration_bins"])
        metrics.update(ece=cal.ece_before, ece_temperature_scaled=cal.ece_after, nll=cal.nll_before,
                       nll_temperature_scaled=cal.nll_after)
        diagnostics.update(temperature=cal.temperature, temperature_at_bound=cal.temperature_at_bound,
                           val_scores=[float(v) for v in probe.val_scores_],
                           calibration_fit_converged=bool(held.converged_))
        diagnostics["converged"] = bool(probe.converged_ and held.converged_)
    return ProtocolResult(metrics, diagnostics)


def _logits(probe: LogisticProbe, X: np.ndarray) -> np.ndarray:
    """(n, K) logits also for two classes, where decision_function returns one column."""
    z = probe.decision_function(X)
    return np.column_stack([np.zeros_like(z), z]) if z.ndim == 1 else z


@register_protocol(
    "ridge", version=1,
    defaults={"transform": "none", "alphas": "default", "alpha": 1e-4, "fit_intercept": True},
    choices={"transform": TRANSFORM_NAMES},
    bounds={"alpha": at_least(0)},
    description="least squares to one-vs-rest targets, alpha by exact leave-one-out PRESS (ViT few-shot)",
)
def _ridge(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    X_tr, X_te = _fit_transform(s["transform"], data.train(), data.X_test)
    probe = RidgeProbe(alpha=s["alpha"], fit_intercept=s["fit_intercept"],
                       alphas=_grid(s["alphas"], DEFAULT_ALPHAS)).fit(X_tr, data.y_train)
    metrics = accuracy_metrics(data.y_test, probe.predict(X_te), data.mean_per_class)
    diagnostics = {"alpha": float(probe.alpha_)}
    if getattr(probe, "press_", None) is not None:
        diagnostics["press"] = [float(p) for p in np.ravel(probe.press_)]
    return ProtocolResult(metrics, diagnostics)


@register_protocol(
    "knn", version=1,
    defaults={"n_neighbors": 20, "metric": "cosine", "weights": "exp", "temperature": 0.07},
    choices={"metric": ("cosine", "euclidean"), "weights": ("exp", "uniform")},
    check=lambda s: check_metric_weights(s["metric"], s["weights"]),
    bounds={"n_neighbors": at_least(1), "temperature": above(0)},
    description="weighted k-NN on cosine similarity (Wu 2018, DINO); streams train blocks",
)
def _knn(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    if s["n_neighbors"] > len(data.y_train):  # known before a single block is read
        raise DataValidationError(f"n_neighbors={s['n_neighbors']} is larger than the train set "
                                  f"({len(data.y_train)} rows)")
    blocks = data.train_blocks() if data.train_blocks is not None else [(data.X_train, 0)]
    scores, idx = topk_blocks(data.X_test, blocks, s["n_neighbors"], s["metric"])
    weights = knn_class_weights(scores, idx, data.y_train, data.n_classes, s["weights"], s["temperature"])
    metrics = accuracy_metrics(data.y_test, np.argmax(weights, axis=1), data.mean_per_class)
    return ProtocolResult(metrics, {"n_train": int(len(data.y_train))})


@register_protocol(
    "fewshot", version=1,
    defaults={"n_way": 5, "n_shot": 20, "n_query": 15, "n_episodes": 600, "seed": 0, "pool": "all"},
    choices={"pool": ("all", "test")},
    bounds={"n_way": at_least(2), "n_shot": at_least(1), "n_query": at_least(1), "n_episodes": at_least(1),
            "seed": SEED},
    description="N-way K-shot nearest-centroid episodes with a 95% CI (Ericsson 2021)",
)
def _fewshot(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    if s["pool"] == "all":  # Ericsson sample episodes from train, val and test pooled
        parts = [(data.train(), data.y_train), (data.X_test, data.y_test)]
        if data.X_val is not None:
            parts.append((data.X_val, data.y_val))
        X = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
    else:
        X, y = data.X_test, data.y_test
    res = fewshot_episodes(X, y, n_way=s["n_way"], n_shot=s["n_shot"], n_query=s["n_query"],
                           n_episodes=s["n_episodes"], seed=s["seed"])
    return ProtocolResult({"score": res.mean, "mean": res.mean, "ci95": res.ci95, "std": res.std},
                          {"eligible_classes": len(res.eligible_classes)})


@register_protocol(
    "lowshot", version=1,
    defaults={"shots": [1, 2, 4, 8, 16, 32, 64, 128, "all"], "n_seeds": 5, "probe": "ridge",
              "transform": "l2", "seed": 0, "on_insufficient": "skip"},
    choices={"probe": ("ridge", "logistic"), "transform": TRANSFORM_NAMES, "on_insufficient": ("raise", "skip")},
    bounds={"n_seeds": at_least(1), "seed": SEED},
    description="accuracy with N train images per class, 5 samples each (ImageNet-CoG)",
)
def _lowshot(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    res = lowshot_curve(data.train(), data.y_train, data.X_test, data.y_test, shots=s["shots"],
                        n_seeds=s["n_seeds"], probe=s["probe"], transform=s["transform"], seed=s["seed"],
                        on_insufficient=s["on_insufficient"])
    metrics: dict[str, Any] = {"curve": {str(k): float(v) for k, v in res.mean.items()},
                               "curve_std": {str(k): float(v) for k, v in res.std.items()}}
    full = [k for k in res.mean if k == "all"]
    metrics["score"] = float(res.mean[full[0]]) if full else float(list(res.mean.values())[-1])
    return ProtocolResult(metrics, {"skipped": {str(k): v for k, v in res.skipped.items()}})


@register_protocol(
    "invariance", version=1,
    defaults={"seed": 0, "max_train": 1000, "max_dims": 64, "min_singular_ratio": 1e-3, "logistic_tol": 1e-6},
    bounds={"seed": SEED, "max_train": at_least(1), "max_dims": at_least(1),
            "min_singular_ratio": Bound(0, 1, low_open=True, high_open=True), "logistic_tol": above(0)},
    description="changed predictions under rotation, scale, translation, per-feature and dense maps",
)
def _invariance(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    X, y = data.train(), data.y_train
    if len(y) > s["max_train"]:  # the audit refits ten protocols five times: keep it cheap
        keep = np.sort(np.random.default_rng(s["seed"]).choice(len(y), s["max_train"], replace=False))
        X, y = X[keep], y[keep]
    basis = _principal_basis(X, s["max_dims"], s["min_singular_ratio"])
    audit = invariance_audit(X @ basis, y, data.X_test @ basis, data.y_test, seed=s["seed"],
                             logistic_tol=s["logistic_tol"])
    records = audit.to_records()
    violations = audit.violations()
    return ProtocolResult({"records": records, "violations": len(violations)},
                          {"n_train_used": int(len(y)), "dims_used": int(basis.shape[1]),
                           "dims_stored": int(X.shape[1])})


def _principal_basis(X: np.ndarray, max_dims: int, min_singular_ratio: float) -> np.ndarray:
    """Orthonormal basis (d, r) of the train features' leading principal directions.

    The maps of the audit multiply condition numbers (per-feature scale 10^±2, dense map
    10^±1), and least squares and whitening, whose invariances are audited, need a
    numerically full-rank train covariance after every map. Real features are often
    rank deficient (dead ReLU units, d > n) with a long tail of tiny singular values, so
    the audit runs in the coordinates of at most ``max_dims`` principal directions whose
    singular values are at least ``min_singular_ratio`` times the largest: the bulk of the
    train variation, well conditioned. The record says how many were used.
    """
    Xc = (X - X.mean(axis=0)).astype(np.float64)
    _, sv, Vt = np.linalg.svd(Xc, full_matrices=False)
    keep = int(np.sum(sv > sv[0] * min_singular_ratio)) if sv.size and sv[0] > 0 else 0
    r = max(1, min(keep, max_dims, X.shape[0] - 2))
    return Vt[:r].T
