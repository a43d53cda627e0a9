"""Significance tests and resampling primitives of pipeline.analysis.compare, against direct formulas and scipy/sklearn."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import average_precision_score, balanced_accuracy_score

from pipeline.analysis.compare import benjamini_hochberg, mcnemar_exact, paired_t_test, percentile_interval
from pipeline.analysis.compare.resampling import (
    RankedClass,
    average_precision_rows,
    bootstrap_indices,
    bootstrap_weight_blocks,
    mean_per_class_rows,
    swap_mask_blocks,
    swap_masks,
)
from pipeline.errors import DataValidationError

PAIRS = [(0, 0), (1, 0), (5, 5), (0, 10), (3, 17), (17, 3), (12, 9), (100, 130), (480, 520)]


def _binomial_tail(k: int, n: int) -> Fraction:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly."""
    return Fraction(sum(comb(n, i) for i in range(k + 1)), 2**n)


@pytest.mark.parametrize(("b", "c"), PAIRS)
def test_mcnemar_exact_matches_binomial_sum_and_scipy(b: int, c: int) -> None:
    n, k = b + c, min(b, c)
    direct = 1.0 if n == 0 else float(min(Fraction(1), 2 * _binomial_tail(k, n)))
    assert mcnemar_exact(b, c) == pytest.approx(direct, rel=1e-10, abs=1e-300)
    if n:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(k, n, 0.5).pvalue, rel=1e-10)


@pytest.mark.parametrize(("b", "c"), PAIRS)
def test_mcnemar_mid_p_matches_binomial_sum(b: int, c: int) -> None:
    n, k = b + c, min(b, c)
    if n == 0:
        assert mcnemar_exact(b, c, mid_p=True) == 1.0
        return
    mid = 2 * _binomial_tail(k, n) - Fraction(comb(n, k), 2**n)
    assert mcnemar_exact(b, c, mid_p=True) == pytest.approx(float(min(Fraction(1), mid)), rel=1e-10)
    assert mcnemar_exact(b, c, mid_p=True) <= mcnemar_exact(b, c)


def test_mcnemar_is_vectorised_over_cells() -> None:
    b, c = np.array([p[0] for p in PAIRS]), np.array([p[1] for p in PAIRS])
    np.testing.assert_allclose(mcnemar_exact(b, c), [mcnemar_exact(x, y) for x, y in PAIRS], rtol=1e-14)
    np.testing.assert_allclose(mcnemar_exact(b, c, mid_p=True), [mcnemar_exact(x, y, True) for x, y in PAIRS])


def test_mcnemar_refuses_bad_counts() -> None:
    with pytest.raises(DataValidationError, match="counts >= 0"):
        mcnemar_exact(-1, 3)
    with pytest.raises(DataValidationError, match="whole counts"):
        mcnemar_exact(2.5, 3)
    with pytest.raises(DataValidationError, match="shape"):
        mcnemar_exact([1, 2], [1, 2, 3])
    with pytest.raises(DataValidationError, match="integer counts"):
        mcnemar_exact(True, 3)


def _bh_direct(p: np.ndarray) -> np.ndarray:
    """adjusted_i = min over p_j >= p_i of m p_j / rank_j, capped at 1 (O(m^2))."""
    m = p.size
    order = np.argsort(p, kind="stable")
    rank = np.empty(m, dtype=int)
    rank[order] = np.arange(1, m + 1)
    return np.array([min(1.0, min(m * p[j] / rank[j] for j in range(m) if rank[j] >= rank[i])) for i in range(m)])


def test_benjamini_hochberg_hand_worked() -> None:
    # sorted 0.01, 0.03, 0.04, 0.20 -> m p / rank = 0.04, 0.06, 0.0533, 0.20 -> running min from the top.
    adjusted = benjamini_hochberg([0.01, 0.04, 0.03, 0.20])
    np.testing.assert_allclose(adjusted, [0.04, 0.16 / 3, 0.16 / 3, 0.20], rtol=1e-12)
    np.testing.assert_allclose(benjamini_hochberg([0.5]), [0.5])
    np.testing.assert_allclose(benjamini_hochberg([0.9, 0.95]), [0.95, 0.95])
    assert benjamini_hochberg([]).shape == (0,)


@pytest.mark.parametrize("seed", range(4))
def test_benjamini_hochberg_matches_direct_and_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.uniform(0, 1, 30), rng.uniform(0, 0.01, 10), [0.02, 0.02, 0.0, 1.0]])
    rng.shuffle(p)
    adjusted = benjamini_hochberg(p)
    np.testing.assert_allclose(adjusted, _bh_direct(p), rtol=1e-12)
    np.testing.assert_allclose(adjusted, stats.false_discovery_control(p, method="bh"), rtol=1e-12)
    assert np.all(adjusted >= p)


def test_benjamini_hochberg_refuses_bad_p_values() -> None:
    with pytest.raises(DataValidationError, match=r"at cell\(s\) \[1\]: \[nan\]"):
        benjamini_hochberg([0.1, np.nan])
    with pytest.raises(DataValidationError, match=r"in \[0, 1\]"):
        benjamini_hochberg([0.1, 1.5])
    with pytest.raises(DataValidationError, match="1-D"):
        benjamini_hochberg([[0.1, 0.2]])


@pytest.mark.parametrize("seed", range(3))
def test_paired_t_matches_scipy_ttest_rel(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.4, 0.9, 600)
    b = np.clip(a - 0.01 + rng.normal(0, 0.05, 600), 0, 1)
    t, p = paired_t_test(a - b)
    reference = stats.ttest_rel(a, b)
    assert t == pytest.approx(reference.statistic, rel=1e-10)
    assert p == pytest.approx(reference.pvalue, rel=1e-8)


def test_paired_t_degenerate_spread() -> None:
    assert paired_t_test(np.zeros(5)) == (0.0, 1.0)
    t, p = paired_t_test(np.full(5, 0.02))
    assert p == 0.0 and t == np.inf
    with pytest.raises(DataValidationError, match="at least 2"):
        paired_t_test([0.1])
    with pytest.raises(DataValidationError, match="NaN"):
        paired_t_test([0.1, np.nan, 0.2])


def test_percentile_interval_is_numpy_quantile() -> None:
    r = np.random.default_rng(0).normal(size=999)
    np.testing.assert_allclose(percentile_interval(r, 0.9), np.quantile(r, [0.05, 0.95]), rtol=1e-12)
    for bad in (0.0, 1.0, 95, "0.95", True):
        with pytest.raises(DataValidationError, match="confidence"):
            percentile_interval(r, bad)


def test_resampling_streams_do_not_depend_on_block_size() -> None:
    n, count, seed = 37, 101, 5
    indices = bootstrap_indices(n, count, seed)
    assert indices.shape == (count, n) and indices.min() >= 0 and indices.max() < n
    expected = np.stack([np.bincount(row, minlength=n) for row in indices]).astype(float)
    for max_elements in (1, n * 3, n * 50, 1 << 30):
        blocks = list(bootstrap_weight_blocks(n, count, seed, max_elements))
        np.testing.assert_array_equal(np.concatenate(blocks), expected)
        np.testing.assert_array_equal(np.concatenate(list(swap_mask_blocks(n, count, seed, max_elements))),
                                      swap_masks(n, count, seed))
    assert not np.array_equal(bootstrap_indices(n, count, seed + 1), indices)
    # Swaps are fair coins, independent of the bootstrap stream.
    assert abs(swap_masks(n, count, seed).mean() - 0.5) < 0.03


# sklearn warns when a resample drops a class that is still predicted; it then leaves it out, as we do.
@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_mean_per_class_rows_matches_weighted_balanced_accuracy() -> None:
    rng = np.random.default_rng(1)
    y = rng.integers(0, 6, 80)
    pred = np.where(rng.random(80) < 0.6, y, rng.integers(0, 6, 80))
    weights = rng.integers(0, 3, (7, 80)).astype(float)
    weights[0, y == 2] = 0  # a class absent from a resample is left out of the mean
    got = mean_per_class_rows((pred == y).astype(float), y, weights)
    expected = [balanced_accuracy_score(y[w > 0], pred[w > 0], sample_weight=w[w > 0]) for w in weights]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("decimals", [None, 1])  # continuous scores, then many ties
def test_average_precision_rows_matches_sklearn_with_weights(decimals: int | None) -> None:
    rng = np.random.default_rng(2)
    positive = rng.random(120) < 0.3
    scores = positive + rng.normal(0, 1, 120)
    if decimals is not None:
        scores = np.round(scores, decimals)
    weights = rng.integers(0, 4, (6, 120)).astype(float)
    weights[1] = 1.0
    got = average_precision_rows(scores, positive, weights)
    expected = [average_precision_score(positive, scores, sample_weight=w) for w in weights]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert np.isnan(average_precision_rows(scores, positive, np.where(positive, 0.0, 1.0)[None]))[0]


def test_complementary_average_precision_equals_two_direct_selections() -> None:
    rng = np.random.default_rng(3)
    n = 50
    positive = rng.random(n) < 0.4
    scores_a, scores_b = np.round(positive + rng.normal(0, 1, (2, n)), 1)
    swap = rng.random((5, n)) < 0.5
    ranked = RankedClass(np.concatenate([scores_a, scores_b]), np.tile(positive, 2))
    ap_a, ap_b = ranked.complementary_average_precision(np.hstack([~swap, swap]).astype(float))
    for row in range(5):
        taken_a = np.where(swap[row], scores_b, scores_a)
        taken_b = np.where(swap[row], scores_a, scores_b)
        assert ap_a[row] == pytest.approx(average_precision_score(positive, taken_a), rel=1e-12)
        assert ap_b[row] == pytest.approx(average_precision_score(positive, taken_b), rel=1e-12)
