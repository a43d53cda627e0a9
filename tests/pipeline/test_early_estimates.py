"""The early pass's statistics against direct formulas: row choice, the stratified estimator
and its interval, jackknife+ (written out by brute force), the paired estimate, the
leave-one-out trial a history line must pass, early verdicts and coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pipeline.analysis.early import (
    Estimate, HistoryModel, LineTrial, PairedHistoryModel, allocate, anchor_rows, coverage_state,
    detectable_difference, early_verdict, gross_miss, jackknife_plus, line_trial, min_history, stratified_change,
    stratified_estimate, stratified_rows, weighted_accuracy,
)
from pipeline.errors import DataValidationError

LABELS = np.repeat(np.arange(5), [60, 40, 30, 20, 3])


def test_allocation_is_proportional_with_a_floor_and_a_cap():
    take = allocate(np.array([60, 40, 30, 20, 3]), 30, minimum=2)
    assert take.sum() == 30 and take.tolist() == [11, 7, 6, 4, 2]
    assert allocate(np.array([1, 50]), 4, minimum=2).tolist() == [1, 3]  # a class of one row keeps it
    assert allocate(np.array([5, 5]), 100).tolist() == [5, 5]  # never more rows than there are
    assert allocate(np.array([10, 10, 10]), 1, minimum=2).sum() == 6  # the floors outrank the size


def test_stratified_rows_are_seeded_sorted_unique_and_keep_every_class():
    rows = stratified_rows(LABELS, 30, seed=3)
    assert rows.tolist() == sorted(set(rows.tolist()))
    assert np.array_equal(rows, stratified_rows(LABELS, 30, seed=3))
    assert not np.array_equal(rows, stratified_rows(LABELS, 30, seed=4))
    assert np.bincount(LABELS[rows], minlength=5).tolist() == allocate(np.bincount(LABELS), 30).tolist()
    multi = (np.random.default_rng(0).random((50, 4)) < 0.3).astype(int)
    assert len(stratified_rows(multi, 10, 0)) == 10  # multi-label: one stratum
    with pytest.raises(DataValidationError, match="size"):
        stratified_rows(LABELS, 0, 0)


def test_anchor_weights_stand_for_every_row_of_their_class():
    rng = np.random.default_rng(0)
    profiles = (rng.random((len(LABELS), 8)) < 0.7).astype(float)
    rows, weights = anchor_rows(profiles, LABELS, 30, seed=1)
    assert rows.tolist() == sorted(set(rows.tolist()))
    for c in range(5):
        assert weights[LABELS[rows] == c].sum() == pytest.approx(np.sum(LABELS == c))
    assert weights.sum() == pytest.approx(len(LABELS))


def test_anchors_estimate_exactly_a_result_their_clusters_determine():
    # two kinds of images per class: every earlier encoder right, or every one wrong; a new
    # encoder that behaves the same is estimated exactly from one anchor per kind
    kind = np.arange(len(LABELS)) % 3 == 0
    profiles = np.repeat(kind[:, None].astype(float), 6, axis=1)
    rows, weights = anchor_rows(profiles, LABELS, 10, seed=0)
    assert weighted_accuracy(kind[rows], weights) == pytest.approx(kind.mean())


def _direct_stratified(correct, strata, population, level):
    total = sum(population.values())
    p, var = 0.0, 0.0
    for c, n_pop in population.items():
        x = correct[strata == c]
        w = n_pop / total
        ph = x.mean()
        s2 = ph * (1 - ph) * len(x) / (len(x) - 1)
        p += w * ph
        var += w * w * (1 - len(x) / n_pop) * s2 / len(x)
    return p, var


def test_stratified_estimate_is_the_textbook_estimator_with_a_wilson_interval():
    rng = np.random.default_rng(1)
    rows = stratified_rows(LABELS, 60, seed=0)
    correct = (rng.random(len(rows)) < 0.7).astype(int)
    population = {int(c): int(n) for c, n in enumerate(np.bincount(LABELS))}
    est = stratified_estimate(correct, LABELS[rows], population, level=0.9)
    p, var = _direct_stratified(correct, LABELS[rows], population, 0.9)
    assert est.value == pytest.approx(p)
    n_eff, z = p * (1 - p) / var, stats.norm.ppf(0.95)
    centre = (p + z * z / (2 * n_eff)) / (1 + z * z / n_eff)
    half = z / (1 + z * z / n_eff) * math.sqrt(p * (1 - p) / n_eff + z * z / (4 * n_eff ** 2))
    assert (est.low, est.high) == pytest.approx((centre - half, centre + half))
    assert est.method == "sampling" and est.n == len(rows) and "sampling" in est.covers


def test_stratified_change_is_the_stratified_mean_of_paired_differences():
    rng = np.random.default_rng(4)
    rows = stratified_rows(LABELS, 60, seed=1)
    a = (rng.random(len(rows)) < 0.7).astype(int)
    b = np.where(rng.random(len(rows)) < 0.8, a, 1 - a)  # mostly the same rows right
    population = {int(c): int(n) for c, n in enumerate(np.bincount(LABELS))}
    change, low, high = stratified_change(a, b, LABELS[rows], population, level=0.9)
    # the textbook stratified estimator of the mean of d = a - b, with its variance
    total, mean, var = sum(population.values()), 0.0, 0.0
    for c, n_pop in population.items():
        d = (a - b)[LABELS[rows] == c]
        w = n_pop / total
        mean += w * d.mean()
        var += w * w * (1 - d.size / n_pop) * (d.var(ddof=1) if d.size > 1 else 1.0) / d.size
    z = stats.norm.ppf(0.95)
    assert change == pytest.approx(mean)
    assert (low, high) == pytest.approx((mean - z * math.sqrt(var), mean + z * math.sqrt(var)))
    # it equals the difference of the two stratified estimates, and is narrower than either
    ea, eb = (stratified_estimate(v, LABELS[rows], population, 0.9) for v in (a, b))
    assert change == pytest.approx(ea.value - eb.value)
    assert high - low < min(ea.high - ea.low, eb.high - eb.low) * 2
    with pytest.raises(DataValidationError, match="0 or 1"):
        stratified_change(a, b * 2, LABELS[rows], population)


def test_a_census_has_no_sampling_error_and_mean_per_class_weighs_classes_alike():
    correct = (np.arange(len(LABELS)) % 4 != 0).astype(int)
    population = {int(c): int(n) for c, n in enumerate(np.bincount(LABELS))}
    est = stratified_estimate(correct, LABELS, population)
    assert est.low == est.value == est.high == pytest.approx(correct.mean())
    mpc = stratified_estimate(correct, LABELS, population, mean_per_class=True)
    assert mpc.value == pytest.approx(np.mean([correct[LABELS == c].mean() for c in range(5)]))


def test_stratified_interval_covers_at_about_its_level():
    rng = np.random.default_rng(2)
    truth = (rng.random(len(LABELS)) < np.where(LABELS < 2, 0.85, 0.55)).astype(int)
    population = {int(c): int(n) for c, n in enumerate(np.bincount(LABELS))}
    hits = 0
    for seed in range(400):
        rows = stratified_rows(LABELS, 40, seed=seed)
        hits += stratified_estimate(truth[rows], LABELS[rows], population, 0.9).contains(truth.mean())
    assert hits / 400 >= 0.86  # 90 % nominal; a Wilson interval is close to it here


def test_stratified_estimate_refuses_bad_input():
    with pytest.raises(DataValidationError, match="0 or 1"):
        stratified_estimate(np.array([0.5]), np.array([0]), {0: 3})
    with pytest.raises(DataValidationError, match="every class"):
        stratified_estimate(np.array([1, 0]), np.array([0, 0]), {0: 3, 1: 4})
    with pytest.raises(DataValidationError, match="level"):
        stratified_estimate(np.array([1, 0]), np.array([0, 0]), {0: 3}, level=1.0)


def _jackknife_plus_by_hand(x, y, x_new, level):
    n = len(x)
    lows, highs = [], []
    for i in range(n):
        keep = np.arange(n) != i
        slope, intercept = np.polyfit(x[keep], y[keep], 1)
        r = abs(y[i] - (intercept + slope * x[i]))
        mu = intercept + slope * x_new
        lows.append(mu - r)
        highs.append(mu + r)
    lo_rank = math.floor((1 - level) * (n + 1) + 1e-9)
    hi_rank = math.ceil(level * (n + 1) - 1e-9)
    return sorted(lows)[lo_rank - 1], sorted(highs)[hi_rank - 1]


def test_jackknife_plus_matches_its_definition():
    rng = np.random.default_rng(3)
    x = rng.normal(size=15)
    y = 0.5 + 2 * x + rng.normal(scale=0.3, size=15)
    mu, low, high = jackknife_plus(x, y, 0.4, 0.9)
    slope, intercept = np.polyfit(x, y, 1)
    assert mu == pytest.approx(intercept + slope * 0.4)
    assert (low, high) == pytest.approx(_jackknife_plus_by_hand(x, y, 0.4, 0.9))
    assert min_history(0.9) == 9 and min_history(0.8) == 4
    with pytest.raises(DataValidationError, match="needs 9 points"):
        jackknife_plus(x[:8], y[:8], 0.0, 0.9)


def test_history_model_works_on_the_logit_scale_and_covers_exchangeable_encoders():
    rng = np.random.default_rng(4)

    def draw(n):
        quality = rng.normal(size=n)
        early = 1 / (1 + np.exp(-(quality + rng.normal(scale=0.15, size=n))))
        full = 1 / (1 + np.exp(-(0.8 + 1.2 * quality + rng.normal(scale=0.1, size=n))))
        return early, full

    hits = 0
    for _ in range(150):
        early, full = draw(13)
        est = HistoryModel.fit(early[:12], full[:12]).predict(float(early[12]))
        hits += est.contains(float(full[12]))
        assert 0 < est.low <= est.value <= est.high < 1 and est.method == "history" and est.n == 12
    assert hits / 150 >= 0.85  # jackknife+ is valid at 1 - 2 alpha in the worst case, near 1 - alpha here
    with pytest.raises(DataValidationError, match="needs 10 earlier encoders"):
        HistoryModel.fit(early[:5], full[:5])
    with pytest.raises(DataValidationError, match="fractions"):
        HistoryModel.fit(np.full(12, 1.5), full[:12])


def test_paired_estimate_is_the_reference_plus_the_predicted_change():
    rng = np.random.default_rng(5)
    early_before = rng.uniform(0.3, 0.7, 12)
    early_after = early_before + rng.uniform(0.0, 0.05, 12)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    change = 1.5 * (logit(early_after) - logit(early_before))
    full_before = rng.uniform(0.5, 0.8, 12)
    full_after = 1 / (1 + np.exp(-(logit(full_before) + change)))
    model = PairedHistoryModel.fit(early_before, early_after, full_before, full_after)
    est = model.predict(0.55, 0.5, 0.7)
    expected = 1 / (1 + np.exp(-(logit(0.7) + 1.5 * (logit(0.55) - logit(0.5)))))
    assert est.value == pytest.approx(expected, abs=1e-9)  # noise-free pairs: the change is exact
    assert est.low == pytest.approx(expected, abs=1e-9) and est.high == pytest.approx(expected, abs=1e-9)
    assert est.method == "paired"


def _estimate(low, high, method="history"):
    return Estimate((low + high) / 2, low, high, 0.9, method, 12, "")


@pytest.mark.parametrize("method, low, high, difference, p, verdict", [
    ("history", 0.80, 0.85, None, None, "better"),  # a calibrated interval above: enough
    ("paired", 0.60, 0.65, -0.05, 0.9, "worse"),  # the early rows' test is not needed
    # the early rows' own significant test decides a calibrated estimate's verdict, even where
    # the interval holds the other figure, or says the opposite (a loss spike the history never saw)
    ("history", 0.68, 0.75, -0.05, 0.001, "worse"),
    ("paired", 0.72, 0.77, -0.30, 1e-5, "worse"),
    ("history", 0.80, 0.85, -0.02, 0.40, "indistinguishable"),  # the early rows lean the other way
    ("history", 0.68, 0.75, -0.05, 0.20, "indistinguishable"),  # the interval holds it, no significant test
    ("sampling", 0.80, 0.85, 0.05, 0.01, "better"),  # sampling: the interval and the paired test
    ("sampling", 0.60, 0.65, -0.05, 0.20, "indistinguishable"),  # the interval alone is not enough
    ("sampling", 0.60, 0.65, 0.05, 0.01, "indistinguishable"),  # the test points the other way
    ("sampling", 0.60, 0.65, None, None, "no verdict"),  # no test made: nothing backs the sampling interval
])
def test_an_early_verdict_is_drawn_only_where_the_interval_allows(method, low, high, difference, p, verdict):
    got, why = early_verdict(_estimate(low, high, method), 0.7, difference=difference, p_adjusted=p)
    assert got == verdict, why


def test_early_verdicts_keep_the_no_verdict_rules():
    est = _estimate(0.6, 0.65, "sampling")
    assert early_verdict(est, 0.7, difference=-0.05, p_adjusted=0.001,
                         unreliable="B grid_edge: C at the edge") == ("unreliable", "B grid_edge: C at the edge")
    assert early_verdict(Estimate(0.6, None, None, 0.9, "history", 3, ""), 0.7, difference=-0.1,
                         p_adjusted=0.0)[0] == "no verdict"
    assert early_verdict(est, 0.7, difference=None, p_adjusted=None)[0] == "no verdict"
    # lower is better: an interval below the other's figure is an improvement
    assert early_verdict(est, 0.7, difference=-0.05, p_adjusted=0.001, higher_is_better=False)[0] == "better"


def test_the_detectable_difference_is_where_mcnemars_test_turns_significant():
    n, discordant = 1000, 0.12  # 120 images right for one encoder only
    margin = detectable_difference(discordant, n)
    assert margin == pytest.approx(1.959964 * math.sqrt(discordant / n), rel=1e-6)
    # b - c = margin * n of the 120 discordant images: McNemar's statistic (no continuity
    # correction) is then at the 5 % critical value
    diff = margin * n
    b, c = (120 + diff) / 2, (120 - diff) / 2
    assert stats.chi2.sf((b - c) ** 2 / (b + c), 1) == pytest.approx(0.05, rel=1e-4)
    with pytest.raises(ValueError, match="discordant"):
        detectable_difference(1.5, n)


def test_an_early_verdict_too_close_for_the_exact_test_says_so():
    est = _estimate(0.72, 0.78, "paired")  # surely above 0.7, by 0.02 at least
    got, why = early_verdict(est, 0.7, difference=None, p_adjusted=None, detectable=0.01)
    assert got == "better" and "exact test" not in why, why
    got, why = early_verdict(est, 0.7, difference=None, p_adjusted=None, detectable=0.03)
    assert got == "better" and "by less than the 0.03 the exact test could find" in why, why
    got, why = early_verdict(_estimate(0.60, 0.66, "history"), 0.7, difference=None, p_adjusted=None,
                             detectable=0.05)
    assert got == "worse" and "the exact verdict may be indistinguishable" in why, why


def test_coverage_turns_the_pass_off_only_when_a_test_says_it_is_below_nominal():
    assert not coverage_state([True] * 9 + [False], 0.9).off  # exactly nominal
    assert not coverage_state([True] * 5 + [False] * 4, 0.9).off  # too few checks to say
    state = coverage_state([True] * 14 + [False] * 6, 0.9)
    assert state.off and state.p_below == pytest.approx(stats.binom.cdf(14, 20, 0.9))
    assert "early pass off" in state.line() and state.rate == pytest.approx(0.7)
    assert coverage_state([], 0.9).line().startswith("no early estimate checked")


def test_a_calibrated_verdict_overruled_by_the_early_rows_says_why():
    got, why = early_verdict(_estimate(0.67, 0.78, "paired"), 0.7, difference=-0.30, p_adjusted=1e-5)
    assert got == "worse" and "which decides" in why and "holds 0.7" in why, why
    got, why = early_verdict(_estimate(0.60, 0.65, "history"), 0.7, difference=-0.05, p_adjusted=0.001)
    assert got == "worse" and "agrees" in why, why


def test_a_history_line_is_not_read_far_beyond_what_it_was_fitted_on():
    rng = np.random.default_rng(9)
    early_before = rng.uniform(0.5, 0.7, 12)
    early_after = 1 / (1 + np.exp(-(np.log(early_before / (1 - early_before)) + rng.uniform(-0.04, 0.16, 12))))
    model = PairedHistoryModel.fit(early_before, early_after, early_before + 0.1, early_after + 0.1)
    logit = lambda p: float(np.log(p / (1 - p)))  # noqa: E731
    seen = [logit(a) - logit(b) for a, b in zip(early_after, early_before)]
    assert model.outside(0.61, 0.6) is None  # a change like earlier ones
    inside = 1 / (1 + np.exp(-(logit(0.6) + max(seen) + 0.2 * (max(seen) - min(seen)))))
    assert model.outside(float(inside), 0.6) is None  # a little past the best change: the margin
    why = model.outside(0.45, 0.6)  # a loss spike: far below every earlier change
    assert why is not None and "outside the range the history saw" in why
    history = HistoryModel.fit(early_before, early_before + 0.1)
    assert history.outside(0.6) is None and history.outside(0.2) is not None


def test_a_gross_miss_sets_the_calibration_aside_until_an_interval_holds():
    assert gross_miss(0.67, 0.78, 0.40) and not gross_miss(0.67, 0.78, 0.60) and not gross_miss(None, None, 0.1)
    state = coverage_state([True, True, False], 0.9, gross=[False, False, True])
    assert state.tripped and not state.off and "calibrated estimates off" in state.line()
    assert coverage_state([True, False, False], 0.9, gross=[False, True, False]).tripped  # not held since
    assert not coverage_state([True, False, True], 0.9, gross=[False, True, False]).tripped  # held again
    assert not coverage_state([True, False], 0.9, gross=[False, False]).tripped  # a near miss: coverage decides


def _plain(values, half=0.02):
    """Plain early-row estimates of the given values, each with a fixed interval."""
    return [Estimate(float(v), float(v) - half, float(v) + half, 0.9, "sampling", 100, "") for v in values]


def test_a_history_line_that_predicts_well_is_kept():
    rng = np.random.default_rng(10)
    early = rng.uniform(0.5, 0.85, 30)
    # the early fit, on a tenth of the train rows, scores below the full one: a gap the line
    # learns and the plain estimate of the early fit cannot
    full = np.clip(early + 0.04 + rng.normal(scale=0.003, size=30), 0, 1)
    model = HistoryModel.fit(early, full)
    loo = model.leave_one_out()
    assert len(loo) == 30 and all(e.method == "history" and e.n == 29 and e.has_interval for e in loo)
    trial = line_trial(loo, _plain(early), full)
    assert trial.kept and trial.error < 0.005 < 0.03 < trial.plain_error
    assert sum(trial.covered) >= 25 and len(trial.plain_covered) == 30
    assert trial.line().startswith(f"leave-one-out error {100 * trial.error:.1f} points vs plain "
                                   f"{100 * trial.plain_error:.1f} points, its intervals held"), trial.line()


def test_a_useless_history_line_is_set_aside():
    rng = np.random.default_rng(11)
    # the full figure independent of the early score (the line flat), the plain estimate close to it
    early, full = rng.uniform(0.5, 0.85, 20), rng.uniform(0.6, 0.8, 20)
    trial = line_trial(HistoryModel.fit(early, full).leave_one_out(), _plain(full + rng.normal(0, 0.01, 20)), full)
    assert not trial.kept and trial.error > trial.plain_error
    assert trial.line().startswith("history line set aside: leave-one-out error"), trial.line()
    # the spiked series: every full change about +4.5 points whatever the early change (slope
    # about 0, intercept +4.5 points), while each plain estimate lies within a point of its figure
    early_before, full_before = rng.uniform(0.6, 0.7, 14), rng.uniform(0.6, 0.7, 14)
    early_after = early_before + rng.uniform(-0.05, 0.05, 14)
    full_after = full_before + 0.045 + rng.normal(scale=0.015, size=14)
    model = PairedHistoryModel.fit(early_before, early_after, full_before, full_after)
    loo = model.leave_one_out()
    assert all(e.method == "paired" and e.n == 13 for e in loo)
    trial = line_trial(loo, _plain(full_after + rng.normal(scale=0.003, size=14)), full_after)
    assert not trial.kept and trial.plain_error < 0.005 < trial.error
    assert trial.line().startswith("paired line set aside: leave-one-out error"), trial.line()


def _two_point_line(xa, ya, xb, yb, x):
    return ya + (yb - ya) / (xb - xa) * (x - xa)


def test_leave_one_out_errors_are_the_direct_formula_on_a_tiny_history():
    # three points: each left out is predicted by the line through the other two; at level
    # 0.5 the two others' jackknife+ interval runs from the lower of their figures minus
    # their distance to the higher plus it (each left out in turn leaves a flat line)
    x, y = np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0, 4.0])
    model = HistoryModel.fit(x, y, bounded=False, level=0.5, minimum=3)
    loo = model.leave_one_out()
    for i, est in enumerate(loo):
        a, b = [j for j in range(3) if j != i]
        assert est.value == pytest.approx(_two_point_line(x[a], y[a], x[b], y[b], x[i]))
        d = abs(y[a] - y[b])
        assert (est.low, est.high) == pytest.approx((min(y[a], y[b]) - d, max(y[a], y[b]) + d))
    plain = [Estimate(float(v), float(v) - 0.5, float(v) + 0.5, 0.5, "sampling", 10, "") for v in x]
    trial = line_trial(loo, plain, y, bounded=False)
    assert trial.errors == pytest.approx((2.0, 1.0, 2.0)) and trial.plain_errors == pytest.approx((0.0, 0.0, 2.0))
    assert trial.covered == (True, True, False) and trial.plain_covered == (True, True, False)
    assert (trial.error, trial.plain_error) == pytest.approx((2.0, 0.0)) and not trial.kept
    assert trial.line() == "history line set aside: leave-one-out error 2 vs plain 0, its intervals held 2 of 3"
    # the paired line: the older checkpoint's exact figure plus the change the other pairs predict
    paired = PairedHistoryModel.fit(np.zeros(3), x, np.full(3, 10.0), 10 + y, bounded=False, level=0.5, minimum=3)
    assert [e.value for e in paired.leave_one_out()] == pytest.approx([10 + e.value for e in loo])


def test_a_line_whose_leave_one_out_intervals_clearly_undercover_is_set_aside():
    trial = LineTrial("history", (0.01,) * 12, (0.02,) * 12, (True,) * 7 + (False,) * 5, (), 0.9)
    assert trial.undercovered and not trial.kept  # 7 of 12 at 90 %: binomial p = 0.004
    assert trial.line() == ("history line set aside: leave-one-out error 1.0 points vs plain 2.0 points, its "
                            "intervals held 7 of 12 (below nominal 90%)")
    assert LineTrial("history", (0.01,) * 12, (0.02,) * 12, (True,) * 10 + (False,) * 2, (), 0.9).kept
    with pytest.raises(DataValidationError, match="one prediction"):
        line_trial([], [], [])
