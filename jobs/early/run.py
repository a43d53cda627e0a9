"""The early pass of a run, as jobs a flow's tasks call: which encoders are new, the early
unit of one (encoder, dataset), and the estimates of one encoder."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.config import BenchmarkConfig, DatasetConfig, EncoderConfig, ExtractConfig
from jobs.config.early import EarlyConfig
from jobs.early.coverage import off_settings, uncalibrated_settings
from jobs.early.estimates import estimate_encoder
from jobs.early.extract import extract_early
from jobs.early.results import early_result
from jobs.early.subsets import Subset, current_subset
from jobs.evaluation.cell import Cell
from jobs.extraction.labels import store_labels
from jobs.run.failures import one_line
from jobs.run.plan import Plan, make_adapter
from pipeline.errors import RepevalError
from storage_schema import FeatureStore, feature_key
from storage_schema.early import EarlyRecords
from storage_schema.evidence import read_evidence
from storage_schema.ledger import Ledger

__all__ = ["EarlyPlan", "anchor_profiles", "early_estimates", "early_plan", "early_unit"]

log = logging.getLogger(__name__)


@dataclass
class EarlyPlan:
    """What a run's early pass does: the new encoders' cells by (encoder, dataset), and the
    cells left out of it with the reason."""

    units: dict[tuple[str, str], list[Cell]] = field(default_factory=dict)
    left_out: list[dict[str, str]] = field(default_factory=list)

    @property
    def encoders(self) -> list[str]:
        """The new encoders, in plan order."""
        return list(dict.fromkeys(e for e, _ in self.units))


def _is_new(store: FeatureStore, encoder: EncoderConfig, dataset: DatasetConfig) -> bool:
    for split in dataset.splits():
        for layer in encoder.layers:
            st = store.status(feature_key(encoder.name, dataset.name, split, layer))
            if st is None or not st.complete:
                return True
    return False


def early_plan(store: FeatureStore, plan: Plan) -> EarlyPlan:
    """The early pass of ``plan``: every extracted encoder with features still to extract."""
    out = EarlyPlan()
    cfg = plan.config
    datasets = {d.name: d for d in cfg.datasets}
    for enc in cfg.encoders:
        if not enc.extracted:
            continue
        for d in cfg.datasets:
            if not _is_new(store, enc, d):
                continue
            for cell in plan.cells:
                if cell.model != enc.name or cell.dataset != d.name:
                    continue
                entry = cell.entry
                if not entry.reads_features or entry.dense:
                    out.left_out.append({"cell": cell.label(), "reason": "not in the early pass: it reads "
                                         + ("the encoder's weights" if not entry.reads_features else "dense maps")})
                    continue
                if cell.train_split == cell.test_split:
                    out.left_out.append({"cell": cell.label(), "reason": "not in the early pass: its train and "
                                         "test rows come from one split"})
                    continue
                out.units.setdefault((enc.name, d.name), []).append(cell)
    for (e, d) in list(out.units):
        if d not in datasets:
            del out.units[(e, d)]
    return out


def anchor_profiles(store: FeatureStore, dataset: DatasetConfig, exclude: str) -> tuple[np.ndarray, list[str]] | None:
    """Earlier readouts' results on each test image of ``dataset``: (n_test, m) 1 where a
    recorded cell's stored predictions were right, and the encoder of each column."""
    labels = store.labels(dataset.name, dataset.test_split)
    y = labels.read()
    columns, encoders = [], []
    for rec in Ledger(store):
        ev = rec.get("evidence") or {}
        if (rec.get("dataset") != dataset.name or rec.get("model") == exclude or ev.get("kind") != "predictions"
                or (rec.get("fingerprints") or {}).get(f"{dataset.test_split}.labels") != labels.fingerprint):
            continue
        try:
            predictions = read_evidence(store, ev, f"{rec.get('model')} on {dataset.name}")
        except (RepevalError, OSError) as exc:
            log.info("anchor profiles: %s", exc)
            continue
        if predictions.shape == y.shape:
            columns.append((predictions == y).astype(np.float64))
            encoders.append(str(rec["model"]))
    return (np.stack(columns, axis=1), encoders) if columns else None


def early_unit(store: FeatureStore, encoder: EncoderConfig, dataset: DatasetConfig, cells: list[Cell],
               early: EarlyConfig, extract: ExtractConfig, weights_signature: list[int] | None = None) -> dict[str, Any]:
    """The early pass of one encoder on one dataset: subset, early rows, early results."""
    adapter = make_adapter(dataset)
    for split in dataset.splits():
        store_labels(store, adapter, split, lease_ttl=extract.lease_ttl)
    profiles = anchor_profiles(store, dataset, encoder.name) if early.rows == "anchors" else None
    subset = current_subset(store, dataset, early, profiles)
    settings = dataclasses.replace(encoder.extract_settings(extract), progress=False)
    extraction = extract_early(store, encoder.spec(), adapter, subset, settings, expected_weights=weights_signature)
    results = {}
    for cell in cells:
        key = "/".join((cell.setting, cell.dataset, cell.layer))
        try:
            results[key] = early_result(store, cell, subset, "early")
        except RepevalError as exc:  # too few rows for this readout, say: its estimate says why
            results[key] = {"error": f"no early estimate: not fitted on the early rows ({one_line(exc)})"}
    return {"model": encoder.name, "dataset": dataset.name, "subset": subset.to_record(early),
            "extraction": extraction, "results": results}


def early_estimates(store: FeatureStore, cfg: BenchmarkConfig, cells: list[Cell],
                    units: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The estimates of one new encoder from the outcomes of its early units."""
    subsets, results, failed = {}, {}, {}
    for unit in units:
        if unit.get("error"):
            failed[unit["dataset"]] = unit["error"]
            continue
        subsets[unit["dataset"]] = Subset.from_record(unit["subset"])
        for key, res in unit["results"].items():
            results[tuple(key.split("/"))] = res
    for cell in cells:
        if cell.dataset in failed:
            results[(cell.setting, cell.dataset, cell.layer)] = {"error": f"no early estimate: the early extraction failed: "
                                                                          f"{failed[cell.dataset]}"}
    todo = [c for c in cells if c.dataset in subsets or c.dataset in failed]
    return estimate_encoder(store, cfg, todo, subsets, results, list(Ledger(store)), off_settings(store),
                            uncalibrated=uncalibrated_settings(store))


def early_records(store: FeatureStore, models: set[str]) -> list[dict[str, Any]]:
    """Every recorded early estimate of these encoders (newest last)."""
    recs = [r for r in EarlyRecords(store).iter("estimates") if r.get("model") in models]
    return sorted(recs, key=lambda r: str(r.get("recorded") or ""))
