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


def _exact_neighbours(X, Xt, k):
    """Euclidean top-k of small-integer features (exact in float32 and float64): distance, then train index."""
    d2 = ((Xt[:, None, :].astype(np.int64) - X[None, :, :].astype(np.int64)) ** 2).sum(axis=2)
    order = np.lexsort((np.broadcast_to(np.arange(X.shape[0]), d2.shape), d2), axis=1)[:, :k]
    return np.sqrt(np.take_along_axis(d2, order, axis=1)), order


@pytest.mark.parametrize("numpy_path", [True, False], ids=["numpy", "torch-as-on-a-gpu"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 5, 20, 70])
def test_threshold_selection_keeps_exact_ties(monkeypatch, dtype, k, numpy_path):
    # Features in {0, 1, 2}: distances are exact and tie everywhere. Small buffers, tiles
    # and score chunks put every path to work: the dense first tile (k > groups), the
    # group-maximum bound, the running threshold, deferred merges, tiles narrower than a
    # group, blocks split across buffers and blocks out of order; on the CPU's numpy path
    # (packed float32 merges) and on the torch path a GPU takes.
    from pipeline.protocols.neighbours import knn as knn_module

    monkeypatch.setattr(knn_module, "_numpy_path", lambda device: numpy_path)
    monkeypatch.setitem(knn_module._BUFFER_ROWS, "cpu", 200)  # 3 tiles of 64 and one of 8
    monkeypatch.setitem(knn_module._TILE_ROWS, "cpu", 64)
    monkeypatch.setitem(knn_module._SCORE_BUDGET, "cpu", 64 * 16)  # 16 queries a chunk
    rng = np.random.default_rng(k)
    X = rng.integers(0, 3, (900, 6)).astype(dtype)
    Xt = rng.integers(0, 3, (40, 6)).astype(dtype)
    dist, order = _exact_neighbours(X, Xt, k)
    for size in (37, 200, 333, 900):
        for blocks in (list(_blocks(X, size)), list(_blocks(X, size))[::-1]):
            s, i = topk_blocks(Xt, blocks, k, "euclidean")
            np.testing.assert_array_equal(i, order)
            np.testing.assert_allclose(s, dist, atol=1e-6)  # ||q||^2 comes from a rounded norm


def test_threshold_selection_default_sizes_match_one_sort():
    # Several default buffers and tiles (8192 and 1024 rows), with every train row twice:
    # the copy with the smaller index comes first.
    rng = np.random.default_rng(7)
    X = rng.integers(0, 4, (9000, 5)).astype(np.float32)
    X[4500:] = X[:4500]
    Xt = rng.integers(0, 4, (30, 5)).astype(np.float32)
    dist, order = _exact_neighbours(X, Xt, 20)
    s, i = topk_blocks(Xt, _blocks(X, 2500), 20, "euclidean")
    np.testing.assert_array_equal(i, order)
    np.testing.assert_allclose(s, dist, atol=1e-5)


def test_cosine_exact_ties_keep_train_order_across_tiles(monkeypatch):
    # Rows with exactly four ones have norm 2: normalised entries are 0 or 0.5 and every
    # cosine is a multiple of 1/4, exact in any summation order, so ties are real ties.
    from pipeline.protocols.neighbours import knn as knn_module

    monkeypatch.setitem(knn_module._BUFFER_ROWS, "cpu", 96)
    monkeypatch.setitem(knn_module._TILE_ROWS, "cpu", 32)
    rng = np.random.default_rng(3)

    def four_ones(n):
        X = np.zeros((n, 16), np.float32)
        X[np.arange(n)[:, None], np.argsort(rng.random((n, 16)), axis=1)[:, :4]] = 1.0
        return X

    X, Xt = four_ones(500), four_ones(60)
    S = Xt @ X.T / 4
    order = np.lexsort((np.broadcast_to(np.arange(500), S.shape), -S), axis=1)[:, :25]
    for blocks in (_blocks(X, 41), [(X, 0)], reversed(list(_blocks(X, 100)))):
        s, i = topk_blocks(Xt, blocks, 25, "cosine")
        np.testing.assert_array_equal(i, order)
        np.testing.assert_array_equal(s, np.take_along_axis(S, order, axis=1))


def test_knn_protocol_scores_every_k_from_one_search(monkeypatch):
    from pipeline.protocols import EvalData, get_protocol
    from pipeline.protocols.neighbours import knn as knn_module

    X, y, Xt = _data(n=300, m=80, d=8)
    yt = KNNClassifier(5).fit(X, y).predict(Xt)  # labels a k-NN gets partly right
    yt[::3] = (yt[::3] + 1) % 4
    data = EvalData(y_train=y, X_test=Xt, y_test=yt, n_classes=4, X_train=X)
    proto = get_protocol("knn")
    searched = []
    real = knn_module.topk_blocks
    monkeypatch.setattr(knn_module, "topk_blocks", lambda *a, **kw: searched.append(a[2]) or real(*a, **kw))
    res = proto(data, {"n_neighbors": 20, "also_neighbors": [5, 50, 20]})
    assert searched == [51]  # one search, at the largest k (and one neighbour more, for ties at the cut)
    assert list(res.diagnostics["score_by_k"]) == ["5", "20", "50"]
    for k in (5, 20, 50):
        alone = proto(data, {"n_neighbors": k})
        assert res.diagnostics["score_by_k"][str(k)] == alone.metrics["score"]
        assert "score_by_k" not in alone.diagnostics
    assert res.metrics == proto(data, {"n_neighbors": 20}).metrics
    assert proto.result_settings(proto.resolve({})) == proto.result_settings(proto.resolve({"also_neighbors": []}))
    for bad in ([0], [2.5], "default", [True]):
        with pytest.raises(ConfigError, match="also_neighbors must be a list of integers >= 1"):
            proto.resolve({"also_neighbors": bad})
    with pytest.raises(DataValidationError, match="also_neighbors: k=301 is larger than the train set"):
        proto(data, {"also_neighbors": [301]})


def test_train_indices_beyond_32_bits(monkeypatch):
    # float32 pairs are packed with 32-bit indices on the CPU; a block whose rows reach
    # 2^32 moves the state to the plain form first, with the same neighbours
    from pipeline.protocols.neighbours import knn as knn_module

    monkeypatch.setitem(knn_module._BUFFER_ROWS, "cpu", 96)
    rng = np.random.default_rng(5)
    X = rng.integers(0, 3, (300, 6)).astype(np.float32)
    Xt = rng.integers(0, 3, (20, 6)).astype(np.float32)
    _, order = _exact_neighbours(X, Xt, 15)
    shift = 2**32 - 150  # the second half of the rows lies beyond 2^32 - 1
    _, i = topk_blocks(Xt, [(X[j:j + 100], shift + j) for j in range(0, 300, 100)], 15, "euclidean")
    np.testing.assert_array_equal(i, order + shift)


def test_predictions_decided_by_ties_within_rounding_are_counted_and_flagged():
    from pipeline.protocols import EvalData, get_protocol

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 6)).astype(np.float32)
    y = np.arange(40) % 2
    # each test row is a train row: its nearest neighbour is that row (similarity 1, decided)
    Xt, yt = X[:10].copy(), y[:10]
    data = EvalData(y_train=y, X_test=Xt, y_test=yt, n_classes=2, X_train=X)
    clean = get_protocol("knn")(data, {"n_neighbors": 1, "device": "cpu"})
    assert clean.diagnostics["tie_decided"] == 0 and "tie_decided" not in {w["code"] for w in clean.warnings}
    # the same rows again under the other label: two neighbours of other classes, equally similar
    X2, y2 = np.concatenate([X, X[:10]]), np.concatenate([y, 1 - y[:10]])
    tied = get_protocol("knn")(EvalData(y_train=y2, X_test=Xt, y_test=yt, n_classes=2, X_train=X2),
                               {"n_neighbors": 1, "device": "cpu"})
    assert tied.diagnostics["tie_decided"] == 10
    warning = next(w for w in tied.warnings if w["code"] == "tie_decided")
    assert "10 of 10 test images" in warning["message"]
    # train order decides the exact ties, as documented: the first copy wins
    np.testing.assert_array_equal(tied.evidence.values, yt)
