"""The linear readouts, ``logistic`` and ``ridge``, registered with their defaults, ranges,
capabilities and memory models.

Only metadata is built at import: the runners import their implementations (torch,
scikit-learn) when they run, so listing protocols and checking settings stays cheap.
Every runner reads features through ``FeatureRows`` (never a second full-size copy: no
concatenation of splits, no transformed copy) and runs on the ``device`` setting's device,
which its diagnostics record; the ``transform`` setting is applied by
``pipeline.protocols.transforms.apply_transform``. The solvers' memory terms are shared with the families built on these probes (low-shot,
the MLP's linear baseline).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.cell import CellShape
from pipeline.protocols.fit_warnings import fit_warning, grid_warnings
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.evidence import Evidence, class_evidence, float16_scores
from pipeline.protocols.memory import (
    F4, F8, RUNTIME, features, indices, labels, lbfgs_copies, matrix, parameters, peak, row_blocks,
)
from pipeline.protocols.metrics import CLASS_METRICS, MULTILABEL_METRICS, accuracy_metrics, multilabel_metrics
from pipeline.protocols.registry import SEED, Bound, EvalData, ProtocolResult, above, at_least, register_protocol
from pipeline.protocols.transforms import TRANSFORM_NAMES, apply_transform

__all__ = ["logistic_memory", "logistic_terms", "ridge_memory", "ridge_terms"]

_HISTORY = 20  # L-BFGS pairs (as in lbfgs)


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


# -- memory ------------------------------------------------------------------------------------
def ridge_terms(c: CellShape) -> int:
    """What the ridge solver holds beside its features (the Gram route): d x d matrices,
    d x K summaries, the QR fallback, float64 blocks."""
    d, K = c.dim, c.n_classes
    return peak(gram=matrix(d, d, copies=6), qr_fallback=matrix(d + K, d + K, copies=3),
                summaries=matrix(d, K, copies=6), blocks=row_blocks(10))


def logistic_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The logistic probe: features once, solver state O(K d), float32 blocks."""
    return peak(features=features(c, streams=False), labels=labels(c), solver=logistic_terms(c, s), runtime=RUNTIME)


def logistic_terms(c: CellShape, s: Mapping[str, Any]) -> int:
    """What the logistic probe holds beside its features: solver state O(K d), indices, blocks."""
    fits = 2 if s.get("Cs") is not None else 1  # a grid adds the calibration refit
    size = c.n_classes * (c.dim + 1)
    lbfgs = fits * parameters(size, lbfgs_copies(_HISTORY), itemsize=8)
    if s.get("Cs") is not None and s.get("selection", "stable") == "stable":
        # while the stable selection's exact fits run, the path's pairs and the exact fit's own
        # (4 per pair in all), its work vectors, the fits it keeps (the values its rule reads,
        # rarely more than 12, and the CG solve's 4 vectors for the margin) and their kept
        # curvature pairs (up to 64 MiB) are held; the refits come after, so the larger counts
        walk = parameters(size, 4 * _HISTORY + 16 + 12 + 4, itemsize=8) + (64 << 20)
        lbfgs = max(lbfgs, walk)
    return peak(lbfgs=lbfgs,
                preconditioner=matrix(c.dim + 1, c.dim + 1, copies=4),
                positions=indices(c.n_train + c.n_val, arrays=4),  # targets, train/validation positions
                row_scales=matrix(c.n_train + c.n_val, 1, itemsize=F8 + 4),  # l2: 1/||h|| and its row index
                val_scores=matrix(c.n_val, c.n_classes, copies=3, itemsize=F4),  # logits for multi-label mAP
                blocks=row_blocks(6))


def ridge_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The ridge probe (streams the train split): the Gram route's d^2 and d K terms."""
    return peak(features=features(c, streams=True), labels=labels(c), solver=ridge_terms(c),
                scores=matrix(c.n_test, c.n_classes, itemsize=F4), runtime=RUNTIME)


#: The logistic probe's default ``refine_rtol``: ``logistic_checks.F_RTOL`` (a test holds them
#: equal; that module imports torch, the registry may not): the reported fit at its optimum
#: within float rounding, so its predictions do not move with the features' last bits.
REFINE_RTOL = 1e-9
#: ``selection``: ``logistic.SELECTIONS`` (the registry may not import that module).
LOGISTIC_SELECTIONS = ("stable", "seed")


@register_protocol(
    # 3: the stable selection by default, the final fit to its optimum, map11_devkit with
    # MATLAB's thresholds; 4: the stable rule by the validation log-loss (the strongest
    # penalty within ln 2 / n of the lowest), its margin against rounding measured; 5: where
    # no validation log-loss beats the class prior's, C by accuracy, said fragile
    "logistic", version=5,
    defaults={"transform": "l2", "Cs": "default", "C": 1.0, "val_fraction": 0.2, "tol": 1e-4,
              "max_iter": 1000, "seed": 0, "calibration_bins": 15, "refine_rtol": REFINE_RTOL,
              "refine_grid": False, "selection": "stable"},
    choices={"transform": TRANSFORM_NAMES, "selection": LOGISTIC_SELECTIONS},
    bounds={"C": above(0), "val_fraction": Bound(0, 1, low_open=True, high_open=True), "tol": above(0),
            "max_iter": Bound(1, 100_000), "seed": SEED, "calibration_bins": Bound(1, 1000),
            "refine_rtol": Bound(0, 1, low_open=True)},
    added_settings={"refine_grid": False},  # records made before it existed keep their identity
    runs_on_device=True, multilabel=True, memory=logistic_memory,
    metrics=CLASS_METRICS + ("ece", "ece_temperature_scaled", "nll", "nll_temperature_scaled") + MULTILABEL_METRICS,
    unbounded=("nll", "nll_temperature_scaled"),
    description="multinomial L2 logistic probe, L-BFGS, C selected on validation (Kornblith 2019)",
    cheap_settings={"Cs": [0.1, 1.0], "max_iter": 50}, slow=True,
)
def _logistic(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    if data.multilabel:  # the paper's VOC setting: one binary probe per class, difficult left out
        # deferred: scikit-learn loads when a cell runs, not when the registry is read
        from pipeline.protocols.linear.multilabel import multilabel_logistic

        return multilabel_logistic(data, s)
    import torch

    # deferred: torch and scikit-learn load when a cell runs, not when the registry is read
    from pipeline.protocols.linear.logistic import LogisticProbe

    device = resolve_device(s["device"])
    rows, y, val_index = _train_val_rows(data)
    # the transform is fitted on the train split only
    rows, test = apply_transform(s["transform"], rows.select(np.arange(len(data.y_train))), rows,
                                 FeatureRows.of(data.X_test), device=device)
    probe = LogisticProbe(C=s["C"], Cs=s["Cs"], val_fraction=s["val_fraction"], tol=s["tol"], max_iter=s["max_iter"],
                          random_state=s["seed"], device=device, refine_rtol=s["refine_rtol"],
                          refine_grid=s["refine_grid"], selection=s["selection"]).fit_rows(rows, y, val_index=val_index)
    metrics, evidence = _score(data, probe, test, probe.score_blocks)
    validation = "dataset split" if val_index is not None else f"stratified {s['val_fraction']:g} of train"
    if s["Cs"] is None:  # a fixed C: nothing selected, a validation split trained on
        validation = "none: C fixed" + ("; the validation split is trained on" if val_index is not None else "")
    diagnostics = {"C": float(probe.C_), "n_iter": int(np.max(probe.n_iter_)), "converged": bool(probe.converged_),
                   "validation": validation, "n_val": int(probe.n_val_), "device": str(device)}
    warnings = []
    if s["Cs"] is not None:
        diagnostics["val_scores"] = [float(v) for v in probe.val_scores_]
        diagnostics["grid_n_iter"] = [int(i) for i in probe.grid_n_iter_]
        diagnostics["selection"] = s["selection"] if not data.multilabel else "seed"
        diagnostics["selection_set"] = [float(c) for c in probe.selection_set_]
        if np.isfinite(probe.selection_margin_):  # how far the features' rounding is from moving C
            diagnostics["selection_margin_ulps"] = float(probe.selection_margin_)
            diagnostics["selection_coherent_margin_ulps"] = float(probe.selection_coherent_margin_)
        warnings = _selection_warnings(probe)
        if probe.selection_moves_:
            diagnostics["selection_moves"] = [{"from_C": a, "to_C": b, "why": why}
                                              for a, b, why in probe.selection_moves_]
    if s["Cs"] is not None and not data.multilabel:
        # Calibration (Ericsson 4.7): T is fitted by NLL on the probe's validation split,
        # with a model that did not see it (the selected C on the probe's train part),
        # then applied to the final model's test logits. (Softmax calibration has no
        # multi-label counterpart: such cells report none.)
        # deferred: scipy, as the probe above
        from pipeline.protocols.audits.calibration import calibration_report_blocks

        # deferred: torch, as the probe above
        from pipeline.protocols.linear.linear_loss import linear_score_blocks

        tr, va = probe.train_index_, probe.val_index_
        val_rows = rows.select(va)
        if probe.selection_fit_ is not None:  # the stable selection's own fit of C_ on the train part
            fit, held_classes, held_converged = probe.selection_fit_, probe.classes_, True
        else:
            held = LogisticProbe(C=probe.C_, tol=s["tol"], max_iter=s["max_iter"], device=device,
                                 refine_rtol=s["refine_rtol"]).fit_rows(rows.select(tr), y[tr])
            fit = np.hstack([held.coef_, held.intercept_[:, None]])
            held_classes, held_converged = held.classes_, bool(held.converged_)
        y_val = torch.from_numpy(_columns(held_classes, y[va])).to(device)
        y_test = torch.from_numpy(_columns(probe.classes_, data.y_test)).to(device)
        cal = calibration_report_blocks(
            lambda: ((z, y_val[i:i + len(z)]) for z, i in linear_score_blocks(val_rows, fit[:, :-1], fit[:, -1], device)),
            lambda: ((z, y_test[i:i + len(z)]) for z, i in probe.score_blocks(test)), n_bins=s["calibration_bins"])
        metrics.update(ece=cal.ece_before, ece_temperature_scaled=cal.ece_after, nll=cal.nll_before,
                       nll_temperature_scaled=cal.nll_after)
        diagnostics.update(temperature=cal.temperature, temperature_at_bound=cal.temperature_at_bound,
                           calibration_fit_converged=held_converged)
        diagnostics["converged"] = bool(probe.converged_ and held_converged)
        if cal.temperature_at_bound:
            warnings.append(fit_warning("temperature_edge", f"T = {cal.temperature:g} is at an end of its search "
                                        "range: ece_temperature_scaled and nll_temperature_scaled are the bound's, "
                                        "not an optimum's"))
    return ProtocolResult(metrics, diagnostics, warnings, evidence=evidence)


def _selection_warnings(probe: Any) -> list[dict[str, str]]:
    """Grid edge and (the seed's rule) plateau of the logistic probe's C, a choice that rounding
    could move, and a choice moved off a collapsed refit."""
    chosen = int(np.flatnonzero(probe.Cs_ == probe.C_)[0])
    stable = bool(probe.refined_.any())  # its rule chooses within a plateau: the set is recorded instead
    out = grid_warnings("C", probe.Cs_, probe.val_scores_, chosen, criterion="validation score", setting="Cs",
                        plateau=not stable)
    if probe.selection_fragile_:
        shown = "".join(f"; it could go to C = {c:.3g} ({n} validation rows predicted otherwise)"
                        for c, n in probe.selection_alternatives_[:3])
        out.append(fit_warning("selection_fragile", f"C = {probe.C_:.3g}: {probe.selection_fragile_}{shown}"))
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
    "ridge", version=3,  # 2: map11 as Ericsson et al. compute it, map11_devkit beside it; 3: its MATLAB thresholds
    defaults={"transform": "none", "alphas": "default", "alpha": 1e-4, "fit_intercept": True},
    choices={"transform": TRANSFORM_NAMES},
    bounds={"alpha": at_least(0)},
    runs_on_device=True, streams_train=True, multilabel=True, memory=ridge_memory,
    metrics=CLASS_METRICS + MULTILABEL_METRICS,
    description="least squares to one-vs-rest targets, alpha by exact leave-one-out PRESS (ViT few-shot)",
    cheap_settings={},
)
def _ridge(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch, scipy and scikit-learn load when a cell runs, not when the registry is read
    from pipeline.protocols.linear.ridge import DEFAULT_ALPHAS, RidgeProbe

    device = resolve_device(s["device"])
    train = data.train_rows()
    train, test = apply_transform(s["transform"], train, train, FeatureRows.of(data.X_test), device=device)
    probe = RidgeProbe(alpha=s["alpha"], fit_intercept=s["fit_intercept"], alphas=_grid(s["alphas"], DEFAULT_ALPHAS),
                       device=device).fit_rows(train, _present(data))
    metrics, evidence = _score(data, probe, test, probe.score_blocks)
    # leave-one-out on train: no row is held out (a validation split is not read)
    diagnostics = {"alpha": float(probe.alpha_), "device": str(device), "n_val": 0,
                   "validation": "exact leave-one-out on train" if s["alphas"] is not None else "none: alpha fixed"}
    warnings = []
    if s["alphas"] is not None and getattr(probe, "press_", None) is not None:  # a fixed alpha selects nothing
        diagnostics["press"] = [float(p) for p in np.ravel(probe.press_)]
        grid = np.ravel(_grid(s["alphas"], DEFAULT_ALPHAS))
        # PRESS is continuous: a relative 1e-6 tells a real gain from round-off
        warnings = grid_warnings("alpha", grid, diagnostics["press"], int(np.flatnonzero(grid == probe.alpha_)[0]),
                                 higher_is_better=False, rtol=1e-6, criterion="LOO PRESS",
                                 setting="alphas")
    return ProtocolResult(metrics, diagnostics, warnings, evidence=evidence)
