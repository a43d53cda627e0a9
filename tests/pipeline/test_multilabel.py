"""Multi-label evaluation: the VOC devkit's 11-point AP against a literal transcription of
its formula, and the one-vs-rest logistic probe against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from pipeline.errors import DataValidationError
from pipeline.protocols.average_precision import voc07_average_precision, voc07_mean_average_precision
from pipeline.protocols.multilabel import MultiLabelLogisticProbe, accepts_multilabel
from pipeline.protocols.registry import EvalData, get_protocol, list_protocols


def devkit_ap(out: np.ndarray, gt: np.ndarray) -> float:
    """VOCevalcls.m (VOC 2007), line by line; gt in the devkit's coding: 1, -1, 0 (difficult)."""
    si = np.argsort(-out, kind="stable")  # [so, si] = sort(-out): MATLAB's sort is stable
    tp = np.cumsum(gt[si] > 0)
    fp = np.cumsum(gt[si] < 0)
    rec = tp / np.sum(gt > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        prec = tp / (fp + tp)  # 0/0 = NaN where only difficult images ranked so far
    ap = 0.0
    for t in [k / 10 for k in range(11)]:  # t = 0:0.1:1
        chosen = prec[rec >= t]
        chosen = chosen[~np.isnan(chosen)]  # MATLAB's max ignores NaN
        p = chosen.max() if chosen.size else 0.0  # if isempty(p), p = 0
        ap += p / 11
    return ap


def to_devkit(labels: np.ndarray) -> np.ndarray:
    """Ours (1 present, 0 absent, -1 difficult) -> the devkit's (1, -1, 0)."""
    return np.select([labels == 1, labels == 0], [1, -1], 0)


@pytest.mark.parametrize("seed", range(40))
def test_ap_matches_the_devkit_formula(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    labels = rng.choice([1, 0, -1], size=n, p=[0.3, 0.6, 0.1])
    labels[rng.integers(n)] = 1
    scores = np.round(rng.normal(size=n) + labels, int(rng.integers(0, 2)))  # coarse: many ties
    assert voc07_average_precision(scores, labels) == pytest.approx(devkit_ap(scores, to_devkit(labels)), abs=1e-12)


def test_ap_hand_computed() -> None:
    # ranking: +, -, +, difficult, -, + ; 3 positives
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    labels = np.array([1, 0, 1, -1, 0, 1])
    # precision at the positives: 1, 2/3, 3/5; recall 1/3, 2/3, 1
    expected = (4 * 1.0 + 3 * (2 / 3) + 4 * (3 / 5)) / 11  # t<=1/3: 1; t in (1/3, 2/3]: 2/3; above: 3/5
    assert voc07_average_precision(scores, labels) == pytest.approx(expected, abs=1e-15)
    # a difficult image ranked first changes nothing (it is not in the ranking)
    assert voc07_average_precision(np.r_[1.0, scores], np.r_[-1, labels]) == pytest.approx(expected, abs=1e-15)


def test_map_skips_classes_without_positives() -> None:
    scores = np.array([[0.9, 0.1], [0.2, 0.3], [0.4, 0.8]])
    labels = np.array([[1, 0], [0, -1], [1, 0]])
    mean, per_class = voc07_mean_average_precision(scores, labels)
    assert per_class[0] == 1.0 and np.isnan(per_class[1]) and mean == 1.0
    with pytest.raises(DataValidationError, match=r"\[1, 0\] = 2"):
        voc07_mean_average_precision(scores, np.array([[1, 0], [2, 0], [1, 0]]))


def _problem(seed: int = 0, n: int = 120, d: int = 6, k: int = 3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    W = rng.normal(size=(d, k))
    Y = (X @ W + rng.normal(scale=1.0, size=(n, k)) > 0.3).astype(np.int64)
    difficult = rng.random((n, k)) < 0.08
    Y[difficult] = -1
    return X, Y


def _sklearn_fit(X, Y, C, c):
    keep = Y[:, c] >= 0
    return LogisticRegression(C=C, tol=1e-12, max_iter=10000).fit(X[keep], Y[keep, c] == 1)


def test_probe_matches_sklearn_per_class_and_ignores_difficult_rows() -> None:
    X, Y = _problem()
    probe = MultiLabelLogisticProbe(C=0.7, tol=1e-12, max_iter=10000).fit(X, Y)
    for c in range(Y.shape[1]):
        ref = _sklearn_fit(X, Y, 0.7, c)  # difficult rows removed outright
        np.testing.assert_allclose(probe.coef_[c], ref.coef_[0], atol=1e-6)
        np.testing.assert_allclose(probe.intercept_[c], ref.intercept_[0], atol=1e-6)
    assert probe.converged_ and probe.constant_classes_ == []


def test_probe_selects_C_by_validation_map() -> None:
    X, Y = _problem(seed=1, n=160)
    val = np.zeros(len(Y), bool)
    val[::4] = True
    grid = [0.001, 0.03, 1.0, 30.0]
    probe = MultiLabelLogisticProbe(Cs=grid, tol=1e-10, max_iter=10000).fit(X, Y, val_mask=val)
    expected = []
    for C in grid:
        scores = np.column_stack([_sklearn_fit(X[~val], Y[~val], C, c).decision_function(X[val])
                                  for c in range(Y.shape[1])])
        expected.append(voc07_mean_average_precision(scores, Y[val])[0])
    np.testing.assert_allclose(probe.val_scores_, expected, atol=1e-9)
    assert probe.C_ == grid[int(np.argmax(expected))]
    refit = [_sklearn_fit(X, Y, probe.C_, c) for c in range(Y.shape[1])]  # on train + validation
    np.testing.assert_allclose(probe.coef_, np.vstack([m.coef_[0] for m in refit]), atol=1e-5)


def test_logistic_protocol_on_multilabel_data() -> None:
    X, Y = _problem(seed=2, n=200)
    data = EvalData(y_train=Y[:120], X_test=X[160:], y_test=Y[160:], n_classes=3, X_train=X[:120],
                    X_val=X[120:160], y_val=Y[120:160])
    result = get_protocol("logistic")(data, {"Cs": [0.01, 1.0, 100.0], "transform": "none", "tol": 1e-10})
    probe = MultiLabelLogisticProbe(Cs=[0.01, 1.0, 100.0], tol=1e-10).fit(
        X[:160], Y[:160], val_mask=np.r_[np.zeros(120, bool), np.ones(40, bool)])
    expected = voc07_mean_average_precision(probe.decision_function(X[160:]), Y[160:])[0]
    assert result.metrics["map11"] == pytest.approx(expected, abs=1e-9) == result.metrics["score"]
    assert result.diagnostics["validation"] == "dataset split" and result.diagnostics["converged"]
    assert len(result.metrics["ap11_per_class"]) == 3


def test_only_multilabel_protocols_take_multilabel_data() -> None:
    X, Y = _problem(seed=3, n=60)
    data = EvalData(y_train=Y[:40], X_test=X[40:], y_test=Y[40:], n_classes=3, X_train=X[:40])
    able = [p for p in list_protocols() if accepts_multilabel(p)]
    assert "logistic" in able
    pooled = [p for p in list_protocols() if get_protocol(p).reads != "map"]  # dense ones take no EvalData at all
    for name in sorted(set(pooled) - set(able)):
        with pytest.raises(DataValidationError, match=f"protocol '{name}' cannot take"):
            get_protocol(name)(data)
