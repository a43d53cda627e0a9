"""Multi-label evaluation: the 11-point AP in Ericsson et al.'s convention (``map11``) and the
VOC devkit's (``map11_devkit``), each against a literal transcription of its formula, and
the one-vs-rest logistic probe against scikit-learn."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import precision_recall_curve

from pipeline.errors import DataValidationError
from pipeline.protocols.linear.average_precision import (
    DEVKIT_THRESHOLDS, NUMPY_THRESHOLDS, devkit_average_precision, matlab_colon, mean_average_precision_11, seed_average_precision,
)
from pipeline.protocols.metrics import multilabel_metrics
from pipeline.protocols.linear.multilabel import MultiLabelLogisticProbe, accepts_multilabel
from pipeline.protocols.registry import EvalData, get_protocol, list_protocols


def seed_ap(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """ssl-transfer's linear.py (voc_eval_cls, voc_ap), written out again: scikit-learn's
    precision-recall curve, then 11 thresholds from numpy.linspace(0, 1, 11)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a class without positives: scikit-learn warns, recall set to 1
        prec, rec, _ = precision_recall_curve(y_true, y_pred)
    ap = 0.0
    for t in np.linspace(0, 1, 11):
        p = 0 if np.sum(rec >= t) == 0 else np.max(prec[rec >= t])
        ap += p / 11.0
    return ap


def seed_map(labels: np.ndarray, scores: np.ndarray) -> float:
    """Their mAP: every class, targets ``label == 1`` (their VOC loader's ``target == 1``)."""
    return float(np.mean([seed_ap((labels[:, c] == 1).astype(int), scores[:, c]) for c in range(labels.shape[1])]))


# MATLAB's 0:0.1:1, element by element: the first half counted up from 0 (so 3 * 0.1 =
# 0.30000000000000004), the middle the midpoint, the second half counted down from 1 (so 1 - 0.4
# and 1 - 3 * 0.1 are the doubles nearest 0.6 and 0.7)
MATLAB_TENTHS = [0.0, 0.1, 0.2, 3 * 0.1, 0.4, (0 + 1) / 2, 1 - 0.4, 1 - 3 * 0.1, 1 - 0.2, 1 - 0.1, 1.0]


def devkit_ap(out: np.ndarray, gt: np.ndarray, thresholds=MATLAB_TENTHS) -> float:
    """VOCevalcls.m (VOC 2007), line by line; gt in the devkit's coding: 1, -1, 0 (difficult);
    ``for t=0:0.1:1`` as MATLAB computes it."""
    si = np.argsort(-out, kind="stable")  # [so, si] = sort(-out): a stable sort
    tp = np.cumsum(gt[si] > 0)
    fp = np.cumsum(gt[si] < 0)
    rec = tp / np.sum(gt > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        prec = tp / (fp + tp)  # 0/0 = NaN where only difficult images ranked so far
    ap = 0.0
    for t in thresholds:
        chosen = prec[rec >= t]
        chosen = chosen[~np.isnan(chosen)]  # max ignores NaN
        p = chosen.max() if chosen.size else 0.0  # if isempty(p), p = 0
        ap += p / 11
    return ap


def to_devkit(labels: np.ndarray) -> np.ndarray:
    """Ours (1 present, 0 absent, -1 difficult) -> the devkit's (1, -1, 0)."""
    return np.select([labels == 1, labels == 0], [1, -1], 0)


def _random_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores (n, C) and labels in {1, 0, -1}: continuous, rounded (many ties) or float16."""
    rng = np.random.default_rng(seed)
    n, c = int(rng.integers(2, 80)), int(rng.integers(1, 6))
    labels = rng.choice([1, 0, -1], size=(n, c), p=[0.3, 0.6, 0.1])
    labels[rng.integers(n, size=c), np.arange(c)] = 1
    scores = rng.normal(size=(n, c)) + labels
    kind = seed % 3
    if kind == 1:
        scores = np.round(scores, int(rng.integers(0, 2)))
    elif kind == 2:
        scores = (scores * 10.0 ** rng.integers(-3, 3)).astype(np.float16).astype(np.float64)
    return scores, labels


@pytest.mark.parametrize("seed", range(60))
def test_map11_is_the_seed_computation(seed: int) -> None:
    scores, labels = _random_case(seed)
    mean, per_class = mean_average_precision_11(scores, labels, "seed")
    assert mean == pytest.approx(seed_map(labels, scores), abs=1e-9)
    for c in range(labels.shape[1]):
        assert per_class[c] == pytest.approx(seed_ap((labels[:, c] == 1).astype(int), scores[:, c]), abs=1e-12)
    assert multilabel_metrics(labels, scores)["map11"] == pytest.approx(seed_map(labels, scores), abs=1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_map11_devkit_is_the_devkit_computation(seed: int) -> None:
    scores, labels = _random_case(seed)
    for c in range(labels.shape[1]):
        assert devkit_average_precision(scores[:, c], labels[:, c]) == pytest.approx(
            devkit_ap(scores[:, c], to_devkit(labels[:, c])), abs=1e-12)


def _devkit_formula(scores: np.ndarray, labels: np.ndarray) -> float:
    """The devkit's Python ports (py-faster-rcnn's voc_eval.py), written out: difficult images
    dropped, a stable ranking, then for t in np.arange(0, 1.1, 0.1): p = max(prec[rec >= t]) or 0;
    ap += p / 11."""
    keep = labels >= 0
    gt = labels[keep] == 1
    ranked = gt[np.argsort(-scores[keep], kind="stable")]
    tp, fp = np.cumsum(ranked), np.cumsum(~ranked)
    rec, prec = tp / gt.sum(), tp / (fp + tp)
    ap = 0.0
    for t in np.arange(0, 1.1, 0.1):
        p = prec[rec >= t]
        ap += (np.max(p) if p.size else 0.0) / 11
    return ap


def test_matlab_colon_is_matlabs() -> None:
    assert DEVKIT_THRESHOLDS.tolist() == MATLAB_TENTHS  # bit for bit
    assert DEVKIT_THRESHOLDS[6] == 0.6 and DEVKIT_THRESHOLDS[7] == 0.7 and DEVKIT_THRESHOLDS[3] != 0.3
    assert np.array_equal(NUMPY_THRESHOLDS, np.arange(0, 1.1, 0.1))  # the seed's linspace, bit for bit
    assert NUMPY_THRESHOLDS[6] != 0.6 and NUMPY_THRESHOLDS[7] != 0.7
    # odd counts have no middle element; exact grids stay exact
    assert matlab_colon(0.0, 1.0, 5.0).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert matlab_colon(0.0, 0.25, 1.0).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert matlab_colon(0.0, 0.1, 0.95).size == 10  # the steps stop before the end


def test_map11_devkit_on_recalls_exactly_at_tenths() -> None:
    # 10, 20 or 30 positives: the recall passes through exactly 0.3, 0.6 and 0.7; MATLAB's
    # thresholds reach 0.6 and 0.7 (not 0.3), numpy's arange reaches none of the three
    rng = np.random.default_rng(33)
    conventions_differ = 0
    for _ in range(120):
        n_pos = int(rng.choice([10, 20, 30]))
        labels = np.r_[np.ones(n_pos, int), np.zeros(int(rng.integers(0, 40)), int),
                       -np.ones(int(rng.integers(0, 4)), int)]
        rng.shuffle(labels)
        scores = np.round(rng.normal(size=labels.size), 1)  # ties too, kept in stored order
        matlab = devkit_average_precision(scores, labels)
        ported = devkit_average_precision(scores, labels, thresholds="numpy")
        assert matlab == pytest.approx(devkit_ap(scores, to_devkit(labels)), abs=1e-15)
        assert ported == pytest.approx(_devkit_formula(scores, labels), abs=1e-15)
        assert ported == pytest.approx(devkit_ap(scores, to_devkit(labels), np.arange(0.0, 1.1, 0.1)), abs=1e-15)
        conventions_differ += abs(matlab - ported) > 1e-12
    assert conventions_differ > 20  # the cases do land on the thresholds where the two readings part


def test_devkit_numpy_is_a_convention_of_the_mean() -> None:
    scores, labels = _random_case(4)
    mean, per_class = mean_average_precision_11(scores, labels, "devkit_numpy")
    for c in range(labels.shape[1]):
        assert per_class[c] == devkit_average_precision(scores[:, c], labels[:, c], thresholds="numpy")


def test_the_two_conventions_differ_where_they_say() -> None:
    # one positive of ten ranked third: recall jumps 0 -> 1 there
    scores, labels = -np.arange(10.0), np.r_[0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert devkit_average_precision(scores, labels) == pytest.approx(1 / 3, abs=1e-15)
    assert seed_average_precision(scores, labels) == pytest.approx((1 + 10 / 3) / 11, abs=1e-15)  # t = 0 finds 1
    # a difficult image ranked first: a negative for the seed, out of the devkit's ranking
    assert seed_average_precision(np.r_[1.0, 0.5], np.r_[-1, 1]) == pytest.approx((1 + 10 * 0.5) / 11)
    assert devkit_average_precision(np.r_[1.0, 0.5], np.r_[-1, 1]) == pytest.approx(1.0, abs=1e-15)
    # tied scores enter the seed's curve together, the devkit's one by one in stored order
    tied = np.zeros(4)
    assert seed_average_precision(tied, np.r_[0, 1, 0, 1]) == pytest.approx((1 + 10 * 0.5) / 11)
    assert devkit_average_precision(tied, np.r_[1, 0, 0, 1]) == pytest.approx((6 * 1.0 + 5 * 0.5) / 11)
    # 3 of 10 positives first: a recall of exactly 0.3 misses the threshold 0.30000000000000004
    scores, labels = -np.arange(17.0), np.r_[1, 1, 1, np.zeros(7, int), np.ones(7, int)]
    expected = (3 * 1.0 + 8 * (10 / 17)) / 11  # exact k / 10 thresholds would give (4 + 7 * 10 / 17) / 11
    assert devkit_average_precision(scores, labels) == pytest.approx(expected, abs=1e-15)
    assert seed_average_precision(scores, labels) == pytest.approx(expected, abs=1e-15)


def test_classes_without_positives() -> None:
    scores = np.array([[0.9, 0.1], [0.2, 0.3], [0.4, 0.8]])
    labels = np.array([[1, 0], [0, -1], [1, 0]])
    mean, per_class = mean_average_precision_11(scores, labels, "devkit")
    assert per_class[0] == pytest.approx(1.0) and np.isnan(per_class[1]) and mean == per_class[0]
    mean, per_class = mean_average_precision_11(scores, labels, "seed")  # the seed's code gives such a class 1/11
    assert per_class[1] == pytest.approx(1 / 11) and mean == pytest.approx(seed_map(labels, scores), abs=1e-12)
    with pytest.raises(DataValidationError, match=r"\[1, 0\] = 2"):
        mean_average_precision_11(scores, np.array([[1, 0], [2, 0], [1, 0]]))
    with pytest.raises(DataValidationError, match="convention 'matlab'"):
        mean_average_precision_11(scores, labels, "matlab")


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
        expected.append(seed_map(Y[val], scores))
    np.testing.assert_allclose(probe.val_scores_, expected, atol=1e-9)
    best = np.flatnonzero(np.asarray(expected) >= max(expected) - 1e-12)
    assert probe.C_ == grid[best[-1]]  # ties to the weaker penalty
    refit = [_sklearn_fit(X, Y, probe.C_, c) for c in range(Y.shape[1])]  # on train + validation
    np.testing.assert_allclose(probe.coef_, np.vstack([m.coef_[0] for m in refit]), atol=1e-5)


def test_logistic_protocol_on_multilabel_data() -> None:
    X, Y = _problem(seed=2, n=200)
    data = EvalData(y_train=Y[:120], X_test=X[160:], y_test=Y[160:], n_classes=3, X_train=X[:120],
                    X_val=X[120:160], y_val=Y[120:160])
    result = get_protocol("logistic")(data, {"Cs": [0.01, 1.0, 100.0], "transform": "none", "tol": 1e-10})
    probe = MultiLabelLogisticProbe(Cs=[0.01, 1.0, 100.0], tol=1e-10).fit(
        X[:160], Y[:160], val_mask=np.r_[np.zeros(120, bool), np.ones(40, bool)])
    scores = probe.decision_function(X[160:]).astype(np.float16).astype(np.float64)  # as stored
    assert result.metrics["map11"] == pytest.approx(seed_map(Y[160:], scores), abs=1e-9) == result.metrics["score"]
    assert result.metrics["map11_devkit"] == pytest.approx(np.nanmean(
        [devkit_ap(scores[:, c], to_devkit(Y[160:, c])) for c in range(3)]), abs=1e-9)
    assert result.diagnostics["validation"] == "dataset split" and result.diagnostics["converged"]
    assert len(result.metrics["ap11_per_class"]) == 3


def test_only_multilabel_protocols_take_multilabel_data() -> None:
    X, Y = _problem(seed=3, n=60)
    data = EvalData(y_train=Y[:40], X_test=X[40:], y_test=Y[40:], n_classes=3, X_train=X[:40])
    able = [p for p in list_protocols() if accepts_multilabel(p)]
    assert "logistic" in able
    pooled = [p for p in list_protocols() if get_protocol(p).reads not in ("map", "weights")]  # no EvalData at all
    for name in sorted(set(pooled) - set(able)):
        with pytest.raises(DataValidationError, match=f"protocol '{name}' cannot take"):
            get_protocol(name)(data)
