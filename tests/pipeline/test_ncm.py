"""The nearest-class-mean probe: scikit-learn's NearestCentroid and numpy class means, streaming, transforms."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics.pairwise import cosine_similarity
from sklearn.neighbors import NearestCentroid

from pipeline.errors import ConfigError
from pipeline.protocols import get_protocol
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.neighbours.ncm import class_means, ncm_predict
from pipeline.protocols.registry import EvalData

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _data(n=300, m=80, d=8, k=4, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, d)) * 1.5
    y, yt = rng.integers(0, k, n), rng.integers(0, k, m)
    return centres[y] + rng.standard_normal((n, d)), y, centres[yt] + rng.standard_normal((m, d)), yt


def _numpy_means(X, y, k):
    return np.stack([X[y == c].mean(axis=0) for c in range(k)])


def test_euclidean_means_and_predictions_match_nearest_centroid():
    X, y, Xt, _ = _data()
    ref = NearestCentroid().fit(X, y)
    means = class_means(FeatureRows.of(X), y, 4, "euclidean")
    np.testing.assert_allclose(means.numpy(), ref.centroids_, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ncm_predict(FeatureRows.of(Xt), means, "euclidean"), ref.predict(Xt))


def test_cosine_is_the_largest_cosine_to_the_mean_of_normalised_rows():
    X, y, Xt, _ = _data(seed=1)
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    expected = _numpy_means(unit, y, 4)
    means = class_means(FeatureRows.of(X), y, 4, "cosine")
    np.testing.assert_allclose(means.numpy(), expected, rtol=1e-12, atol=1e-12)
    pred = ncm_predict(FeatureRows.of(Xt), means, "cosine")
    np.testing.assert_array_equal(pred, np.argmax(cosine_similarity(Xt, expected), axis=1))


def test_the_protocol_matches_nearest_centroid_after_its_transform():
    X, y, Xt, yt = _data(seed=2)
    data = EvalData(y, Xt.astype(np.float32), yt, 4, X_train=X.astype(np.float32))
    result = get_protocol("ncm")(data, {"metric": "euclidean", "transform": "standardize"})
    mean, std = X.astype(np.float32).astype(np.float64).mean(0), X.astype(np.float32).astype(np.float64).std(0)
    ref = NearestCentroid().fit((X.astype(np.float32) - mean) / std, y)
    expected = ref.predict((Xt.astype(np.float32) - mean) / std)
    assert result.metrics["top1"] == pytest.approx(np.mean(expected == yt))
    assert result.diagnostics["n_means"] == 4 and result.evidence is not None


def test_streamed_train_blocks_give_the_in_memory_result():
    X, y, Xt, yt = _data(n=500, seed=3)
    blocks = lambda: ((X[i:i + 64], i) for i in reversed(range(0, len(X), 64)))  # noqa: E731 - any order
    ncm = get_protocol("ncm")
    for metric in ("cosine", "euclidean"):
        whole = ncm(EvalData(y, Xt, yt, 4, X_train=X), {"metric": metric, "transform": "l2"})
        streamed = ncm(EvalData(y, Xt, yt, 4, train_blocks=blocks), {"metric": metric, "transform": "l2"})
        assert streamed.metrics == whole.metrics


def test_a_class_without_train_rows_is_never_predicted():
    X, y, Xt, yt = _data(seed=4)
    keep = y != 2
    means = class_means(FeatureRows.of(X[keep]), y[keep], 4, "euclidean")
    assert np.isnan(means[2].numpy()).all()
    pred = ncm_predict(FeatureRows.of(Xt), means, "euclidean")
    np.testing.assert_array_equal(pred, NearestCentroid().fit(X[keep], y[keep]).predict(Xt))
    assert 2 not in pred


def test_equal_distances_go_to_the_smallest_class():
    X = np.array([[1.0, 0.0], [-1.0, 0.0]])
    means = class_means(FeatureRows.of(X), np.array([1, 0]), 2, "euclidean")
    np.testing.assert_array_equal(ncm_predict(FeatureRows.of(np.array([[0.0, 1.0]])), means, "euclidean"), [0])


def test_an_unknown_metric_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="cosine"):
        get_protocol("ncm").resolve({"metric": "manhattan"})
