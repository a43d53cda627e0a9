"""The correlation job on synthetic ledger records shaped like those evaluate.py writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from jobs.analysis.correlate import correlate_results, current_records, measured_reference
from pipeline.errors import DataValidationError
from tests.helpers.records import (
    DATASETS, MODELS, linear_records, logistic_metrics, make_config, make_record, synthetic_scores,
)

def _logit(p):
    p = np.asarray(p, dtype=float)
    return np.log(p / (1 - p))


def test_matches_scipy_on_logit_means():
    ref, acc = synthetic_scores(MODELS)
    report = correlate_results(linear_records(acc), make_config(MODELS), ref)
    s = report.setting("many-shot linear")
    assert s.status == "ok" and s.n == len(MODELS) and not s.excluded
    models = s.models
    x = _logit([ref[m] for m in models])
    y = np.array([np.mean(_logit([acc[(m, d)] for d in DATASETS])) for m in models])
    assert s.setting["pearson"] == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-12)
    assert s.setting["spearman"] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert s.setting["n"] == len(MODELS)
    for d in DATASETS:
        yd = _logit([acc[(m, d)] for m in models])
        assert s.per_dataset[d]["pearson"] == pytest.approx(stats.pearsonr(x, yd).statistic, abs=1e-12)
        assert s.per_dataset[d]["spearman"] == pytest.approx(stats.spearmanr(x, yd).statistic, abs=1e-12)
    assert s.setting_scores == pytest.approx(dict(zip(models, y)))
    assert s.reference_logit == pytest.approx(dict(zip(models, x)))
    lo, hi = s.setting["pearson_ci"]
    assert lo <= hi and s.setting["n_bootstrap"] == 200
    plain = report.to_dict()
    assert json.loads(json.dumps(plain)) == plain


def test_not_enough_models_is_reported_not_raised():
    ref, acc = synthetic_scores(MODELS[:3])
    del ref[MODELS[2]]  # the third model has no reference score
    report = correlate_results(linear_records(acc), make_config(MODELS[:3]), ref)
    s = report.setting("many-shot linear")
    assert s.status == "not_enough_models"
    assert s.message == "not enough models (n=2; need 3)"
    assert s.excluded == {MODELS[2]: "no reference score"}
    assert s.setting is None and s.n == 0
    json.dumps(report.to_dict())


def test_model_lacking_a_dataset_is_named():
    ref, acc = synthetic_scores(MODELS)
    del acc[("vit-b", "pets")]
    report = correlate_results(linear_records(acc), make_config(MODELS), ref)
    s = report.setting("many-shot linear")
    assert s.status == "ok" and "vit-b" not in s.models and s.n == len(MODELS) - 1
    assert s.excluded["vit-b"] == "lacks dataset(s) pets"


def test_fewshot_metric_defaults_to_its_primary_and_a_missing_metric_is_invalid():
    ref, acc = synthetic_scores(MODELS)
    recs = [make_record(m, d, "fs20", {"score": a, "mean": a, "ci95": 0.01, "std": 0.12}) for (m, d), a in acc.items()]
    config = make_config(MODELS, correlation={"settings": [
        {"name": "few-shot", "protocol": "fs20", "datasets": DATASETS, "metric": "mean"},
        {"name": "few-shot default", "protocol": "fs20", "datasets": DATASETS},  # few-shot's primary: mean
    ], "bootstrap": 0})
    assert config.correlation.settings[1].metric == "mean"
    report = correlate_results(recs, config, ref)
    assert report.setting("few-shot").status == "ok" and report.setting("few-shot default").status == "ok"
    assert report.setting("few-shot").setting["pearson_ci"] is None
    old = [dict(r, metrics={"score": r["metrics"]["score"]}) for r in recs]  # records written without `mean`
    bad = correlate_results(old, config, ref).setting("few-shot")
    assert bad.status == "invalid" and "'mean'" in bad.message and "its scalar metrics: score" in bad.message


def test_stale_and_superseded_records_are_set_aside():
    ref, acc = synthetic_scores(MODELS)
    recs = linear_records(acc)
    # an old record of a changed setting with a wild score, and an older duplicate of a cell
    stale = make_record("vit-s", "pets", "linear", logistic_metrics(0.01), settings={"C": 5.0})
    older = make_record("vit-s", "cifar10", "linear", logistic_metrics(0.02), weights="old",
                        recorded="2024-01-01T00:00:00+00:00")
    config = make_config(MODELS)
    chosen, aside = current_records(recs + [stale, older], config)
    assert len(chosen) == len(recs) and {r["cell_id"] for r in aside} == {stale["cell_id"], older["cell_id"]}
    assert correlate_results(recs + [stale, older], config, ref).to_dict() == \
        correlate_results(recs, config, ref).to_dict()


def test_measured_reference():
    _, acc = synthetic_scores(MODELS)
    recs = linear_records(acc)
    got = measured_reference(recs, "cifar10", "linear")
    assert got == {m: acc[(m, "cifar10")] for m in MODELS}
    with pytest.raises(DataValidationError, match="no record of setting 'linear' on dataset 'imagenet'"):
        measured_reference(recs, "imagenet", "linear")
    with pytest.raises(DataValidationError, match="no metric 'map'"):
        measured_reference(recs, "cifar10", "linear", metric="map")
