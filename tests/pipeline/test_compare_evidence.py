"""Comparisons added for stored evidence: low-shot fits (paired t over test examples) and mAP
with "difficult" examples left out per class, each against a direct computation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import average_precision_score

from pipeline.analysis.compare import compare_scores, evidence_sha256
from pipeline.analysis.compare.repeated import compare_repeated
from pipeline.analysis.compare.resampling import bootstrap_indices, swap_masks
from pipeline.errors import DataValidationError


def _fits(n_fits: int = 4, n: int = 150, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 5, n)
    a = np.where(rng.random((n_fits, n)) < 0.7, y, rng.integers(0, 5, (n_fits, n)))
    b = np.where(rng.random((n_fits, n)) < 0.6, y, rng.integers(0, 5, (n_fits, n)))
    return y, a, b


def test_repeated_fits_comparison_matches_scipy_and_direct_bootstrap():
    y, a, b = _fits()
    result = compare_repeated(y, a, b, n_resamples=150, seed=4)
    acc_a, acc_b = [(p == y).mean(axis=1).mean() for p in (a, b)]
    assert result.metric == "top1_mean_over_fits" and result.test == "paired-t" and result.n == 150
    assert result.score_a == pytest.approx(acc_a, abs=1e-15) and result.score_b == pytest.approx(acc_b, abs=1e-15)
    frac_a, frac_b = (a == y).mean(axis=0), (b == y).mean(axis=0)
    assert result.p_value == pytest.approx(stats.ttest_rel(frac_a, frac_b).pvalue, rel=1e-10)
    direct = [frac_a[i].mean() - frac_b[i].mean() for i in bootstrap_indices(150, 150, 4)]
    np.testing.assert_allclose(result.replicates, direct, atol=1e-12)
    np.testing.assert_allclose((result.ci_low, result.ci_high), np.quantile(direct, [0.025, 0.975]), atol=1e-12)
    assert (result.a_only, result.b_only) == (int(np.sum(frac_a > frac_b)), int(np.sum(frac_b > frac_a)))


def test_repeated_fits_refuse_one_fit_and_unpaired_fits():
    y, a, b = _fits()
    with pytest.raises(DataValidationError, match="McNemar"):
        compare_repeated(y, a[:1], b[:1])
    with pytest.raises(DataValidationError, match="paired one to one"):
        compare_repeated(y, a, b[:3])
    with pytest.raises(DataValidationError, match="150 examples"):
        compare_repeated(y, a[:, :100], b[:, :100])


def _mean_ap(y: np.ndarray, scores: np.ndarray) -> float:
    """sklearn's AP per class on the examples not difficult (-1) for it; classes with a positive."""
    aps = []
    for k in range(y.shape[1]):
        keep = y[:, k] >= 0
        if (y[keep, k] == 1).any():
            aps.append(average_precision_score(y[keep, k] == 1, scores[keep, k]))
    return float(np.mean(aps))


def test_map_comparison_leaves_difficult_examples_out_per_class():
    rng = np.random.default_rng(6)
    n = 80
    y = (rng.random((n, 3)) < 0.3).astype(np.int64)
    y[rng.random((n, 3)) < 0.1] = -1
    sa = np.round(y + rng.normal(0, 0.8, (n, 3)), 1).astype(np.float16).astype(np.float64)  # ties
    sb = y + rng.normal(0, 1.2, (n, 3))
    result = compare_scores(y, sa, sb, n_resamples=30, n_permutations=40, seed=5)
    assert result.score_a == pytest.approx(_mean_ap(y, sa), rel=1e-12)
    assert result.score_b == pytest.approx(_mean_ap(y, sb), rel=1e-12)
    direct = [_mean_ap(y[i], sa[i]) - _mean_ap(y[i], sb[i]) for i in bootstrap_indices(n, 30, 5)]
    np.testing.assert_allclose(result.replicates, direct, atol=1e-12)
    swapped = [_mean_ap(y, np.where(s[:, None], sb, sa)) - _mean_ap(y, np.where(s[:, None], sa, sb))
               for s in swap_masks(n, 40, 5)]
    expected = (1 + np.sum(np.abs(swapped) >= abs(result.difference) - 1e-12)) / 41
    assert result.p_value == pytest.approx(expected, rel=1e-12)
    with pytest.raises(DataValidationError, match="-1 for a difficult"):
        compare_scores(y + 1, sa, sb)


def test_evidence_digest_covers_dtype_shape_and_bytes():
    a = np.arange(6, dtype=np.int16)
    assert evidence_sha256(a) == evidence_sha256(a.astype(">i2"))  # byte order is not content
    others = [a.astype(np.int32), a.reshape(2, 3), np.r_[a[:5], 7].astype(np.int16)]
    assert len({evidence_sha256(a), *map(evidence_sha256, others)}) == 4
