"""Synthetic ledger records shaped like those jobs.evaluation.evaluate writes, and a config over them."""

from __future__ import annotations

import numpy as np

from jobs.config import load_config
from pipeline.protocols.registry import get_protocol, resolve_settings
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
    """One ledger record with the fields and nesting of jobs.evaluation.evaluate.evaluate_cell."""
    protocol = PROTOCOL_OF[setting]
    settings = SETTINGS_OF[setting] if settings is None else resolve_settings(protocol, settings)
    fps = {}
    for split in ("train", "test"):
        fps[f"{split}.features"] = stable_hash([model, dataset, split, layer, weights])
        fps[f"{split}.labels"] = stable_hash([dataset, split])
    identity = get_protocol(protocol).result_settings(settings)  # what a record's ids are of, as evaluate's
    return {
        "cell_id": cell_id(fps, protocol, identity, 1), "model": model, "dataset": dataset, "layer": layer,
        "setting": setting, "protocol": protocol, "protocol_version": 1, "settings": settings,
        "config_hash": config_hash(identity), "splits": ["train", "test"], "fingerprints": fps,
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


MODELS = ["r18-a", "r18-b", "vit-s", "vit-b", "convnext-t", "dino-s"]
