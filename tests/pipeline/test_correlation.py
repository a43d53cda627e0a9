"""Correlations across models in logit space (Ericsson et al. 2021, appendix A.7)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pipeline.analysis.correlation import (
    CorrelationResult,
    correlate_setting,
    logit,
    setting_scores,
    transfer_correlation,
)
from pipeline.errors import DataValidationError, RepevalError

REF = np.array([0.71, 0.76, 0.79, 0.81, 0.835, 0.85])
TGT = np.array([0.62, 0.70, 0.69, 0.77, 0.80, 0.83])


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1 - p))


def test_logit_matches_formula_and_clips() -> None:
    p = np.array([0.1, 0.5, 0.9])
    np.testing.assert_allclose(logit(p), _logit(p), rtol=1e-12)
    eps = 1e-6
    np.testing.assert_allclose(logit([0.0, 1.0]), [_logit(eps), _logit(1 - eps)], rtol=1e-12)
    np.testing.assert_allclose(logit([0.0, 1.0], eps=1e-3), [_logit(1e-3), _logit(1 - 1e-3)], rtol=1e-12)
    assert np.isfinite(logit([0.0, 1.0])).all()


def test_logit_refuses_percentages() -> None:
    with pytest.raises(DataValidationError, match=r"85.*percentages.*0\.85"):
        logit([0.5, 85.0])
    with pytest.raises(DataValidationError, match=r"-0\.2"):
        logit([-0.2])
    with pytest.raises(DataValidationError, match="non-finite"):
        logit([np.nan, 0.5])


def test_matches_scipy_on_logit_values() -> None:
    r = transfer_correlation(REF, TGT)
    assert isinstance(r, CorrelationResult)
    assert r.n == 6
    assert r.pearson == pytest.approx(stats.pearsonr(_logit(REF), _logit(TGT)).statistic, abs=1e-12)
    assert r.spearman == pytest.approx(stats.spearmanr(_logit(REF), _logit(TGT)).statistic, abs=1e-12)
    assert r.pearson_p == pytest.approx(stats.pearsonr(_logit(REF), _logit(TGT)).pvalue, rel=1e-9)
    assert r.pearson_ci is None and r.spearman_ci is None
    # the logit transform matters: Pearson differs from the raw one
    assert r.pearson != pytest.approx(stats.pearsonr(REF, TGT).statistic, abs=1e-6)


def test_unbounded_and_reference_bounded() -> None:
    raw = np.array([3.0, 1.0, 4.0, 1.5, 9.0, 2.6])
    r = transfer_correlation(REF, raw, bounded=False, reference_bounded=True)
    assert r.pearson == pytest.approx(stats.pearsonr(_logit(REF), raw).statistic, abs=1e-12)
    r2 = transfer_correlation(raw, raw * 2 + 1, bounded=False)
    assert r2.pearson == pytest.approx(1.0)


def test_lower_is_better_negates() -> None:
    ece = np.array([0.09, 0.07, 0.08, 0.05, 0.04, 0.03])
    r = transfer_correlation(REF, ece, lower_is_better=True)
    assert r.pearson == pytest.approx(stats.pearsonr(_logit(REF), -_logit(ece)).statistic, abs=1e-12)
    assert r.pearson > 0
    plain = transfer_correlation(REF, ece)
    assert plain.pearson == pytest.approx(-r.pearson, abs=1e-12)
    assert plain.spearman == pytest.approx(-r.spearman, abs=1e-12)


def test_mappings_align_by_model() -> None:
    names = [f"m{i}" for i in range(6)]
    ref = dict(zip(names, REF))
    tgt = dict(zip(reversed(names), TGT[::-1]))  # other order, same pairs
    assert transfer_correlation(ref, tgt).pearson == pytest.approx(transfer_correlation(REF, TGT).pearson)
    del tgt["m3"]
    with pytest.raises(DataValidationError, match=r"only in reference: \['m3'\]"):
        transfer_correlation(ref, tgt)


@pytest.mark.parametrize(
    ("ref", "tgt", "pattern"),
    [
        (REF, TGT[:5], "reference has 6 models but target has 5"),
        (REF[:2], TGT[:2], "at least 3 models, got 2"),
        (REF, np.full(6, 0.8), r"target is the same for all 6 models"),
        (REF * 100, TGT, "percentages"),
        (REF, np.append(TGT[:5], np.nan), "non-finite"),
        (REF.reshape(2, 3), TGT.reshape(2, 3), r"1-D"),
    ],
)
def test_input_errors(ref: np.ndarray, tgt: np.ndarray, pattern: str) -> None:
    with pytest.raises(DataValidationError, match=pattern) as info:
        transfer_correlation(ref, tgt)
    assert isinstance(info.value, (RepevalError, ValueError))


def test_bootstrap_ci_brackets_and_is_deterministic() -> None:
    rng = np.random.default_rng(1)
    ref = rng.uniform(0.6, 0.9, 20)
    tgt = np.clip(ref + rng.normal(0, 0.03, 20), 0.01, 0.99)
    a = transfer_correlation(ref, tgt, n_bootstrap=500, seed=3)
    b = transfer_correlation(ref, tgt, n_bootstrap=500, seed=3)
    c = transfer_correlation(ref, tgt, n_bootstrap=500, seed=4)
    assert a.pearson_ci == b.pearson_ci and a.spearman_ci == b.spearman_ci
    assert a.pearson_ci != c.pearson_ci
    assert a.pearson_ci[0] <= a.pearson <= a.pearson_ci[1]
    assert a.spearman_ci[0] <= a.spearman <= a.spearman_ci[1]
    assert -1 <= a.pearson_ci[0] < a.pearson_ci[1] <= 1
    assert 0 < a.n_bootstrap_used <= 500
    # the vectorised bootstrap statistic agrees with scipy on one resample
    idx = np.random.default_rng(3).integers(0, 20, size=(500, 20))
    lr, lt = _logit(ref), _logit(tgt)
    first = idx[0]
    if np.ptp(lr[first]) > 0 and np.ptp(lt[first]) > 0:
        from pipeline.analysis.correlation import _rowwise_pearson

        got = _rowwise_pearson(lr[idx[:1]], lt[idx[:1]])[0]
        assert got == pytest.approx(stats.pearsonr(lr[first], lt[first]).statistic, abs=1e-12)
    with pytest.raises(DataValidationError, match="n_bootstrap"):
        transfer_correlation(ref, tgt, n_bootstrap=-1)


def _table() -> tuple[dict, dict, list[str]]:
    models = ["a", "b", "c", "d"]
    datasets = ["pets", "flowers", "cars"]
    rng = np.random.default_rng(0)
    scores = {(m, d): float(rng.uniform(0.4, 0.95)) for m in models for d in datasets}
    scores[("a", "other")] = 0.5  # outside the setting: ignored
    reference = {"a": 0.70, "b": 0.75, "c": 0.80, "d": 0.84, "unused": 0.9}
    return scores, reference, datasets


def test_setting_scores_average_logits() -> None:
    scores, _, datasets = _table()
    out = setting_scores(scores, datasets)
    assert list(out) == ["a", "b", "c", "d"]
    for m, v in out.items():
        assert v == pytest.approx(np.mean([_logit(scores[(m, d)]) for d in datasets]), abs=1e-12)
    raw = setting_scores(scores, datasets, bounded=False)
    assert raw["b"] == pytest.approx(np.mean([scores[("b", d)] for d in datasets]))


def test_setting_scores_names_missing_dataset() -> None:
    scores, _, datasets = _table()
    del scores[("c", "flowers")]
    with pytest.raises(DataValidationError, match=r"c lacks \['flowers'\]"):
        setting_scores(scores, datasets)
    with pytest.raises(DataValidationError, match="at least one dataset"):
        setting_scores(scores, [])
    with pytest.raises(DataValidationError, match=r"repeated: \['pets'\]"):
        setting_scores(scores, ["pets", "pets"])


def test_correlate_setting_per_setting_and_dataset() -> None:
    scores, reference, datasets = _table()
    res = correlate_setting(reference, scores, datasets)
    models = ["a", "b", "c", "d"]
    ref_l = _logit(np.array([reference[m] for m in models]))
    summary = [np.mean([_logit(scores[(m, d)]) for d in datasets]) for m in models]
    assert res.models == tuple(models)
    assert res.setting.n == 4
    assert res.setting.pearson == pytest.approx(stats.pearsonr(ref_l, summary).statistic, abs=1e-12)
    assert res.setting.spearman == pytest.approx(stats.spearmanr(ref_l, summary).statistic, abs=1e-12)
    assert set(res.per_dataset) == set(datasets)
    for d in datasets:
        tgt = _logit(np.array([scores[(m, d)] for m in models]))
        assert res.per_dataset[d].pearson == pytest.approx(stats.pearsonr(ref_l, tgt).statistic, abs=1e-12)
    records = res.to_records()
    assert len(records) == 1 + len(datasets) and records[0]["dataset"] is None

    neg = correlate_setting(reference, scores, datasets, lower_is_better=True)
    assert neg.setting.pearson == pytest.approx(-res.setting.pearson, abs=1e-12)

    del reference["b"]
    with pytest.raises(DataValidationError, match=r"no score for 1 model\(s\): \['b'\]"):
        correlate_setting(reference, scores, datasets)
