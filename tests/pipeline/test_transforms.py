"""Preprocessing transforms: definitions, fitted on train only, invariances, errors."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.preprocessing import StandardScaler

from pipeline.errors import DataValidationError, UnknownNameError
from pipeline.protocols.transforms.transformers import (
    TRANSFORMS,
    Identity,
    L2Normalize,
    Standardize,
    Whiten,
    make_transform,
)


def _features(n=200, d=6, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((d, d))
    return rng.standard_normal((n, d)) @ A * 4.0 + rng.standard_normal(d) * 10


def test_l2_normalize_rows():
    X = _features()
    Z = L2Normalize().fit(X).transform(X)
    np.testing.assert_allclose(np.linalg.norm(Z, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(Z * np.linalg.norm(X, axis=1, keepdims=True), X, rtol=1e-12)
    assert L2Normalize().fit_transform(X.astype(np.float32)).dtype == np.float32


def test_l2_normalize_refuses_zero_rows():
    X = _features(n=10)
    X[[3, 7]] = 0.0
    with pytest.raises(DataValidationError, match=r"2 all-zero row\(s\) \(rows 3, 7\)"):
        L2Normalize().fit(X).transform(X)


def test_standardize_matches_sklearn_and_uses_train_statistics():
    X, X_test = _features(), _features(n=50, seed=1)
    ours = Standardize().fit(X)
    ref = StandardScaler().fit(X)
    np.testing.assert_allclose(ours.transform(X_test), ref.transform(X_test), rtol=1e-12, atol=1e-12)
    Z = ours.transform(X)
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Z.std(axis=0), 1.0, rtol=1e-12)


def test_standardize_constant_feature_has_unit_scale():
    X = _features()
    X[:, 2] = 5.0
    st = Standardize().fit(X)
    assert st.scale_[2] == 1.0
    np.testing.assert_array_equal(st.transform(X)[:, 2], 0.0)
    assert st.transform(np.full((1, 6), 7.0))[0, 2] == 2.0


def test_whiten_is_zca():
    X = _features()
    w = Whiten().fit(X)
    Z = w.transform(X)
    np.testing.assert_allclose(np.cov(Z, rowvar=False, bias=True), np.eye(6), atol=1e-10)
    np.testing.assert_allclose(w.whitening_, w.whitening_.T, atol=1e-12)  # ZCA: symmetric
    cov = np.cov(X, rowvar=False, bias=True)
    np.testing.assert_allclose(w.whitening_ @ cov @ w.whitening_, np.eye(6), atol=1e-10)
    # ZCA is the whitening closest to the identity map: positive definite matrix
    assert np.linalg.eigvalsh(w.whitening_).min() > 0


def test_whitened_distances_ignore_invertible_affine_maps():
    X, X_test = _features(), _features(n=30, seed=1)
    rng = np.random.default_rng(5)
    A = rng.standard_normal((6, 6)) + 2 * np.eye(6)
    b = rng.standard_normal(6) * 100
    Z = Whiten().fit(X).transform(X_test)
    Z_moved = Whiten().fit(X @ A + b).transform(X_test @ A + b)
    D = np.linalg.norm(Z[:, None] - Z[None], axis=2)
    D_moved = np.linalg.norm(Z_moved[:, None] - Z_moved[None], axis=2)
    np.testing.assert_allclose(D_moved, D, rtol=1e-8)


def test_whiten_rank_deficient_needs_eps():
    X = _features(n=4, d=6)  # 4 samples: covariance rank 3
    with pytest.raises(DataValidationError, match=r"rank 3 of 6 features, from 4 samples.*eps"):
        Whiten().fit(X)
    Z = Whiten(eps=1e-3).fit(X).transform(X)
    assert np.isfinite(Z).all()
    # eps is relative to the mean variance: a global rescale changes nothing
    np.testing.assert_allclose(Whiten(eps=1e-3).fit(10 * X).transform(10 * X), Z, rtol=1e-9, atol=1e-9)


def test_transforms_check_inputs():
    X = _features()
    for transform in (L2Normalize(), Standardize(), Whiten()):
        transform.fit(X)
        with pytest.raises(ValueError, match="X has 5 features, but .* is expecting 6 features"):
            transform.transform(X[:, :5])
        bad = X[:3].copy()
        bad[1, 4] = np.nan
        with pytest.raises(DataValidationError, match=r"1 NaN .*\(1, 4\)"):
            transform.transform(bad)


def test_make_transform_registry():
    assert set(TRANSFORMS) == {"none", "l2", "standardize", "whiten"}
    X = _features()
    assert isinstance(make_transform("none"), Identity)
    np.testing.assert_array_equal(make_transform("none").fit_transform(X), X)
    assert isinstance(make_transform("l2"), L2Normalize)
    assert make_transform("whiten", eps=0.5).eps == 0.5
    assert make_transform("whiten") is not make_transform("whiten")
    listed = r"Unknown transform 'whitten'.*Did you mean: whiten.*Valid choices: l2, none, standardize, whiten"
    with pytest.raises(UnknownNameError, match=listed):
        make_transform("whitten")


@pytest.mark.parametrize("name", ["l2", "standardize", "whiten"])
def test_fitted_on_streamed_blocks_and_applied_per_block(name):
    import torch

    from pipeline.protocols.blocks import FeatureRows

    X, X_test = _features(), _features(n=50, seed=1)
    whole = make_transform(name).fit(X)
    blocks = lambda: ((X[i:i + 33], i) for i in range(0, len(X), 33))  # noqa: E731
    streamed = make_transform(name).fit_rows(FeatureRows.of(blocks=blocks, n_rows=len(X), n_features=X.shape[1]))
    row_map = streamed.row_map()
    mapped = np.concatenate([row_map(b, s).numpy() for b, s in FeatureRows.of(X_test).blocks(dtype=torch.float64)])
    np.testing.assert_allclose(mapped, whole.transform(X_test), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["none", "l2", "standardize", "whiten"])
def test_apply_transform_fits_on_train_and_maps_every_rows_given(name):
    from pipeline.protocols.blocks import FeatureRows
    from pipeline.protocols.transforms import TRANSFORM_NAMES, apply_transform

    assert TRANSFORM_NAMES == tuple(TRANSFORMS)
    X, X_test = _features(), _features(n=50, seed=1)
    train, test = apply_transform(name, FeatureRows.of(X), FeatureRows.of(X), FeatureRows.of(X_test))
    fitted = make_transform(name).fit(X)
    np.testing.assert_array_equal(train.numpy(X.dtype), fitted.transform(X))
    np.testing.assert_array_equal(test.numpy(X.dtype), fitted.transform(X_test))
    assert (train.row_map is None) == (name == "none")  # the fitted map, for readers mapping their own blocks
