"""Invariance audit: which coordinate changes of the features each protocol ignores."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from pipeline.errors import DataValidationError, unknown_name
from pipeline.protocols.inputs.labels import check_class_indices, check_train_test
from pipeline.protocols.neighbours.knn import KNNClassifier
from pipeline.protocols.linear.logistic import LogisticProbe
from pipeline.protocols.linear.ridge import RidgeProbe
from pipeline.protocols.transforms.transformers import Standardize, Whiten

__all__ = [
    "AUDIT_PROTOCOLS",
    "EXPECTED_INVARIANCE",
    "MAPS",
    "AuditContext",
    "FeatureMap",
    "InvarianceAudit",
    "InvarianceRecord",
    "invariance_audit",
    "invariance_maps",
]

MAPS: tuple[str, ...] = ("rotation", "isotropic_scale", "translation", "per_feature_scale", "affine")
ISOTROPIC_SCALE = 10.0
TRANSLATION_SCALE = 3.0
PER_FEATURE_LOG10_RANGE = 2.0
AFFINE_LOG10_RANGE = 1.0
LOGISTIC_TOL = 1e-10
LOGISTIC_MAX_ITER = 10_000


def _row(*flags: bool) -> Mapping[str, bool]:
    return MappingProxyType(dict(zip(MAPS, flags)))


#: EXPECTED_INVARIANCE[protocol][map]: True where predictions cannot change.
EXPECTED_INVARIANCE: Mapping[str, Mapping[str, bool]] = MappingProxyType(
    {
        "least_squares_bias": _row(True, True, True, True, True),
        "ridge_no_bias": _row(True, False, False, False, False),
        "ridge_bias": _row(True, False, True, False, False),
        "logistic_no_bias": _row(True, False, False, False, False),
        "logistic_bias": _row(True, False, True, False, False),
        "knn_euclidean": _row(True, True, True, False, False),
        "knn_cosine": _row(True, True, False, False, False),
        "standardize_ridge": _row(False, True, True, True, False),
        "whiten_knn_euclidean": _row(True, True, True, True, True),
        "whiten_ridge": _row(True, True, True, True, True),
    }
)


@dataclass(frozen=True)
class AuditContext:
    """Quantities of the original train features that fix the protocols' hyperparameters."""

    n_train: int
    n_features: int
    gram_scale: float  # ||X_train||_F^2 / d: the mean eigenvalue of H^T H
    logistic_tol: float = LOGISTIC_TOL  # gradient tolerance of the logistic rows


def _logistic_no_bias(context: AuditContext) -> LogisticRegression:
    # LogisticProbe always fits a bias; sklearn's lbfgs minimises the same objective,
    # C * sum CE + 0.5 ||W||^2, without one.
    return LogisticRegression(
        C=1.0 / context.gram_scale, fit_intercept=False, tol=context.logistic_tol, max_iter=LOGISTIC_MAX_ITER
    )


#: Default protocols: name -> (description, factory(context) -> unfitted estimator).
AUDIT_PROTOCOLS: Mapping[str, tuple[str, Callable[[AuditContext], Any]]] = MappingProxyType(
    {
        "least_squares_bias": (
            "least squares with bias, lambda = 0",
            lambda c: RidgeProbe(alpha=0.0, fit_intercept=True),
        ),
        "ridge_no_bias": (
            "ridge without bias, lambda = ||X||_F^2 / d",
            lambda c: RidgeProbe(alpha=c.gram_scale, fit_intercept=False),
        ),
        "ridge_bias": (
            "ridge with unpenalised bias, lambda = ||X||_F^2 / d",
            lambda c: RidgeProbe(alpha=c.gram_scale, fit_intercept=True),
        ),
        "logistic_no_bias": (
            "L2 multinomial logistic without bias, C = d / ||X||_F^2 (sklearn lbfgs)",
            _logistic_no_bias,
        ),
        "logistic_bias": (
            "L2 multinomial logistic with unpenalised bias, C = d / ||X||_F^2 (LogisticProbe)",
            lambda c: LogisticProbe(C=1.0 / c.gram_scale, tol=c.logistic_tol, max_iter=LOGISTIC_MAX_ITER),
        ),
        "knn_euclidean": (
            "Euclidean 5-NN, uniform vote",
            lambda c: KNNClassifier(n_neighbors=5, metric="euclidean", weights="uniform"),
        ),
        "knn_cosine": (
            "cosine 20-NN, exp(s / 0.07) weights",
            lambda c: KNNClassifier(n_neighbors=20, metric="cosine", weights="exp", temperature=0.07),
        ),
        "standardize_ridge": (
            "standardize, then ridge with bias, lambda = n_train",
            lambda c: make_pipeline(Standardize(), RidgeProbe(alpha=float(c.n_train), fit_intercept=True)),
        ),
        "whiten_knn_euclidean": (
            "ZCA whiten, then Euclidean 5-NN",
            lambda c: make_pipeline(
                Whiten(), KNNClassifier(n_neighbors=5, metric="euclidean", weights="uniform")
            ),
        ),
        "whiten_ridge": (
            "ZCA whiten, then ridge with bias, lambda = n_train",
            lambda c: make_pipeline(Whiten(), RidgeProbe(alpha=float(c.n_train), fit_intercept=True)),
        ),
    }
)
# Protocols whose invariance needs a unique least-squares fit or an invertible covariance.
_FULL_RANK = ("least_squares_bias", "whiten_knn_euclidean", "whiten_ridge")


@dataclass(frozen=True)
class FeatureMap:
    """x -> x @ matrix + offset, applied to train and test alike."""

    name: str
    matrix: np.ndarray
    offset: np.ndarray

    def apply(self, X: np.ndarray) -> np.ndarray:
        """The mapped features (float64)."""
        return np.asarray(X, dtype=np.float64) @ self.matrix + self.offset


def _orthogonal(d: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))  # Haar-distributed: fix the signs of R's diagonal


def invariance_maps(n_features: int, seed: int = 0, data_scale: float = 1.0) -> dict[str, FeatureMap]:
    """The five maps of the audit for ``n_features`` features (see the module doc)."""
    d = int(n_features)
    rng = np.random.default_rng(seed)
    zero = np.zeros(d)
    rotation = _orthogonal(d, rng)
    shift = TRANSLATION_SCALE * data_scale * rng.standard_normal(d)
    per_feature = 10.0 ** rng.uniform(-PER_FEATURE_LOG10_RANGE, PER_FEATURE_LOG10_RANGE, d)
    u, v = _orthogonal(d, rng), _orthogonal(d, rng)
    dense = (u * 10.0 ** rng.uniform(-AFFINE_LOG10_RANGE, AFFINE_LOG10_RANGE, d)) @ v.T
    affine_shift = TRANSLATION_SCALE * data_scale * rng.standard_normal(d)
    maps = [
        FeatureMap("rotation", rotation, zero),
        FeatureMap("isotropic_scale", ISOTROPIC_SCALE * np.eye(d), zero),
        FeatureMap("translation", np.eye(d), shift),
        FeatureMap("per_feature_scale", np.diag(per_feature), zero),
        FeatureMap("affine", dense, affine_shift),
    ]
    return {m.name: m for m in maps}


@dataclass(frozen=True)
class InvarianceRecord:
    """One (protocol, map) cell: how many test predictions the map changed."""

    protocol: str
    map: str
    expected_invariant: bool | None
    n_changed: int
    n_test: int
    fraction_changed: float
    accuracy_before: float
    accuracy_after: float

    @property
    def consistent(self) -> bool:
        """False only for a cell expected invariant ("yes") whose predictions changed."""
        return not (self.expected_invariant is True and self.n_changed > 0)


@dataclass(frozen=True)
class InvarianceAudit:
    """All cells of the audit, protocol-major in the order run."""

    records: tuple[InvarianceRecord, ...]
    protocols: tuple[str, ...]
    maps: tuple[str, ...]
    seed: int

    def to_records(self) -> list[dict[str, Any]]:
        """Flat dictionaries, one per cell, with ``consistent`` included."""
        return [{**asdict(r), "consistent": r.consistent} for r in self.records]

    def observed(self) -> dict[str, dict[str, bool]]:
        """observed[protocol][map]: True where no test prediction changed."""
        out: dict[str, dict[str, bool]] = {}
        for r in self.records:
            out.setdefault(r.protocol, {})[r.map] = r.n_changed == 0
        return out

    def violations(self) -> list[InvarianceRecord]:
        """Cells expected invariant whose predictions changed."""
        return [r for r in self.records if not r.consistent]


def _resolve_protocols(
    protocols: Sequence[str] | Mapping[str, Callable[[AuditContext], Any]] | None,
) -> dict[str, Callable[[AuditContext], Any]]:
    if protocols is None:
        return {name: factory for name, (_, factory) in AUDIT_PROTOCOLS.items()}
    if isinstance(protocols, Mapping):
        bad = [name for name, f in protocols.items() if not callable(f)]
        if bad:
            raise DataValidationError(
                "custom protocols must map a name to a callable(AuditContext) -> estimator; "
                f"not callable: {bad}"
            )
        return dict(protocols)
    if isinstance(protocols, str):
        protocols = [protocols]
    out = {}
    for name in protocols:
        if name not in AUDIT_PROTOCOLS:
            raise unknown_name("invariance-audit protocol", name, AUDIT_PROTOCOLS)
        out[name] = AUDIT_PROTOCOLS[name][1]
    if not out:
        raise DataValidationError("protocols is empty: give at least one protocol name")
    return out


def _resolve_maps(maps: Sequence[str] | None) -> tuple[str, ...]:
    if maps is None:
        return MAPS
    if isinstance(maps, str):
        maps = [maps]
    for m in maps:
        if m not in MAPS:
            raise unknown_name("invariance-audit map", m, MAPS)
    if not maps:
        raise DataValidationError(f"maps is empty: give at least one of {list(MAPS)}")
    return tuple(dict.fromkeys(maps))


def invariance_audit(
    X_train: Any,
    y_train: Any,
    X_test: Any,
    y_test: Any,
    protocols: Sequence[str] | Mapping[str, Callable[[AuditContext], Any]] | None = None,
    seed: int = 0,
    maps: Sequence[str] | None = None,
    logistic_tol: float = LOGISTIC_TOL,
) -> InvarianceAudit:
    """Refit each protocol on every mapped copy of the features; count changed test predictions.

    Parameters
    ----------
    X_train, X_test : array-like of shape (n, d)
    y_train, y_test : array-like of shape (n,)
        Integer class labels.
    protocols : sequence of str, mapping or None
        Names of ``AUDIT_PROTOCOLS`` (default: all), or a mapping name ->
        factory(AuditContext) -> unfitted estimator for custom ones (their expected
        invariance is taken from ``EXPECTED_INVARIANCE`` when the name is there, else
        None).
    seed : int
        Draws the maps.
    maps : sequence of str or None
        A subset of ``MAPS`` (default: all).
    logistic_tol : float
        Gradient tolerance of the iterative (logistic) rows; their "yes" cells hold up to
        it (a test point within that margin of a tie may flip).

    Returns
    -------
    InvarianceAudit
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataValidationError(f"seed must be an integer >= 0, got {seed!r}")
    X_tr, y_tr, X_te = check_train_test(X_train, y_train, X_test)
    y_te = check_class_indices(y_test, n_samples=X_te.shape[0], name="y_test")
    chosen = _resolve_protocols(protocols)
    map_names = _resolve_maps(maps)
    X_tr = X_tr.astype(np.float64, copy=False)
    X_te = X_te.astype(np.float64, copy=False)
    n, d = X_tr.shape
    full_rank = [p for p in chosen if p in _FULL_RANK]
    if full_rank and n <= d + 1:
        raise DataValidationError(
            f"protocols {full_rank} need more train samples than features + 1 to be defined "
            f"uniquely (a unique least-squares fit, an invertible covariance); got {n} samples "
            f"and {d} features. Use at least {d + 2} train samples or leave these protocols out"
        )
    gram_scale = float(np.einsum("ij,ij->", X_tr, X_tr) / d)
    if gram_scale == 0.0:
        raise DataValidationError("X_train is all zeros: nothing to audit")
    context = AuditContext(n_train=n, n_features=d, gram_scale=gram_scale, logistic_tol=logistic_tol)
    feature_maps = invariance_maps(d, seed=int(seed), data_scale=float(X_tr.std()))

    records = []
    for name, factory in chosen.items():
        before = factory(context).fit(X_tr, y_tr).predict(X_te)
        acc_before = float(np.mean(before == y_te))
        expected = EXPECTED_INVARIANCE.get(name)
        for map_name in map_names:
            g = feature_maps[map_name]
            after = factory(context).fit(g.apply(X_tr), y_tr).predict(g.apply(X_te))
            changed = int(np.sum(after != before))
            records.append(
                InvarianceRecord(
                    protocol=name,
                    map=map_name,
                    expected_invariant=None if expected is None else bool(expected[map_name]),
                    n_changed=changed,
                    n_test=int(y_te.size),
                    fraction_changed=changed / y_te.size,
                    accuracy_before=acc_before,
                    accuracy_after=float(np.mean(after == y_te)),
                )
            )
    return InvarianceAudit(records=tuple(records), protocols=tuple(chosen), maps=map_names, seed=int(seed))
