"""Invariance audit: which coordinate changes each protocol ignores."""

from __future__ import annotations


import numpy as np
import pytest

from pipeline.errors import DataValidationError, UnknownNameError
from pipeline.protocols.audits.invariance import (
    EXPECTED_INVARIANCE,
    MAPS,
    AUDIT_PROTOCOLS,
    InvarianceAudit,
    invariance_audit,
    invariance_maps,
)
from pipeline.protocols.neighbours.knn import KNNClassifier


def _data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Overlapping Gaussian clusters off the origin: well conditioned, errors to change."""
    rng = np.random.default_rng(seed)
    d, k = 6, 3
    centres = rng.normal(0, 1.0, (k, d))

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, k, n)
        return centres[y] + rng.normal(0, 1.0, (n, d)) + 0.5, y

    X_tr, y_tr = make(150)
    X_te, y_te = make(100)
    return X_tr, y_tr, X_te, y_te


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=[0, 1])
def audit(request: pytest.FixtureRequest) -> InvarianceAudit:
    return invariance_audit(*_data(request.param), seed=request.param)


def test_expected_table_matches_protocols_doc() -> None:
    assert set(EXPECTED_INVARIANCE) == set(AUDIT_PROTOCOLS)
    for row in EXPECTED_INVARIANCE.values():
        assert tuple(row) == MAPS
    yes = {p: [m for m in MAPS if EXPECTED_INVARIANCE[p][m]] for p in EXPECTED_INVARIANCE}
    assert yes["least_squares_bias"] == list(MAPS)
    assert yes["ridge_no_bias"] == yes["logistic_no_bias"] == ["rotation"]
    assert yes["ridge_bias"] == yes["logistic_bias"] == ["rotation", "translation"]
    assert yes["knn_euclidean"] == ["rotation", "isotropic_scale", "translation"]
    assert yes["knn_cosine"] == ["rotation", "isotropic_scale"]
    assert yes["standardize_ridge"] == ["isotropic_scale", "translation", "per_feature_scale"]
    assert yes["whiten_knn_euclidean"] == yes["whiten_ridge"] == list(MAPS)
    with pytest.raises(TypeError):
        EXPECTED_INVARIANCE["ridge_bias"]["rotation"] = False  # read-only


def test_every_yes_cell_changes_nothing(audit: InvarianceAudit) -> None:
    assert len(audit.records) == len(AUDIT_PROTOCOLS) * len(MAPS)
    yes = [r for r in audit.records if r.expected_invariant]
    assert len(yes) == sum(v for row in EXPECTED_INVARIANCE.values() for v in row.values())
    for r in yes:
        assert r.n_changed == 0, r
        assert r.accuracy_after == r.accuracy_before
    assert audit.violations() == []
    assert all(row["consistent"] for row in audit.to_records())


def test_no_cells_mostly_change_predictions(audit: InvarianceAudit) -> None:
    no = [r for r in audit.records if r.expected_invariant is False]
    changed = [r for r in no if r.n_changed > 0]
    assert len(changed) >= 0.8 * len(no)
    # the dense map breaks every protocol without whitening or an unpenalised LS fit
    for r in no:
        if r.map == "affine":
            assert r.n_changed > 0, r
    observed = audit.observed()
    assert observed["ridge_no_bias"]["translation"] is False
    assert observed["whiten_ridge"]["affine"] is True


def test_records_are_consistent(audit: InvarianceAudit) -> None:
    for row in audit.to_records():
        assert row["fraction_changed"] == pytest.approx(row["n_changed"] / row["n_test"])
        assert 0.0 <= row["accuracy_before"] <= 1.0 and 0.0 <= row["accuracy_after"] <= 1.0
    assert audit.protocols == tuple(AUDIT_PROTOCOLS) and audit.maps == MAPS


def test_maps_are_what_they_claim() -> None:
    d = 7
    maps = invariance_maps(d, seed=3, data_scale=2.0)
    assert tuple(maps) == MAPS
    q = maps["rotation"].matrix
    np.testing.assert_allclose(q.T @ q, np.eye(d), atol=1e-12)
    np.testing.assert_array_equal(maps["isotropic_scale"].matrix, 10 * np.eye(d))
    t = maps["translation"]
    np.testing.assert_array_equal(t.matrix, np.eye(d))
    assert np.abs(t.offset).max() > 0
    scales = np.diag(maps["per_feature_scale"].matrix)
    assert ((scales >= 1e-2) & (scales <= 1e2)).all()
    np.testing.assert_array_equal(maps["per_feature_scale"].matrix, np.diag(scales))
    sv = np.linalg.svd(maps["affine"].matrix, compute_uv=False)
    assert ((sv >= 0.1 - 1e-12) & (sv <= 10 + 1e-12)).all()
    X = np.arange(14.0).reshape(2, 7)
    np.testing.assert_allclose(maps["affine"].apply(X), X @ maps["affine"].matrix + maps["affine"].offset)
    again = invariance_maps(d, seed=3, data_scale=2.0)
    np.testing.assert_array_equal(again["affine"].matrix, maps["affine"].matrix)


def test_subsets_and_custom_protocols() -> None:
    X_tr, y_tr, X_te, y_te = _data(2)
    small = invariance_audit(X_tr, y_tr, X_te, y_te, protocols=["knn_euclidean"], maps=["rotation", "affine"])
    cells = [(r.protocol, r.map) for r in small.records]
    assert cells == [("knn_euclidean", "rotation"), ("knn_euclidean", "affine")]
    custom = invariance_audit(
        X_tr, y_tr, X_te, y_te, protocols={"knn_3": lambda c: KNNClassifier(3, "euclidean", "uniform")},
        maps=["isotropic_scale"],
    )
    (rec,) = custom.records
    assert rec.expected_invariant is None and rec.consistent and rec.n_changed == 0


def test_bad_input() -> None:
    X_tr, y_tr, X_te, y_te = _data(0)
    with pytest.raises(UnknownNameError, match="ridge_bias"):
        invariance_audit(X_tr, y_tr, X_te, y_te, protocols=["ridge_bais"])
    with pytest.raises(UnknownNameError, match="rotation"):
        invariance_audit(X_tr, y_tr, X_te, y_te, maps=["rotate"])
    with pytest.raises(DataValidationError, match="150 samples and 200 features"):
        wide = np.random.default_rng(0).normal(size=(150, 200))
        invariance_audit(wide, y_tr, wide[:10], y_te[:10], protocols=["whiten_ridge"])
    with pytest.raises(DataValidationError, match="X_test has 5 features"):
        invariance_audit(X_tr, y_tr, X_te[:, :5], y_te)
    with pytest.raises(DataValidationError, match="y_test"):
        invariance_audit(X_tr, y_tr, X_te, y_te[:-1])
