"""One story per comparison: the deciding test's own interval (exact McNemar, checked against
scipy's Clopper-Pearson interval) and the line that explains a bootstrap interval that reads
differently from the verdict (the case of a lab: +7.55 points, bootstrap [1.89, 15.09], 4
discordant images of 53, McNemar p = 0.125, "indistinguishable")."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pipeline.analysis.compare import PairedComparison, compare_predictions, decide_verdicts, mcnemar_exact
from pipeline.analysis.compare.agreement import agreement_line, decided_by, mcnemar_interval


def _comparison(**kw) -> PairedComparison:
    base = dict(metric="top1", test="mcnemar-exact", score_a=0.6604, score_b=0.5849, difference=0.0755,
                ci_low=0.0189, ci_high=0.1509, confidence=0.95, p_value=0.125, n=53, n_resamples=1000,
                n_permutations=0, seed=0, a_only=4, b_only=0)
    return PairedComparison(**{**base, **kw})


@pytest.mark.parametrize("a_only, b_only, n", [(4, 0, 53), (30, 12, 200), (7, 7, 90), (0, 5, 40), (12, 3, 60)])
def test_the_exact_interval_is_clopper_pearson_and_excludes_zero_exactly_when_mcnemar_rejects(a_only, b_only, n):
    low, high = mcnemar_interval(a_only, b_only, n, 0.95)
    m = a_only + b_only
    ci = stats.binomtest(a_only, m).proportion_ci(confidence_level=0.95, method="exact")
    assert (low, high) == pytest.approx((m / n * (2 * ci.low - 1), m / n * (2 * ci.high - 1)), rel=1e-9, abs=1e-12)
    assert low <= (a_only - b_only) / n <= high
    assert (low > 0 or high < 0) == (mcnemar_exact(a_only, b_only) < 0.05)
    assert mcnemar_interval(0, 0, n, 0.95) == (0.0, 0.0)


def test_the_lab_case_gets_its_line_and_the_exact_interval_includes_zero():
    c = _comparison()
    assert mcnemar_exact(4, 0) == pytest.approx(0.125)
    how = decided_by(c, "indistinguishable", 0.125, 0.05)
    assert how["test_ci_low"] < 0 < how["test_ci_high"]  # the test's own interval agrees with its verdict
    line = how["agreement"]
    assert line.startswith("why these differ: the 95 % interval is a bootstrap interval of the difference")
    assert "exact McNemar test on the 4 of 53 images where the two disagree (4 only A right, 0 only B right)" in line
    assert "p = 0.125" in line and "> 0.05" in line


def test_no_line_where_interval_and_verdict_agree_and_none_for_an_untrusted_cell():
    assert agreement_line(_comparison(p_value=0.001), "better", 0.002, 0.05) is None
    assert agreement_line(_comparison(ci_low=-0.01), "indistinguishable", 0.125, 0.05) is None
    assert agreement_line(_comparison(), "unreliable", float("nan"), 0.05) is None
    significant_but_reaching_zero = agreement_line(_comparison(ci_low=-0.001, test="paired-t", a_only=None,
                                                               b_only=None, n=60), "better", 0.01, 0.05)
    assert "paired t test over the 60 episodes" in significant_but_reaching_zero


def test_real_comparisons_agree_or_say_why():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=53)
    for trial in range(40):
        a = np.where(rng.random(53) < 0.7, y, (y + 1) % 3)
        b = np.where(rng.random(53) < 0.6, y, (y + 2) % 3)
        c = compare_predictions(y, a, b, n_resamples=300, seed=trial)
        [v] = decide_verdicts({"cell": c}, 0.05).values()
        how = decided_by(c, v.verdict, v.p_adjusted, 0.05)
        excludes = c.ci_low > 0 or c.ci_high < 0
        assert (how["agreement"] is None) == (excludes == (v.verdict in ("better", "worse")))
        test_excludes = how["test_ci_low"] > 0 or how["test_ci_high"] < 0
        assert test_excludes == (v.p_adjusted < 0.05)  # one cell: adjusted = raw p, the test's interval agrees


def test_the_line_names_the_reason_that_holds():
    # the adjustment over the other cells, not the test, leaves it undecided
    adjusted = agreement_line(_comparison(p_value=0.02), "indistinguishable", 0.08, 0.05)
    assert "the test alone would call it (p = 0.02 <= 0.05)" in adjusted and "too few" not in adjusted
    # a 95 % interval beside a verdict held to alpha 0.01: the stricter level, not the discordant images
    stricter = agreement_line(_comparison(p_value=0.03), "indistinguishable", 0.03, 0.01)
    assert "the interval is at 95 %, the verdict at the stricter alpha 0.01" in stricter and "too few" not in stricter
    # the lab case: the test itself does not reject on its 4 discordant images
    few = agreement_line(_comparison(), "indistinguishable", 0.125, 0.05)
    assert "the test counts only the 4 discordant images, too few to call it" in few
    # a 99 % interval reaching 0 beside a verdict at 0.05: the interval's stricter level
    reaching = agreement_line(_comparison(confidence=0.99, ci_low=-0.002, p_value=0.01), "better", 0.01, 0.05)
    assert "is at a stricter level than alpha 0.05" in reaching
