"""The built-in protocols, registered by name with their defaults, capabilities and memory.

Only metadata is built at import: the runners import their implementations (torch,
scikit-learn) when they run, so listing protocols and checking settings stays cheap.
Every runner reads features through ``FeatureRows`` (never a second full-size copy: no
concatenation of splits, no transformed copy) and runs on the ``device`` setting's device,
which its diagnostics record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, DataValidationError, unknown_name
from pipeline.protocols.blocks import FeatureRows, block_rows
from pipeline.protocols.inputs.devices import check_device_name, resolve_device
from pipeline.protocols.evidence import Evidence, float16_scores
from pipeline.protocols.memory import (
    fewshot_memory, invariance_memory, knn_memory, logistic_memory, lowshot_memory, ridge_memory,
)
from pipeline.protocols.metrics import accuracy_metrics, multilabel_metrics
from pipeline.protocols.registry import SEED, Bound, EvalData, ProtocolResult, above, at_least, register_protocol

#: Names of the preprocessing transforms (``transforms.TRANSFORMS``, kept here without importing torch).
TRANSFORM_NAMES = ("none", "l2", "standardize", "whiten")
#: Settings shared by the probes that run in torch.
DEVICE_DEFAULT = {"device": "auto"}
#: Scalar metrics of a single-label classifier's record, and of a multi-label probe's.
CLASS_METRICS = ("score", "top1", "mean_per_class")
MULTILABEL_METRICS = ("map11", "map11_devkit", "map")
# Queries whose class weights are formed at once (k-NN): bounds an (m x K) array.
_VOTE_CHUNK = 4096


def _check_device(settings: Mapping[str, Any]) -> None:
    check_device_name(settings["device"])


def _grid(value: Any, default: np.ndarray) -> np.ndarray | None:
    if value is None:
        return None
    return default if value == "default" else np.asarray(value, dtype=np.float64)


def _score(data: EvalData, probe: Any, rows: FeatureRows, blocks: Any) -> tuple[dict[str, float], Evidence | None]:
    """Test metrics and the cell's evidence: accuracy (or mean per class) of the
    predictions, or mAP for multi-label scores (computed from their stored float16 copy)."""
    if data.multilabel:  # VOC 2007's metric: 11-point mAP, "difficult" (-1) rows ignored per class
        scores = float16_scores(np.concatenate([z.cpu().numpy() for z, _ in blocks(rows)]))
        return multilabel_metrics(data.y_test, scores), Evidence.of_scores(data.y_test, scores)
    pred = probe.predict_rows(rows)
    return accuracy_metrics(data.y_test, pred, data.mean_per_class), class_evidence(data, pred)


def class_evidence(data: EvalData, predictions: Any) -> Evidence | None:
    """The predictions as evidence when the labels are class indices 0 .. n_classes - 1 (as
    stored); None for other labels (a protocol called directly on names), which no stored
    cell has.

    Parameters
    ----------
    data : EvalData
        The cell's arrays.
    predictions : array-like, shape (n_test,)
        The predicted label of each test example.

    Returns
    -------
    Evidence or None
    """
    pred, y = np.asarray(predictions), np.asarray(data.y_test)
    if not _class_indices(y, data.n_classes) or not _class_indices(pred, data.n_classes):
        return None
    return Evidence.of_predictions(y, pred, data.n_classes, data.mean_per_class)


def _class_indices(values: np.ndarray, n_classes: int) -> bool:
    integral = values.dtype != bool and np.issubdtype(values.dtype, np.integer)
    return bool(integral and (values.size == 0 or (values.min() >= 0 and values.max() < max(n_classes, 1))))


def _present(data: EvalData) -> np.ndarray:
    """Train targets of a probe: class indices, or for multi-label rows the objects present
    (a "difficult" object, -1, is present; the 11-point mAP ignores it when scoring)."""
    return (np.asarray(data.y_train) != 0).astype(np.uint8) if data.multilabel else data.y_train


def _train_val_rows(data: EvalData) -> tuple[FeatureRows, np.ndarray, np.ndarray | None]:
    """Train (and validation) features as one FeatureRows without concatenating them."""
    parts = [data.train()] + ([data.X_val] if data.X_val is not None else [])
    rows = FeatureRows(parts, data.X_test.shape[1])
    if data.X_val is None:
        return rows, np.asarray(data.y_train), None
    y = np.concatenate([data.y_train, data.y_val])
    return rows, y, np.arange(len(data.y_train), len(y))


@register_protocol(
    "logistic", version=2,  # 2: the seed's tie rule, collapsed refits moved, map11 as Ericsson et al.
    defaults={"transform": "l2", "Cs": "default", "C": 1.0, "val_fraction": 0.2, "tol": 1e-4,
              "max_iter": 1000, "seed": 0, "calibration_bins": 15, **DEVICE_DEFAULT},
    choices={"transform": TRANSFORM_NAMES},
    bounds={"C": above(0), "val_fraction": Bound(0, 1, low_open=True, high_open=True), "tol": above(0),
            "max_iter": Bound(1, 100_000), "seed": SEED, "calibration_bins": Bound(1, 1000)},
    check=_check_device, multilabel=True, memory=logistic_memory,
    metrics=CLASS_METRICS + ("ece", "ece_temperature_scaled", "nll", "nll_temperature_scaled") + MULTILABEL_METRICS,
    unbounded=("nll", "nll_temperature_scaled"),
    description="multinomial L2 logistic probe, L-BFGS, C selected on validation (Kornblith 2019)",
)
def _logistic(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    if data.multilabel:  # the paper's VOC setting: one binary probe per class, difficult left out
        from pipeline.protocols.linear.multilabel import multilabel_logistic

        return multilabel_logistic(data, s)
    import torch

    from pipeline.protocols.linear.logistic import LogisticProbe
    from pipeline.protocols.transforms import fit_row_map

    device = resolve_device(s["device"])
    rows, y, val_index = _train_val_rows(data)
    # the transform is fitted on the train split only
    row_map = fit_row_map(s["transform"], rows.select(np.arange(len(data.y_train))), device)
    rows, test = rows.with_map(row_map), FeatureRows.of(data.X_test).with_map(row_map)
    probe = LogisticProbe(C=s["C"], Cs=s["Cs"], val_fraction=s["val_fraction"], tol=s["tol"], max_iter=s["max_iter"],
                          random_state=s["seed"], device=device).fit_rows(rows, y, val_index=val_index)
    metrics, evidence = _score(data, probe, test, probe.score_blocks)
    diagnostics = {"C": float(probe.C_), "n_iter": int(np.max(probe.n_iter_)), "converged": bool(probe.converged_),
                   "validation": "dataset split" if val_index is not None else f"stratified {s['val_fraction']:g} of train",
                   "device": str(device)}
    warnings = []
    if s["Cs"] is not None:
        diagnostics["val_scores"] = [float(v) for v in probe.val_scores_]
        diagnostics["grid_n_iter"] = [int(i) for i in probe.grid_n_iter_]
        warnings = _selection_warnings(probe)
        if probe.selection_moves_:
            diagnostics["selection_moves"] = [{"from_C": a, "to_C": b, "why": why}
                                              for a, b, why in probe.selection_moves_]
    if s["Cs"] is not None and not data.multilabel:
        # Calibration (Ericsson 4.7): T is fitted by NLL on the probe's validation split,
        # with a model that did not see it (the selected C on the probe's train part),
        # then applied to the final model's test logits. (Softmax calibration has no
        # multi-label counterpart: such cells report none.)
        from pipeline.protocols.audits.calibration import calibration_report_blocks

        tr, va = probe.train_index_, probe.val_index_
        held = LogisticProbe(C=probe.C_, tol=s["tol"], max_iter=s["max_iter"], device=device)
        held.fit_rows(rows.select(tr), y[tr])
        y_val = torch.from_numpy(_columns(held.classes_, y[va])).to(device)
        y_test = torch.from_numpy(_columns(probe.classes_, data.y_test)).to(device)
        val_rows = rows.select(va)
        cal = calibration_report_blocks(
            lambda: ((z, y_val[i:i + len(z)]) for z, i in held.score_blocks(val_rows)),
            lambda: ((z, y_test[i:i + len(z)]) for z, i in probe.score_blocks(test)), n_bins=s["calibration_bins"])
        metrics.update(ece=cal.ece_before, ece_temperature_scaled=cal.ece_after, nll=cal.nll_before,
                       nll_temperature_scaled=cal.nll_after)
        diagnostics.update(temperature=cal.temperature, temperature_at_bound=cal.temperature_at_bound,
                           calibration_fit_converged=bool(held.converged_))
        diagnostics["converged"] = bool(probe.converged_ and held.converged_)
        if cal.temperature_at_bound:
            from pipeline.protocols.fit_warnings import fit_warning

            warnings.append(fit_warning("temperature_edge", f"T = {cal.temperature:g} is at an end of its search "
                                        "range: ece_temperature_scaled and nll_temperature_scaled are the bound's, "
                                        "not an optimum's"))
    return ProtocolResult(metrics, diagnostics, warnings, evidence=evidence)


def _selection_warnings(probe: Any) -> list[dict[str, str]]:
    """Grid edge and plateau of the logistic probe's C, and a choice moved off a collapsed refit."""
    from pipeline.protocols.fit_warnings import fit_warning, grid_warnings

    chosen = int(np.flatnonzero(probe.Cs_ == probe.C_)[0])
    out = grid_warnings("C", probe.Cs_, probe.val_scores_, chosen, criterion="validation score")
    for left, taken, why in probe.selection_moves_:
        out.append(fit_warning("selection_moved", f"the refit on all rows at C = {left:.3g} collapsed ({why}); "
                                                  f"C = {taken:.3g} taken, the best of the weaker penalties"))
    return out


def _columns(classes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Logit column of each label; a label the probe never saw cannot be calibrated."""
    col = np.searchsorted(classes, labels)
    unseen = (col >= classes.size) | (classes[np.minimum(col, classes.size - 1)] != labels)
    if unseen.any():
        raise DataValidationError(f"labels {np.unique(labels[unseen])[:5].tolist()} do not occur in the probe's "
                                  "training rows; calibration needs every class in train")
    return col.astype(np.int64)


@register_protocol(
    "ridge", version=2,  # 2: map11 as Ericsson et al. compute it, map11_devkit beside it
    defaults={"transform": "none", "alphas": "default", "alpha": 1e-4, "fit_intercept": True, **DEVICE_DEFAULT},
    choices={"transform": TRANSFORM_NAMES},
    bounds={"alpha": at_least(0)},
    check=_check_device, streams_train=True, multilabel=True, memory=ridge_memory,
    metrics=CLASS_METRICS + MULTILABEL_METRICS,
    description="least squares to one-vs-rest targets, alpha by exact leave-one-out PRESS (ViT few-shot)",
)
def _ridge(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    from pipeline.protocols.linear.ridge import DEFAULT_ALPHAS, RidgeProbe
    from pipeline.protocols.transforms import fit_row_map

    device = resolve_device(s["device"])
    train = data.train_rows()
    row_map = fit_row_map(s["transform"], train, device)
    probe = RidgeProbe(alpha=s["alpha"], fit_intercept=s["fit_intercept"], alphas=_grid(s["alphas"], DEFAULT_ALPHAS),
                       device=device).fit_rows(train.with_map(row_map), _present(data))
    metrics, evidence = _score(data, probe, FeatureRows.of(data.X_test).with_map(row_map), probe.score_blocks)
    diagnostics = {"alpha": float(probe.alpha_), "device": str(device)}
    warnings = []
    if getattr(probe, "press_", None) is not None:
        from pipeline.protocols.fit_warnings import grid_warnings

        diagnostics["press"] = [float(p) for p in np.ravel(probe.press_)]
        grid = np.ravel(_grid(s["alphas"], DEFAULT_ALPHAS))
        # PRESS is continuous: a relative 1e-6 tells a real gain from round-off
        warnings = grid_warnings("alpha", grid, diagnostics["press"], int(np.flatnonzero(grid == probe.alpha_)[0]),
                                 higher_is_better=False, rtol=1e-6, criterion="LOO PRESS")
    return ProtocolResult(metrics, diagnostics, warnings, evidence=evidence)


#: k-NN metrics and the vote weightings valid with each.
KNN_METRICS: dict[str, tuple[str, ...]] = {"cosine": ("exp", "uniform"), "euclidean": ("uniform",)}


def check_metric_weights(metric: str, weights: str) -> None:
    """Refuse a k-NN metric/weights pair that has no meaning (exp weights need cosine).

    Parameters
    ----------
    metric : str
        ``cosine`` or ``euclidean``.
    weights : str
        ``exp`` or ``uniform``.
    """
    if metric not in KNN_METRICS:
        raise unknown_name("metric", metric, KNN_METRICS)
    if weights not in KNN_METRICS[metric]:
        raise ConfigError(
            f"weights={weights!r} is not defined for metric={metric!r}; valid weights for "
            f"{metric!r}: {', '.join(KNN_METRICS[metric])} ('exp' weights exp(s / tau) need "
            "cosine similarities s)"
        )


def _check_knn(settings: Mapping[str, Any]) -> None:
    check_metric_weights(settings["metric"], settings["weights"])
    _check_device(settings)


@register_protocol(
    "knn", version=1,
    defaults={"n_neighbors": 20, "metric": "cosine", "weights": "exp", "temperature": 0.07, **DEVICE_DEFAULT},
    choices={"metric": ("cosine", "euclidean"), "weights": ("exp", "uniform")},
    check=_check_knn, streams_train=True, memory=knn_memory, metrics=CLASS_METRICS,
    bounds={"n_neighbors": at_least(1), "temperature": above(0)},
    description="weighted k-NN on cosine similarity (Wu 2018, DINO); streams train blocks",
)
def _knn(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    from pipeline.protocols.neighbours.knn import knn_class_weights, topk_blocks

    if s["n_neighbors"] > len(data.y_train):  # known before a single block is read
        raise DataValidationError(f"n_neighbors={s['n_neighbors']} is larger than the train set "
                                  f"({len(data.y_train)} rows)")
    device = resolve_device(s["device"])
    if data.train_blocks is not None and data.X_train is None:
        blocks = data.train_blocks()
    else:
        rows = block_rows(data.X_train.shape[1], device, itemsize=4)
        blocks = ((data.X_train[i:i + rows], i) for i in range(0, len(data.X_train), rows))
    scores, idx = topk_blocks(data.X_test, blocks, s["n_neighbors"], s["metric"], device=device)
    pred = np.concatenate([
        np.argmax(knn_class_weights(scores[i:i + _VOTE_CHUNK], idx[i:i + _VOTE_CHUNK], data.y_train, data.n_classes,
                                    s["weights"], s["temperature"]), axis=1)
        for i in range(0, len(scores), _VOTE_CHUNK)])
    metrics = accuracy_metrics(data.y_test, pred, data.mean_per_class)
    return ProtocolResult(metrics, {"n_train": int(len(data.y_train)), "device": str(device)},
                          evidence=class_evidence(data, pred))


@register_protocol(
    "fewshot", version=1,
    defaults={"n_way": 5, "n_shot": 20, "n_query": 15, "n_episodes": 600, "seed": 0, "pool": "all",
              **DEVICE_DEFAULT},
    choices={"pool": ("all", "test")},
    bounds={"n_way": at_least(2), "n_shot": at_least(1), "n_query": at_least(1),
            "n_episodes": Bound(1, 100_000), "seed": SEED},
    check=_check_device, streams_train=True, memory=fewshot_memory,
    metrics=("score", "mean", "ci95", "std"), primary_metric="mean",
    description="N-way K-shot nearest-centroid episodes with a 95% CI (Ericsson 2021)",
)
def _fewshot(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    from pipeline.protocols.episodic.fewshot import fewshot_episodes

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
    from pipeline.protocols.fit_warnings import at_chance_warning

    chance = at_chance_warning(res.mean, 1.0 / s["n_way"], f"1/{s['n_way']} of an episode's ways")
    return ProtocolResult({"score": res.mean, "mean": res.mean, "ci95": res.ci95, "std": res.std},
                          {"eligible_classes": len(res.eligible_classes), "device": str(device)}, chance,
                          evidence=evidence)


@register_protocol(
    "lowshot", version=2,  # 2: its logistic probe selects C as logistic 2 does
    defaults={"shots": [1, 2, 4, 8, 16, 32, 64, 128, "all"], "n_seeds": 5, "probe": "ridge",
              "transform": "l2", "seed": 0, "on_insufficient": "skip", **DEVICE_DEFAULT},
    choices={"probe": ("ridge", "logistic"), "transform": TRANSFORM_NAMES, "on_insufficient": ("raise", "skip")},
    bounds={"n_seeds": Bound(1, 1000), "seed": SEED},
    check=_check_device, streams_train=True, memory=lowshot_memory, metrics=("score",),
    description="accuracy with N train images per class, 5 samples each (ImageNet-CoG)",
)
def _lowshot(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
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
    if all(_class_indices(np.asarray(p), data.n_classes) for _, _, p in fits) and _class_indices(
            np.asarray(data.y_test), data.n_classes):
        evidence = Evidence.of_fits(data.y_test, fits, data.n_classes, headline)
    return ProtocolResult(metrics, {"skipped": {str(k): v for k, v in res.skipped.items()}, "device": str(device)},
                          evidence=evidence)


@register_protocol(
    "invariance", version=2,  # 2: weak-penalty logistic fits taken to their optimum
    defaults={"seed": 0, "max_train": 1000, "max_dims": 64, "min_singular_ratio": 1e-3, "logistic_tol": 1e-6},
    bounds={"seed": SEED, "max_train": at_least(1), "max_dims": at_least(1),
            "min_singular_ratio": Bound(0, 1, low_open=True, high_open=True), "logistic_tol": above(0)},
    streams_train=True, memory=invariance_memory, metrics=("violations",), primary_metric="violations",
    unbounded=("violations",),
    description="changed predictions under rotation, scale, translation, per-feature and dense maps",
)
def _invariance(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    from pipeline.protocols.audits.invariance import invariance_audit

    rows, y = data.train_rows(), np.asarray(data.y_train)
    keep = np.arange(len(y))
    if len(y) > s["max_train"]:  # the audit refits ten protocols five times: keep it cheap
        keep = np.sort(np.random.default_rng(s["seed"]).choice(len(y), s["max_train"], replace=False))
    X, y = rows.cached(keep).take(keep), y[keep]
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
