"""The invariance audit, ``invariance``, registered with its defaults, ranges and memory model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.protocols.cell import CellShape
from pipeline.protocols.memory import F8, RUNTIME, feature_rows, features, labels, matrix, peak
from pipeline.protocols.registry import SEED, Bound, EvalData, ProtocolResult, at_least, register_protocol

__all__ = ["invariance_memory"]


def invariance_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The invariance audit (streams the train split): a subsample in float64 and its maps."""
    m = min(c.n_train, int(s.get("max_train", 1000)))
    r = min(c.dim, int(s.get("max_dims", 64)))
    return peak(features=features(c, streams=True), labels=labels(c),
                subsample=feature_rows(m, c, copies=3, itemsize=F8),  # the rows, a centred copy, the SVD's
                projected=matrix(m + c.n_test, r, copies=10),  # the rows in the principal basis, under each map
                test_float64=matrix(c.n_test, c.dim), covariance=matrix(c.dim, c.dim), runtime=RUNTIME)


@register_protocol(
    "invariance", version=3,  # 2: weak-penalty logistic fits taken to their optimum; 3: every logistic fit to 1e-9
    defaults={"seed": 0, "max_train": 1000, "max_dims": 64, "min_singular_ratio": 1e-3, "logistic_tol": 1e-6},
    bounds={"seed": SEED, "max_train": at_least(1), "max_dims": at_least(1),
            "min_singular_ratio": Bound(0, 1, low_open=True, high_open=True),
            # below 1e-12 no float64 fit meets the test: each of the audit's fits ran its 10,000 iterations
            "logistic_tol": Bound(1e-12)},
    streams_train=True, memory=invariance_memory, metrics=("violations",), primary_metric="violations",
    unbounded=("violations",),
    description="changed predictions under rotation, scale, translation, per-feature and dense maps",
    cheap_settings={"max_train": 24, "max_dims": 3}, kind="audit", slow=True,
)
def _invariance(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch, scipy and scikit-learn load when a cell runs, not when the registry is read
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
    """Orthonormal basis (d, r) of the train features' leading principal directions."""
    # The maps of the audit multiply condition numbers (per-feature scale 10^±2, dense map
    # 10^±1), and least squares and whitening, whose invariances are audited, need a
    # numerically full-rank train covariance after every map. Real features are often
    # rank deficient (dead ReLU units, d > n) with a long tail of tiny singular values, so
    # the audit runs in the coordinates of at most ``max_dims`` principal directions whose
    # singular values are at least ``min_singular_ratio`` times the largest: the bulk of the
    # train variation, well conditioned. The record says how many were used.
    Xc = (X - X.mean(axis=0)).astype(np.float64)
    _, sv, Vt = np.linalg.svd(Xc, full_matrices=False)
    keep = int(np.sum(sv > sv[0] * min_singular_ratio)) if sv.size and sv[0] > 0 else 0
    r = max(1, min(keep, max_dims, X.shape[0] - 2))
    return Vt[:r].T
