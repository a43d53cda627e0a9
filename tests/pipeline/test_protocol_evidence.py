"""Every built-in protocol returns its evidence: per-example predictions, multi-label float16
scores, per-episode accuracies or every low-shot fit's predictions, each checked against a
direct computation, with the fingerprint that decides what it pairs with."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score
from sklearn.neighbors import KNeighborsClassifier

from pipeline.analysis.compare import compare_scores, episodes_fingerprint, labels_fingerprint
from pipeline.errors import DataValidationError
from pipeline.protocols.linear.average_precision import mean_average_precision_11
from pipeline.protocols.evidence import class_evidence
from pipeline.protocols.evidence import Evidence, float16_scores, headline_rows, prediction_dtype
from pipeline.protocols.episodic.fewshot import sample_episodes
from pipeline.protocols.registry import EvalData, get_protocol, resolve_settings


def _blobs(seed: int = 0, shift: float = 3.0, n_train: int = 60, n_test: int = 40, mean_per_class: bool = False):
    rng = np.random.default_rng(seed)
    y_train, y_test = np.arange(n_train) % 4, np.arange(n_test) % 4
    centers = np.random.default_rng(99).normal(size=(4, 6)) * shift
    X_train = centers[y_train] + rng.normal(size=(n_train, 6))
    X_test = centers[y_test] + rng.normal(size=(n_test, 6))
    return EvalData(y_train=y_train, X_test=X_test, y_test=y_test, n_classes=4, X_train=X_train,
                    mean_per_class=mean_per_class)


def _run(name, data, **settings):
    return get_protocol(name)(data, resolve_settings(name, settings))


def test_knn_keeps_the_predictions_sklearn_makes():
    data = _blobs()
    result = _run("knn", data, n_neighbors=5, metric="euclidean", weights="uniform")
    ev = result.evidence
    ref = KNeighborsClassifier(n_neighbors=5).fit(data.X_train, data.y_train).predict(data.X_test)
    assert ev.kind == "predictions" and ev.values.dtype == np.int16 and ev.metric == "top1"
    np.testing.assert_array_equal(ev.values, ref)
    assert ev.fingerprint == labels_fingerprint(data.y_test)
    assert result.metrics["top1"] == np.mean(ref == data.y_test)


@pytest.mark.parametrize("name", ["logistic", "ridge"])
def test_probe_predictions_give_exactly_the_recorded_accuracies(name):
    data = _blobs(shift=0.8, mean_per_class=True)  # overlapping classes: some errors
    result = _run(name, data, **({"Cs": None} if name == "logistic" else {}))
    pred = result.evidence.values
    assert result.evidence.metric == "mean_per_class" and pred.shape == (40,)
    assert result.metrics["top1"] == np.mean(pred == data.y_test) < 1.0
    recalls = [np.mean(pred[data.y_test == k] == k) for k in range(4)]
    assert result.metrics["mean_per_class"] == pytest.approx(np.mean(recalls), abs=1e-15)


def _nearest_centroid(X, support, query):
    acc = []
    for s, q in zip(support, query):
        protos = X[s].mean(axis=1)
        d = ((X[q][:, :, None, :] - protos[None, None]) ** 2).sum(-1)
        acc.append(np.mean(d.argmin(-1) == np.arange(s.shape[0])[:, None]))
    return np.array(acc)


def test_fewshot_episodes_depend_on_labels_and_seed_only():
    settings = {"n_way": 3, "n_shot": 4, "n_query": 3, "n_episodes": 25, "seed": 7, "pool": "test"}
    a, b = _blobs(seed=1), _blobs(seed=2, shift=0.5)  # other features, same labels
    ev_a, ev_b = _run("fewshot", a, **settings).evidence, _run("fewshot", b, **settings).evidence
    assert ev_a.kind == "episodes" and ev_a.values.shape == (25,) and ev_a.fingerprint == ev_b.fingerprint
    assert ev_a.fingerprint == episodes_fingerprint(a.y_test, 7, 3, 4, 3, 25)
    episodes = sample_episodes(a.y_test, 3, 4, 3, 25, 7)
    for data, ev in ((a, ev_a), (b, ev_b)):
        np.testing.assert_allclose(ev.values, _nearest_centroid(data.X_test, episodes.support, episodes.query),
                                   atol=1e-12)
    assert ev_a.values.mean() == _run("fewshot", a, **settings).metrics["score"]
    other_seed = _run("fewshot", a, **{**settings, "seed": 8}).evidence
    assert other_seed.fingerprint != ev_a.fingerprint


def test_lowshot_keeps_every_fit_in_order_and_names_the_headline():
    data = _blobs(shift=0.8)
    result = _run("lowshot", data, shots=[2, 5, "all"], n_seeds=3)
    ev = result.evidence
    assert ev.kind == "fits" and ev.fits == ("2/0", "2/1", "2/2", "5/0", "5/1", "5/2", "all/0")
    assert ev.headline == "all" and ev.values.shape == (7, 40)
    for i, shots in enumerate(["2", "5"]):
        rows = headline_rows(ev.fits, shots)
        accs = (ev.values[rows] == data.y_test).mean(axis=1)
        assert result.metrics["curve"][shots] == pytest.approx(accs.mean(), abs=1e-15)
    assert result.metrics["score"] == np.mean(ev.values[6] == data.y_test)
    no_all = _run("lowshot", data, shots=[2, 5], n_seeds=2).evidence
    assert no_all.headline == "5" and headline_rows(no_all.fits, "5").tolist() == [2, 3]


def _multilabel(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(160, 6))
    Y = (X @ rng.normal(size=(6, 3)) + rng.normal(size=(160, 3)) > 0.3).astype(np.int64)
    Y[rng.random(Y.shape) < 0.08] = -1  # difficult
    return EvalData(y_train=Y[:100], X_test=X[100:], y_test=Y[100:], n_classes=3, X_train=X[:100])


@pytest.mark.parametrize("name", ["logistic", "ridge"])
def test_multilabel_scores_are_stored_as_float16_and_scored_from_them(name):
    data = _multilabel()
    result = _run(name, data, **({"Cs": None} if name == "logistic" else {}))
    ev = result.evidence
    assert ev.kind == "scores" and ev.values.dtype == np.float16 and ev.values.shape == (60, 3) and ev.metric == "mAP"
    assert result.metrics["map11"] == mean_average_precision_11(ev.values.astype(np.float64), data.y_test)[0]
    kept = [(data.y_test[:, k] >= 0) for k in range(3)]
    direct = np.mean([average_precision_score(data.y_test[m, k] == 1, ev.values[m, k].astype(np.float64))
                      for k, m in enumerate(kept)])
    assert result.metrics["map"] == pytest.approx(direct, abs=1e-12)
    # what a comparison reads back is the record's number
    same = compare_scores(data.y_test, ev.values, ev.values, n_resamples=5, n_permutations=5)
    assert same.score_a == pytest.approx(result.metrics["map"], abs=1e-12) and same.difference == 0.0


def test_evidence_dtypes_and_refusals():
    assert prediction_dtype(32768) == np.int16 and prediction_dtype(32769) == np.int32
    big = float16_scores(np.array([[1e6, -1e6, 0.5]]))
    assert big.dtype == np.float16 and np.all(np.isfinite(big)) and big[0, 0] == np.finfo(np.float16).max
    with pytest.raises(DataValidationError, match="NaN or inf"):
        float16_scores(np.array([np.nan]))
    with pytest.raises(DataValidationError, match="outside 0..3"):
        Evidence.of_predictions(np.arange(4), np.array([0, 1, 2, 4]), 4)
    with pytest.raises(DataValidationError, match="headline N 'all'"):
        Evidence.of_fits(np.arange(4), [(2, 0, np.arange(4))], 4, "all")
    wide = Evidence.of_predictions(np.arange(3), np.array([0, 40000, 2]), 40001)
    assert wide.values.dtype == np.int32
    # labels that are not class indices (a protocol called directly on names) keep no evidence
    data = EvalData(y_train=np.array(["a", "b"] * 10), X_test=np.zeros((4, 2)), y_test=np.array(["a", "b"] * 2),
                    n_classes=2, X_train=np.zeros((20, 2)))
    assert class_evidence(data, np.array(["a", "a", "b", "b"])) is None

