"""Multi-label linear probe: one binary L2 logistic regression per class (one-vs-rest).

The VOC 2007 setting of Kornblith et al. and Ericsson et al.: for each class c a binary
logistic regression with sklearn's objective
    C * sum_i log(1 + exp(-t_ic (w_c . h_i + b_c))) + 0.5 ||w_c||^2     (t_ic = +-1, b_c free)
over the images that are not "difficult" for c. One C, shared by the classes, is chosen
from a grid by the 11-point mean average precision ``map11`` (Ericsson et al.'s
computation, ``average_precision``) on a validation split (the dataset's, else a seeded
random share of train: stratifying on label sets is not defined), each fit
warm-started from the previous C, ties to the weaker penalty as in their code; the probe
is then refitted on train + validation and scored on test. Fits use sklearn's
``LogisticRegression`` (lbfgs), so every number is the reference implementation's; a fit
that stops at ``max_iter`` is reported.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.evidence import Evidence, float16_scores
from pipeline.protocols.fit_warnings import fit_warning, grid_warnings
from pipeline.protocols.inputs.features import check_features
from pipeline.protocols.inputs.labels import check_multilabel
from pipeline.protocols.linear.average_precision import mean_average_precision_11
from pipeline.protocols.linear.logistic import DEFAULT_CS
from pipeline.protocols.metrics import multilabel_metrics
from pipeline.protocols.registry import EvalData, ProtocolResult, get_protocol, list_protocols
from pipeline.protocols.transforms import apply_transform


def accepts_multilabel(protocol: Any) -> bool:
    """Whether the registered protocol (an entry or its name) can fit multi-label data."""
    entry = get_protocol(protocol) if isinstance(protocol, str) else protocol
    return bool(entry.multilabel)


def refuse_multilabel(protocol: Any, where: str = "") -> None:
    """Raise a DataValidationError unless ``protocol`` can take (n, C) multi-label data."""
    if not accepts_multilabel(protocol):
        name = protocol if isinstance(protocol, str) else protocol.name
        able = ", ".join(p for p in list_protocols() if accepts_multilabel(p))
        raise DataValidationError(f"{where}protocol {name!r} needs one class per sample and cannot take multi-label "
                                  f"data; protocols that can: {able}")


class MultiLabelLogisticProbe:
    """One-vs-rest binary L2 logistic regressions sharing one C."""

    def __init__(self, C: float = 1.0, Cs: Any = None, val_fraction: float = 0.2, tol: float = 1e-4,
                 max_iter: int = 1000, random_state: int = 0) -> None:
        self.C, self.Cs, self.val_fraction = C, Cs, val_fraction
        self.tol, self.max_iter, self.random_state = tol, max_iter, random_state

    def _fit_all(self, X: np.ndarray, Y: np.ndarray, C: float, warm: list | None) -> tuple[list, int, bool]:
        """Per class an sklearn model (None where the rows hold one label), starting from ``warm``."""
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression

        models, most, converged = [], 0, True
        for c in range(Y.shape[1]):
            weight = (Y[:, c] >= 0).astype(np.float64)
            target = (Y[:, c] == 1).astype(np.int64)
            if len(np.unique(target[weight > 0])) < 2:
                models.append(None)
                continue
            model = LogisticRegression(C=C, tol=self.tol, max_iter=self.max_iter, solver="lbfgs",
                                       warm_start=warm is not None and warm[c] is not None)
            if model.warm_start:
                model.coef_, model.intercept_ = warm[c].coef_.copy(), warm[c].intercept_.copy()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)  # reported through converged_
                model.fit(X, target, sample_weight=weight)
            iters = int(np.max(model.n_iter_))
            most, converged = max(most, iters), converged and iters < self.max_iter
            models.append(model)
        return models, most, converged

    @staticmethod
    def _scores(models: list, X: np.ndarray) -> np.ndarray:
        return np.column_stack([np.zeros(len(X)) if m is None else m.decision_function(X) for m in models])

    def fit(self, X: np.ndarray, Y: np.ndarray, val_mask: np.ndarray | None = None) -> MultiLabelLogisticProbe:
        """Fit on features (n, d) and multi-label rows (n, K) in {1, 0, -1}."""
        X = np.asarray(X, dtype=np.float64)
        Y = check_multilabel(Y, name="Y", difficult=True)
        if len(X) != len(Y):
            raise DataValidationError(f"X has {len(X)} rows but Y has {len(Y)}")

        grid = None if self.Cs is None else np.unique(DEFAULT_CS if isinstance(self.Cs, str) else
                                                        np.asarray(self.Cs, dtype=np.float64).ravel())
        converged, warm = True, None
        if grid is None:
            C = float(self.C)
            self.Cs_, self.val_scores_ = np.array([C]), np.array([])
            self.n_val_ = 0
        else:
            if val_mask is None:
                rng = np.random.default_rng(self.random_state)
                val_mask = np.zeros(len(Y), dtype=bool)
                val_mask[rng.permutation(len(Y))[:max(1, int(round(self.val_fraction * len(Y))))]] = True
            tr, va = ~np.asarray(val_mask, dtype=bool), np.asarray(val_mask, dtype=bool)
            if not tr.any() or not va.any():
                raise DataValidationError(f"the validation mask marks {int(va.sum())} of {len(Y)} rows; "
                                          "both parts need rows")
            scores, best = [], None
            for C in grid:  # ascending C: from the strongest penalty down, warm-started
                warm, _, ok = self._fit_all(X[tr], Y[tr], float(C), warm)
                converged = converged and ok
                score = mean_average_precision_11(self._scores(warm, X[va]), Y[va], "seed")[0]
                scores.append(score)
                if best is None or score >= scores[best[0]]:  # Ericsson et al.: the weaker penalty wins ties
                    best = (len(scores) - 1, warm)
            self.Cs_, self.val_scores_ = grid, np.array(scores)
            self.n_val_ = int(va.sum())
            C, warm = float(grid[best[0]]), best[1]
        models, self.n_iter_, ok = self._fit_all(X, Y, C, warm)
        self.C_, self.converged_ = C, bool(converged and ok)
        self.constant_classes_ = [c for c, m in enumerate(models) if m is None]
        self.coef_ = np.vstack([np.zeros(X.shape[1]) if m is None else m.coef_[0] for m in models])
        self.intercept_ = np.array([0.0 if m is None else float(m.intercept_[0]) for m in models])
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        """Scores (n, K): w_c . h + b_c per class."""
        return np.asarray(X, dtype=np.float64) @ self.coef_.T + self.intercept_


def multilabel_logistic(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    """The ``logistic`` protocol on multi-label data (VOC 2007's size: the features are held
    in memory, transformed with the transform fitted on the train split only)."""
    splits = [check_features(data.train(), "X_train"), check_features(data.X_test, "X_test")]
    if data.X_val is not None:
        splits.append(check_features(data.X_val, "X_val"))
    rows = [FeatureRows.of(X) for X in splits]
    mapped = apply_transform(s["transform"], rows[0], *rows)
    X_tr, X_te, *X_va = (r.numpy(X.dtype) for r, X in zip(mapped, splits, strict=True))
    X_va = X_va[0] if X_va else None
    Y_tr = check_multilabel(data.y_train, name="y_train", difficult=True)
    val_mask = None
    if X_va is not None:  # a dataset-defined validation split selects C; the refit uses both
        val_mask = np.r_[np.zeros(len(Y_tr), bool), np.ones(len(data.y_val), bool)]
        Y_va = check_multilabel(data.y_val, name="y_val", difficult=True)
        X_tr, Y_tr = np.concatenate([X_tr, X_va]), np.concatenate([Y_tr, Y_va])
    probe = MultiLabelLogisticProbe(C=s["C"], Cs=s["Cs"], val_fraction=s["val_fraction"], tol=s["tol"],
                                    max_iter=s["max_iter"], random_state=s["seed"]).fit(X_tr, Y_tr, val_mask)
    # scored from the float16 copy that is stored: a later comparison reads the same numbers
    scores = float16_scores(probe.decision_function(X_te))
    metrics = multilabel_metrics(data.y_test, scores)
    validation = "dataset split" if val_mask is not None else f"random {s['val_fraction']:g} of train (seeded)"
    if s["Cs"] is None:  # a fixed C: nothing selected, a validation split trained on
        validation = "none: C fixed" + ("; the validation split is trained on" if val_mask is not None else "")
    diagnostics = {"C": probe.C_, "n_iter": int(probe.n_iter_), "converged": probe.converged_,
                   "validation": validation, "n_val": int(probe.n_val_), "val_scores": [float(v) for v in probe.val_scores_],
                   "multi_label": True, "classes_without_classifier": probe.constant_classes_,
                   "calibration": "not computed for multi-label data"}

    warnings_ = [] if probe.converged_ else [fit_warning(
        "not_converged", f"a binary fit reached max_iter={s['max_iter']} before tol={s['tol']:g}; converged is False")]
    if probe.val_scores_.size:
        warnings_ += grid_warnings("C", probe.Cs_, probe.val_scores_, int(np.flatnonzero(probe.Cs_ == probe.C_)[0]),
                                   criterion="validation map11", setting="Cs")
    return ProtocolResult(metrics, diagnostics, warnings_, evidence=Evidence.of_scores(data.y_test, scores))
