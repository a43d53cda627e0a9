"""KNNClassifier and the blocked top-k core: sklearn parity, ties, streaming, errors."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.neighbors import KNeighborsClassifier

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.neighbours.knn import (
    KNNClassifier,
    knn_class_weights,
    knn_predict_from_topk,
    topk_blocks,
)
from pipeline.protocols.transforms.transformers import Whiten


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _data(n=300, m=80, d=8, k=4, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, d)) * 1.5
    y = rng.integers(0, k, n)
    yt = rng.integers(0, k, m)
    return centres[y] + rng.standard_normal((n, d)), y, centres[yt] + rng.standard_normal((m, d))


def _blocks(X, size):
    return ((X[i : i + size], i) for i in range(0, X.shape[0], size))


@pytest.mark.parametrize("k", [1, 5, 6, 20])
def test_euclidean_uniform_matches_sklearn(k):
    X, y, Xt = _data()
    ours = KNNClassifier(k, metric="euclidean", weights="uniform").fit(X, y)
    ref = KNeighborsClassifier(k, algorithm="brute").fit(X, y)
    np.testing.assert_array_equal(ours.predict(Xt), ref.predict(Xt))
    dist, idx = ours.kneighbors(Xt)
    ref_dist, ref_idx = ref.kneighbors(Xt)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-9)


def test_duplicates_and_vote_ties():
    # Every train point twice (same label): equal distances at every rank. With k even,
    # class votes tie often; both pick the smallest class index.
    X, y, Xt = _data(n=60, m=200, k=3, seed=1)
    X2, y2 = np.vstack([X, X]), np.concatenate([y, y])
    for k, data in [(2, (X, y)), (2, (X2, y2)), (4, (X2, y2))]:
        ours = KNNClassifier(k, metric="euclidean", weights="uniform").fit(*data)
        ref = KNeighborsClassifier(k, algorithm="brute").fit(*data)
        np.testing.assert_array_equal(ours.predict(Xt), ref.predict(Xt))
        votes = ours.decision_function(Xt)
        tied = (votes == votes.max(axis=1, keepdims=True)).sum(axis=1) > 1
        if k == 2 and data[0] is X2:
            assert not tied.any()  # both neighbours are copies of one point
        else:
            assert tied.sum() > 10  # 1-1 or 2-2 votes: the smallest class wins
            np.testing.assert_array_equal(ours.predict(Xt)[tied], np.argmax(votes[tied], axis=1))
    # equal distances are taken in train order: the copy at i comes before i + 60
    _, idx = topk_blocks(Xt, [(X2, 0)], 4, "euclidean")
    np.testing.assert_array_equal(idx[:, 0] + 60, idx[:, 1])
    np.testing.assert_array_equal(idx[:, 2] + 60, idx[:, 3])


def test_ties_at_block_boundary_keep_train_order():
    X = np.ones((10, 3))  # all equidistant from any query
    q = np.array([[1.0, 2.0, 3.0]])
    for size in (1, 3, 4, 10):
        for metric in ("cosine", "euclidean"):
            _, idx = topk_blocks(q, _blocks(X, size), 4, metric)
            np.testing.assert_array_equal(idx, [[0, 1, 2, 3]])


def test_weighted_cosine_matches_direct_formula():
    X, y, Xt = _data(n=250, m=60, d=16, k=5)
    k, tau = 20, 0.07
    ours = KNNClassifier(k, temperature=tau).fit(X, y)
    # the formula of Wu et al. / DINO, written out
    S = (Xt / np.linalg.norm(Xt, axis=1, keepdims=True)) @ (X / np.linalg.norm(X, axis=1, keepdims=True)).T
    idx = np.argsort(-S, axis=1, kind="stable")[:, :k]
    s = np.take_along_axis(S, idx, 1)
    w = np.zeros((Xt.shape[0], 5))
    for c in range(5):
        w[:, c] = (np.exp(s / tau) * (y[idx] == c)).sum(axis=1)
    np.testing.assert_allclose(ours.decision_function(Xt), w, rtol=1e-10)
    np.testing.assert_array_equal(ours.predict(Xt), np.argmax(w, axis=1))
    scores, nn = ours.kneighbors(Xt)
    np.testing.assert_array_equal(nn, idx)
    np.testing.assert_allclose(scores, s, rtol=1e-12)


def test_cosine_uniform_is_majority_vote_and_matches_sklearn():
    X, y, Xt = _data(d=10)
    ours = KNNClassifier(7, metric="cosine", weights="uniform").fit(X, y)
    ref = KNeighborsClassifier(7, metric="cosine", algorithm="brute").fit(X, y)
    np.testing.assert_array_equal(ours.predict(Xt), ref.predict(Xt))


def test_whiten_then_euclidean_is_mahalanobis():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((5, 5))
    X, y, Xt = _data(n=200, m=100, d=5)
    X, Xt = X @ A, Xt @ A  # correlated features
    w = Whiten().fit(X)
    ours = KNNClassifier(5, metric="euclidean", weights="uniform").fit(w.transform(X), y)
    VI = np.linalg.inv(np.cov(X, rowvar=False))
    ref = KNeighborsClassifier(5, algorithm="brute", metric="mahalanobis", metric_params={"VI": VI})
    ref.fit(X, y)
    np.testing.assert_array_equal(ours.predict(w.transform(Xt)), ref.predict(Xt))
    np.testing.assert_array_equal(ours.kneighbors(w.transform(Xt))[1], ref.kneighbors(Xt)[1])


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_blocked_equals_one_block(metric):
    X, _, Xt = _data(n=257)
    full_s, full_i = topk_blocks(Xt, [(X, 0)], 20, metric)
    for size in (1, 7, 19, 20, 64, 256, 1000):
        s, i = topk_blocks(Xt, _blocks(X, size), 20, metric)
        np.testing.assert_array_equal(i, full_i)
        # the BLAS may round one dot product differently for another block shape (1 ulp)
        np.testing.assert_allclose(s, full_s, rtol=1e-13)
    # blocks may arrive in any order
    s, i = topk_blocks(Xt, reversed(list(_blocks(X, 50))), 20, metric)
    np.testing.assert_array_equal(i, full_i)


@pytest.mark.parametrize("block_size", [1, 13, 300, 10_000])
def test_classifier_block_size_does_not_change_predictions(block_size):
    X, y, Xt = _data()
    base = KNNClassifier(10).fit(X, y)
    other = KNNClassifier(10, block_size=block_size).fit(X, y)
    np.testing.assert_array_equal(other.predict(Xt), base.predict(Xt))
    np.testing.assert_allclose(other.decision_function(Xt), base.decision_function(Xt), rtol=1e-12)


def test_float32_features_stay_float32_and_agree():
    X, y, Xt = _data(d=32)
    s32, i32 = topk_blocks(Xt.astype(np.float32), [(X.astype(np.float32), 0)], 10, "cosine")
    s64, i64 = topk_blocks(Xt, [(X, 0)], 10, "cosine")
    assert s32.dtype == np.float32
    np.testing.assert_allclose(s32, s64, atol=1e-5)


def test_predict_from_topk_matches_estimator_and_labels_are_mapped():
    X, y, Xt = _data()
    clf = KNNClassifier(15).fit(X, y * 10 + 1)  # labels 1, 11, 21, 31
    scores, idx = topk_blocks(Xt, [(X, 0)], 15, "cosine")
    pred = knn_predict_from_topk(scores, idx, y, 4, "exp", 0.07)
    np.testing.assert_array_equal(clf.predict(Xt), pred * 10 + 1)
    w = knn_class_weights(scores, idx, y, 4, "uniform")
    np.testing.assert_array_equal(w.sum(axis=1), 15)


def test_binary_decision_is_weight_difference():
    X, y, Xt = _data(k=2)
    clf = KNNClassifier(9).fit(X, y)
    dec = clf.decision_function(Xt)
    assert dec.shape == (Xt.shape[0],)
    np.testing.assert_array_equal(clf.predict(Xt), (dec > 0).astype(int))


def test_bad_input_errors():
    X, y, Xt = _data(n=30)
    with pytest.raises(ValueError, match="n_neighbors=31 is larger than the 30 train samples"):
        KNNClassifier(31).fit(X, y)
    with pytest.raises(ConfigError, match="weights='exp' is not defined for metric='euclidean'"):
        KNNClassifier(metric="euclidean").fit(X, y)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        knn_class_weights(np.ones((1, 2)), np.zeros((1, 2), int), y, 4, "exp", 0.0)
    with pytest.raises(ValueError, match="overflows float64 for temperature=0.001"):
        knn_class_weights(np.ones((1, 2)), np.zeros((1, 2), int), y, 4, "exp", 0.001)
    X_bad = X.copy()
    X_bad[[2, 5, 9], 0] = np.nan
    with pytest.raises(DataValidationError, match=r"3 NaN and 0 inf .*\(2, 0\), \(5, 0\), \(9, 0\)"):
        KNNClassifier(5).fit(X_bad, y)
    with pytest.raises(ValueError, match="29 labels, but X has 30 samples"):
        KNNClassifier(5).fit(X, y[:-1])
    with pytest.raises(ValueError, match="1 class"):
        KNNClassifier(5).fit(X, np.full(30, 2))
    with pytest.raises(ValueError, match="Unknown label type"):
        KNNClassifier(5).fit(X, y + 0.25)
    X_zero = X.copy()
    X_zero[4] = 0.0
    with pytest.raises(ValueError, match="1 all-zero row.*rows 4"):
        KNNClassifier(5).fit(X_zero, y)
    clf = KNNClassifier(5).fit(X, y)
    with pytest.raises(ValueError, match="X has 7 features, but KNNClassifier is expecting 8 features"):
        clf.predict(Xt[:, :7])
    with pytest.raises(ValueError, match="inf"):
        clf.predict(np.full((2, 8), np.inf))
    with pytest.raises(DataValidationError, match="k=40 neighbours requested, but the blocks held only 30"):
        topk_blocks(Xt, _blocks(X, 8), 40, "cosine")
    with pytest.raises(DataValidationError, match="train block at row 8 has shape"):
        topk_blocks(Xt, [(X[:8], 0), (X[8:, :5], 8)], 3, "cosine")
    with pytest.raises(DataValidationError, match=r"train features contains NaN or infinity: 1 NaN .*\(12, 0\)"):
        topk_blocks(Xt, [(X[:10], 0), (np.vstack([X[10:12], X_bad[9:10]]), 10)], 3, "euclidean")
    with pytest.raises(ValueError, match="Unknown metric 'manhattan'. Valid choices: cosine, euclidean"):
        topk_blocks(Xt, [(X, 0)], 3, "manhattan")


def test_string_labels_and_explicit_cpu_device():
    X, y, Xt = _data()
    names = np.array(["a", "b", "c", "d"])[y]
    ours = KNNClassifier(7, metric="euclidean", weights="uniform", device="cpu").fit(X, names)
    ref = KNeighborsClassifier(7, algorithm="brute").fit(X, names)
    np.testing.assert_array_equal(ours.classes_, ref.classes_)
    np.testing.assert_array_equal(ours.predict(Xt), ref.predict(Xt))


def test_many_query_chunks_and_float16_blocks(monkeypatch):
    from pipeline.protocols.neighbours import knn as knn_module

    X, y, Xt = _data(n=300, m=90)
    full_s, full_i = topk_blocks(Xt, [(X, 0)], 9, "cosine")
    monkeypatch.setitem(knn_module._SCORE_BUDGET, "cpu", 64)  # queries scored a few at a time
    s, i = topk_blocks(Xt, _blocks(X, 50), 9, "cosine")
    np.testing.assert_array_equal(i, full_i)
    np.testing.assert_allclose(s, full_s, rtol=1e-13)
    s16, i16 = topk_blocks(Xt.astype(np.float16), _blocks(X.astype(np.float16), 50), 9, "cosine")
    assert s16.dtype == np.float32
    ref16 = topk_blocks(Xt.astype(np.float16).astype(np.float32), [(X.astype(np.float16).astype(np.float32), 0)],
                        9, "cosine")
    np.testing.assert_array_equal(i16, ref16[1])
