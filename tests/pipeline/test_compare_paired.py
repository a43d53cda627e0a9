"""Paired comparisons of two encoders, checked against direct loops over the same resamples."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, average_precision_score, balanced_accuracy_score

from pipeline.analysis.compare import (
    PairedComparison,
    check_paired,
    compare_episodes,
    compare_predictions,
    compare_scores,
    decide_verdicts,
    episodes_fingerprint,
    labels_fingerprint,
    mcnemar_exact,
    benjamini_hochberg,
    summarise_by_setting,
)
from pipeline.analysis.compare.resampling import bootstrap_indices, swap_masks
from pipeline.errors import DataValidationError, RepevalError
from pipeline.protocols import fewshot_episodes
from pipeline.plain import to_plain


def _classification(n: int = 300, classes: int = 5, seed: int = 0, acc_a: float = 0.75, acc_b: float = 0.65):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    a = np.where(rng.random(n) < acc_a, y, rng.integers(0, classes, n))
    b = np.where(rng.random(n) < acc_b, y, rng.integers(0, classes, n))
    return y, a, b


def _p_randomization(swapped: np.ndarray, observed: float) -> float:
    return (1 + np.sum(np.abs(swapped) >= abs(observed) - 1e-12)) / (1 + swapped.size)


def test_top1_comparison_matches_direct_computation() -> None:
    y, a, b = _classification()
    result = compare_predictions(y, a, b, n_resamples=200, seed=3)
    assert result.metric == "top1" and result.test == "mcnemar-exact" and result.n == 300
    assert result.score_a == accuracy_score(y, a) and result.score_b == accuracy_score(y, b)
    assert result.difference == pytest.approx(accuracy_score(y, a) - accuracy_score(y, b), abs=1e-15)
    a_only, b_only = int(np.sum((a == y) & (b != y))), int(np.sum((b == y) & (a != y)))
    assert (result.a_only, result.b_only) == (a_only, b_only)
    assert result.p_value == mcnemar_exact(a_only, b_only)
    direct = [accuracy_score(y[i], a[i]) - accuracy_score(y[i], b[i]) for i in bootstrap_indices(300, 200, 3)]
    np.testing.assert_allclose(result.replicates, direct, atol=1e-12)
    np.testing.assert_allclose((result.ci_low, result.ci_high), np.quantile(direct, [0.025, 0.975]), atol=1e-12)
    mid = compare_predictions(y, a, b, n_resamples=200, seed=3, mid_p=True)
    assert mid.test == "mcnemar-mid-p" and mid.p_value == mcnemar_exact(a_only, b_only, mid_p=True)


def test_mean_per_class_comparison_matches_sklearn_loops() -> None:
    y, a, b = _classification(n=120, classes=4, seed=1)
    result = compare_predictions(y, a, b, "mean_per_class", n_resamples=60, n_permutations=80, seed=7)
    assert result.test == "randomization" and result.n_permutations == 80
    assert result.score_a == pytest.approx(balanced_accuracy_score(y, a), rel=1e-12)
    assert result.score_b == pytest.approx(balanced_accuracy_score(y, b), rel=1e-12)
    direct = [balanced_accuracy_score(y[i], a[i]) - balanced_accuracy_score(y[i], b[i])
              for i in bootstrap_indices(120, 60, 7)]
    np.testing.assert_allclose(result.replicates, direct, atol=1e-12)
    swapped = [balanced_accuracy_score(y, np.where(s, b, a)) - balanced_accuracy_score(y, np.where(s, a, b))
               for s in swap_masks(120, 80, 7)]
    assert result.p_value == pytest.approx(_p_randomization(np.array(swapped), result.difference), rel=1e-12)


def _mean_ap(y: np.ndarray, scores: np.ndarray) -> float:
    kept = [k for k in range(y.shape[1]) if y[:, k].any()]
    return float(np.mean([average_precision_score(y[:, k], scores[:, k]) for k in kept]))


def test_map_comparison_matches_sklearn_loops() -> None:
    rng = np.random.default_rng(4)
    n, classes = 90, 4
    y = rng.random((n, classes)) < 0.25
    y[:, 3] = False  # a class without positives is left out of mAP
    y[:2, 2], y[2:, 2] = True, False  # a rare class: some resamples lack it
    scores_a = np.round(y + rng.normal(0, 0.8, (n, classes)), 1).astype(np.float16)  # ties, float16
    scores_b = y + rng.normal(0, 1.2, (n, classes))
    result = compare_scores(y.astype(np.int8), scores_a, scores_b, n_resamples=40, n_permutations=50, seed=2)
    sa = scores_a.astype(np.float64)
    assert result.metric == "mAP" and result.test == "randomization"
    assert result.score_a == pytest.approx(_mean_ap(y, sa), rel=1e-12)
    assert result.score_b == pytest.approx(_mean_ap(y, scores_b), rel=1e-12)
    direct = [_mean_ap(y[i], sa[i]) - _mean_ap(y[i], scores_b[i]) for i in bootstrap_indices(n, 40, 2)]
    np.testing.assert_allclose(result.replicates, direct, atol=1e-12)
    swapped = []
    for s in swap_masks(n, 50, 2):
        taken = s[:, None]
        swapped.append(_mean_ap(y, np.where(taken, scores_b, sa)) - _mean_ap(y, np.where(taken, sa, scores_b)))
    assert result.p_value == pytest.approx(_p_randomization(np.array(swapped), result.difference), rel=1e-12)


def test_episode_comparison_matches_scipy_and_direct_bootstrap() -> None:
    rng = np.random.default_rng(5)
    acc_a = rng.uniform(0.5, 0.9, 100)
    acc_b = np.clip(acc_a - 0.02 + rng.normal(0, 0.05, 100), 0, 1)
    result = compare_episodes(acc_a, acc_b, n_resamples=150, seed=1)
    assert result.metric == "episode_accuracy" and result.test == "paired-t" and result.n == 100
    assert result.p_value == pytest.approx(stats.ttest_rel(acc_a, acc_b).pvalue, rel=1e-8)
    assert result.difference == pytest.approx(acc_a.mean() - acc_b.mean(), abs=1e-15)
    direct = [acc_a[i].mean() - acc_b[i].mean() for i in bootstrap_indices(100, 150, 1)]
    np.testing.assert_allclose(result.replicates, direct, atol=1e-12)


def test_fewshot_episodes_of_two_encoders_pair_up() -> None:
    # Same labels and seed: the same episodes for both feature sets, so accuracies pair up.
    rng = np.random.default_rng(6)
    labels = np.repeat(np.arange(8), 25)
    separated = np.eye(8)[labels] * 3 + rng.normal(0, 1, (200, 8))
    noisy = np.eye(8)[labels] * 0.5 + rng.normal(0, 1, (200, 8))
    kwargs = dict(n_way=5, n_shot=5, n_query=15, n_episodes=60, seed=11)
    good, poor = fewshot_episodes(separated, labels, **kwargs), fewshot_episodes(noisy, labels, **kwargs)
    result = compare_episodes(good.accuracies, poor.accuracies, n_resamples=200)
    assert result.difference > 0.2 and result.p_value < 1e-6 and result.ci_low > 0
    same = compare_episodes(good.accuracies, fewshot_episodes(separated, labels, **kwargs).accuracies)
    assert same.difference == 0.0 and same.p_value == 1.0 and same.ci_low == same.ci_high == 0.0


def test_identical_predictions_are_indistinguishable() -> None:
    y, a, _ = _classification()
    for metric in ("top1", "mean_per_class"):
        result = compare_predictions(y, a, a.copy(), metric, n_resamples=50, n_permutations=50)
        assert result.difference == 0.0 and result.p_value == 1.0 and result.ci_low == result.ci_high == 0.0


def test_clear_difference_is_detected_and_noise_is_not() -> None:
    y, a, b = _classification(n=2000, acc_a=0.8, acc_b=0.6, seed=9)
    clear = compare_predictions(y, a, b, n_resamples=200)
    assert clear.p_value < 1e-10 and clear.ci_low > 0.1
    y, a, b = _classification(n=2000, acc_a=0.7, acc_b=0.7, seed=10)
    noise = compare_predictions(y, a, b, n_resamples=200)
    assert noise.p_value > 0.05 and noise.ci_low < 0 < noise.ci_high


def test_seeded_and_deterministic() -> None:
    y, a, b = _classification()
    first = compare_predictions(y, a, b, "mean_per_class", n_resamples=100, n_permutations=100, seed=4)
    again = compare_predictions(y, a, b, "mean_per_class", n_resamples=100, n_permutations=100, seed=4)
    other = compare_predictions(y, a, b, "mean_per_class", n_resamples=100, n_permutations=100, seed=5)
    assert first == again and np.array_equal(first.replicates, again.replicates)
    assert not np.array_equal(first.replicates, other.replicates)
    json.dumps(first.to_dict())  # plain types only


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda y, a, b: compare_predictions(y, a, b[:-1]), r"pred_b has shape \(299,\).*same test examples"),
        (lambda y, a, b: compare_predictions(y, a.astype(float), b), "integer class indices"),
        (lambda y, a, b: compare_predictions(y[:0], a[:0], b[:0]), "empty"),
        (lambda y, a, b: compare_predictions(y, a, b, "f1"), r"Unknown metric 'f1'.*top1, mean_per_class"),
        (lambda y, a, b: compare_predictions(y, a, b, n_resamples=0), "n_resamples must be an integer >= 1"),
        (lambda y, a, b: compare_predictions(y, a, b, seed=-1), "seed must be an integer >= 0"),
        (lambda y, a, b: compare_predictions(y, a, b, confidence=95), "confidence"),
        (lambda y, a, b: compare_predictions(y, a, b, "mean_per_class", n_permutations=0), "n_permutations"),
        (lambda y, a, b: compare_predictions(y[:, None], a, b), "1-D"),
    ],
)
def test_classification_input_errors(call, message: str) -> None:
    y, a, b = _classification()
    with pytest.raises(DataValidationError, match=message):
        call(y, a, b)


def test_multilabel_and_episode_input_errors() -> None:
    y = np.array([[1, 0], [0, 1], [1, 1]])
    s = np.zeros((3, 2))
    with pytest.raises(DataValidationError, match=r"scores_b contains 1 NaN/inf.*\[\[2, 1\]\]"):
        compare_scores(y, s, np.where([[0, 0], [0, 0], [0, 1]], np.nan, 0.0))
    with pytest.raises(DataValidationError, match="same test examples"):
        compare_scores(y, s, s[:2])
    with pytest.raises(DataValidationError, match="0/1"):
        compare_scores(y * 2, s, s)
    with pytest.raises(DataValidationError, match="no positive"):
        compare_scores(np.zeros((3, 2)), s, s)
    with pytest.raises(DataValidationError, match=r"accuracies_b .*episode\(s\) \[1\]"):
        compare_episodes([0.5, 0.6, 0.7], [0.5, np.nan, 0.7])
    with pytest.raises(DataValidationError, match=r"accuracies_a .*\[1\]: \[60.0\]"):
        compare_episodes([0.5, 60.0], [0.5, 0.6])
    with pytest.raises(DataValidationError, match="same test examples"):
        compare_episodes([0.5, 0.6, 0.7], [0.5, 0.6])


def _comparison(difference: float, p_value: float) -> PairedComparison:
    return PairedComparison("top1", "mcnemar-exact", 0.5 + difference, 0.5, difference, difference - 0.01,
                            difference + 0.01, 0.95, p_value, 100, 10, 0, 0, 3, 2)


def test_verdicts_use_benjamini_hochberg_adjusted_p_values() -> None:
    p = [0.001, 0.02, 0.03, 0.04, 0.5, 0.012]
    diffs = [0.05, -0.03, 0.02, 0.01, 0.0, -0.04]
    cells = {("linear", f"ds{i}"): _comparison(d, q) for i, (d, q) in enumerate(zip(diffs, p))}
    cells[("fewshot-5", "ds0")] = _comparison(0.0, 1.0)
    verdicts = decide_verdicts(cells, alpha=0.05)
    adjusted = benjamini_hochberg(p + [1.0])
    assert [v.p_adjusted for v in verdicts.values()] == pytest.approx(adjusted.tolist(), rel=1e-12)
    expected = ["better" if q <= 0.05 and d > 0 else "worse" if q <= 0.05 and d < 0 else "indistinguishable"
                for q, d in zip(adjusted, diffs + [0.0])]
    assert [v.verdict for v in verdicts.values()] == expected
    # Raw 0.04 <= 0.05 but adjusted 7 * 0.04 / 5 > 0.05: BH keeps it indistinguishable.
    assert verdicts[("linear", "ds3")].verdict == "indistinguishable"
    assert decide_verdicts(cells, alpha=0.001)[("linear", "ds0")].verdict == "indistinguishable"

    summary = summarise_by_setting(verdicts)
    assert list(summary) == ["fewshot-5", "linear"]
    linear = summary["linear"]
    assert (linear.n_cells, linear.better, linear.worse, linear.indistinguishable) == (
        6, expected[:6].count("better"), expected[:6].count("worse"), expected[:6].count("indistinguishable"))
    assert linear.mean_difference == pytest.approx(np.mean(diffs), abs=1e-15)
    json.dumps([v.to_dict() for v in verdicts.values()] + [to_plain(s) for s in summary.values()])
    with pytest.raises(DataValidationError, match="alpha"):
        decide_verdicts(cells, alpha=1.5)
    with pytest.raises(DataValidationError, match="PairedComparison"):
        decide_verdicts({"x": 0.3})


def test_fingerprints_decide_what_can_be_paired() -> None:
    y = np.array([3, 1, 2, 0])
    assert labels_fingerprint(y) == labels_fingerprint(y.astype(np.int16)) == labels_fingerprint(list(y))
    assert labels_fingerprint(y) != labels_fingerprint(y[::-1])
    assert labels_fingerprint(y) != labels_fingerprint(y[:, None])
    assert labels_fingerprint(np.eye(2, dtype=bool)) == labels_fingerprint(np.eye(2, dtype=np.uint8))
    base = episodes_fingerprint(y, 0, 5, 5, 15, 600)
    assert base == episodes_fingerprint(y.astype(np.int32), 0, 5, 5, 15, 600)
    variants = [episodes_fingerprint(y, 1, 5, 5, 15, 600), episodes_fingerprint(y, 0, 4, 5, 15, 600),
                episodes_fingerprint(y, 0, 5, 20, 15, 600), episodes_fingerprint(y, 0, 5, 5, 10, 600),
                episodes_fingerprint(y, 0, 5, 5, 15, 300), episodes_fingerprint(y[::-1], 0, 5, 5, 15, 600)]
    assert len({base, *variants}) == 7
    check_paired(base, base)
    with pytest.raises(DataValidationError, match="not scored on the same test labels") as info:
        check_paired(labels_fingerprint(y), labels_fingerprint(y[::-1]))
    assert isinstance(info.value, (RepevalError, ValueError))
    with pytest.raises(DataValidationError, match="integers or booleans"):
        labels_fingerprint([0.5, 1.0])
