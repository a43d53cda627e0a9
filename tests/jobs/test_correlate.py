"""The correlation job on synthetic ledger records shaped like those evaluate.py writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from jobs.config import load_config
from jobs.correlate import correlate_results, current_records, measured_reference
from pipeline.errors import DataValidationError
from pipeline.protocols.registry import resolve_settings
from storage_schema.ledger import cell_id, config_hash
from storage_schema.provenance import stable_hash

DATASETS = ["cifar10", "pets", "flowers"]
PROTOCOLS = [
    {"name": "linear", "protocol": "logistic"},
    {"name": "knn20", "protocol": "knn"},
    {"name": "fs20", "protocol": "fewshot", "settings": {"n_episodes": 600}},
    {"name": "lowshot", "protocol": "lowshot"},
    {"name": "audit", "protocol": "invariance"},
]
PROTOCOL_OF = {p["name"]: p["protocol"] for p in PROTOCOLS}
SETTINGS_OF = {p["name"]: resolve_settings(p["protocol"], p.get("settings", {})) for p in PROTOCOLS}


def make_config(models, correlation=None, reference=None, report=None):
    """A validated BenchmarkConfig over ``models`` (all resnet18) and the three datasets."""
    data = {
        "encoders": [{"name": m, "arch": "resnet18"} for m in models],
        "datasets": [{"name": d, "adapter": "textures"} for d in DATASETS],
        "protocols": PROTOCOLS,
        "correlation": correlation or {"settings": [{"name": "many-shot linear", "protocol": "linear",
                                                     "datasets": DATASETS}], "bootstrap": 200, "seed": 3},
    }
    if reference is not None:
        data["reference"] = reference
    if report is not None:
        data["report"] = report
    return load_config(data)


def make_record(model, dataset, setting, metrics, *, layer="pre_logits", diagnostics=None, warnings=None,
                converged=True, recorded="2025-01-01T00:00:00+00:00", settings=None, weights="w0"):
    """One ledger record with the fields and nesting of jobs.evaluate.evaluate_cell."""
    protocol = PROTOCOL_OF[setting]
    settings = SETTINGS_OF[setting] if settings is None else resolve_settings(protocol, settings)
    fps = {}
    for split in ("train", "test"):
        fps[f"{split}.features"] = stable_hash([model, dataset, split, layer, weights])
        fps[f"{split}.labels"] = stable_hash([dataset, split])
    return {
        "cell_id": cell_id(fps, protocol, settings, 1), "model": model, "dataset": dataset, "layer": layer,
        "setting": setting, "protocol": protocol, "protocol_version": 1, "settings": settings,
        "config_hash": config_hash(settings), "splits": ["train", "test"], "fingerprints": fps,
        "metrics": metrics, "diagnostics": diagnostics or {}, "warnings": warnings or [],
        "converged": converged, "n_train": 500, "n_test": 200, "dim": 512,
        "timings": {"read_s": 0.01, "fit_s": 0.5},
        "provenance": {
            "arch": "resnet18", "weights_fingerprint": stable_hash([model, weights], length=16),
            "weights": f"/ckpt/{model}.safetensors",
            "data_config": {"input_size": [3, 224, 224], "interpolation": "bicubic", "crop_pct": 0.875},
            "pooling": "avg", "feature_keys": {s: f"features/{model}/{dataset}/{s}/{layer}" for s in ("train", "test")},
            "store": "/tmp/store",
        },
        "recorded": recorded,
    }


def logistic_metrics(acc, ece=0.08):
    return {"top1": acc, "mean_per_class": acc - 0.01, "score": acc, "ece": ece,
            "ece_temperature_scaled": ece / 3, "nll": 1.0, "nll_temperature_scaled": 0.9}


def logistic_diagnostics(converged=True):
    return {"C": 0.3, "n_iter": 120, "converged": converged, "temperature": 1.4,
            "temperature_at_bound": False, "calibration_fit_converged": converged}


def synthetic_scores(models, seed=0):
    """Reference fraction per model and a correlated accuracy per (model, dataset)."""
    rng = np.random.default_rng(seed)
    ref = {m: float(v) for m, v in zip(models, np.linspace(0.62, 0.84, len(models)))}
    acc = {}
    for i, d in enumerate(DATASETS):
        for m in models:
            z = np.log(ref[m] / (1 - ref[m])) * (0.8 + 0.2 * i) + 0.4 * i + rng.normal(0, 0.25)
            acc[(m, d)] = float(1 / (1 + np.exp(-z)))
    return ref, acc


def linear_records(acc, **kw):
    return [make_record(m, d, "linear", logistic_metrics(a), diagnostics=logistic_diagnostics(), **kw)
            for (m, d), a in acc.items()]


def _logit(p):
    p = np.asarray(p, dtype=float)
    return np.log(p / (1 - p))


MODELS = ["r18-a", "r18-b", "vit-s", "vit-b", "convnext-t", "dino-s"]


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


def test_fewshot_metric_and_missing_metric():
    ref, acc = synthetic_scores(MODELS)
    recs = [make_record(m, d, "fs20", {"score": a, "mean": a, "ci95": 0.01, "std": 0.12}) for (m, d), a in acc.items()]
    config = make_config(MODELS, correlation={"settings": [
        {"name": "few-shot", "protocol": "fs20", "datasets": DATASETS, "metric": "mean"},
        {"name": "few-shot top1", "protocol": "fs20", "datasets": DATASETS},  # fewshot writes no top1
    ], "bootstrap": 0})
    report = correlate_results(recs, config, ref)
    assert report.setting("few-shot").status == "ok"
    assert report.setting("few-shot").setting["pearson_ci"] is None
    bad = report.setting("few-shot top1")
    assert bad.status == "invalid" and "'top1'" in bad.message and "ci95, mean, score, std" in bad.message


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
