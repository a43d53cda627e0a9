"""Correlation job: a benchmark's ledger records against a reference score per model."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobs.config.protocols import settings_hash
from pipeline.errors import ConfigError, DataValidationError, UnknownNameError
from pipeline.plain import to_plain
from storage_schema.ledger import latest_records

if TYPE_CHECKING:
    from jobs.config import BenchmarkConfig, CorrelationSetting

__all__ = [
    "CorrelationReport",
    "SettingReport",
    "correlate_results",
    "current_records",
    "measured_reference",
]

OK = "ok"
NOT_ENOUGH_MODELS = "not_enough_models"
INVALID = "invalid"


@dataclass
class SettingReport:
    """The outcome of one correlation setting; ``status`` is "ok", "not_enough_models" or "invalid"."""
    # ``setting`` and ``per_dataset`` hold ``CorrelationResult`` values as plain dicts
    # (``to_plain``) when the status is "ok". ``setting_scores`` is each used model's mean logit score over the
    # datasets, ``reference_logit`` its logit-transformed reference, ``scores`` the raw
    # metric per model and dataset, and ``excluded`` the models left out with the reason.

    name: str
    protocol: str
    metric: str
    layer: str
    datasets: list[str]
    status: str
    message: str = ""
    models: list[str] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)
    setting: dict[str, Any] | None = None
    per_dataset: dict[str, dict[str, Any]] = field(default_factory=dict)
    setting_scores: dict[str, float] = field(default_factory=dict)
    reference_logit: dict[str, float] = field(default_factory=dict)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    cells: dict[str, dict[str, str]] = field(default_factory=dict)  # model -> dataset -> cell id

    @property
    def n(self) -> int:
        """Encoders correlated (0 unless the setting's status is ok)."""
        return len(self.models) if self.status == OK else 0

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the run summary and the report (intervals as lists, keys as
        strings); not ``to_plain``: the stored record adds the derived ``n``."""
        return {
            "name": self.name, "protocol": self.protocol, "metric": self.metric, "layer": self.layer,
            "datasets": list(self.datasets), "status": self.status, "message": self.message, "n": self.n,
            "models": list(self.models), "excluded": dict(self.excluded),
            "setting": to_plain(self.setting), "per_dataset": to_plain(self.per_dataset),
            "setting_scores": dict(self.setting_scores), "reference_logit": dict(self.reference_logit),
            "scores": {m: dict(s) for m, s in self.scores.items()},
            "cells": {m: dict(c) for m, c in self.cells.items()},
        }


@dataclass
class CorrelationReport:
    """Every correlation setting of a benchmark, with the reference they were measured against."""

    reference_name: str
    reference: dict[str, float]
    settings: list[SettingReport]
    bootstrap: int
    seed: int

    def setting(self, name: str) -> SettingReport:
        """The report of the correlation setting ``name``; an unknown name lists the settings."""
        for s in self.settings:
            if s.name == name:
                return s
        raise UnknownNameError(f"no correlation setting {name!r}; settings: "
                               f"{', '.join(s.name for s in self.settings) or '(none)'}")

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the run summary and the report; not ``to_plain``: each setting in
        its own stored format (``SettingReport.to_dict``, with ``n``)."""
        return {
            "reference_name": self.reference_name, "reference": dict(self.reference),
            "bootstrap": self.bootstrap, "seed": self.seed,
            "settings": [s.to_dict() for s in self.settings],
        }




# -- record selection -----------------------------------------------------------------------
def _current_hashes(config: BenchmarkConfig) -> dict[str, tuple[str, str]]:
    """Protocol setting name -> (registry protocol, config hash of its current settings: of
    those that decide the result, as its records carry it)."""
    out = {}
    for p in config.protocols:
        try:
            out[p.name] = (p.protocol, settings_hash(p.protocol, p.settings))
        except (ConfigError, UnknownNameError):
            continue  # an unresolvable setting cannot be matched: its records are kept as they are
    return out


def current_records(records: Iterable[Mapping[str, Any]],
                    config: BenchmarkConfig | None = None) -> tuple[list[dict], list[dict]]:
    """(records in use, records set aside): one record per (setting, layer, model, dataset)."""
    # With ``config``, records of a protocol setting it names are kept only when their
    # settings hash equals the setting's current one (a changed setting leaves old records
    # behind). Of several records left for the same cell, the most recent is used.
    return latest_records(records, _current_hashes(config) if config is not None else None)


def _metric_value(rec: Mapping[str, Any], metric: str) -> float:
    """The record's scalar ``metric``; a missing or non-numeric one is a DataValidationError."""
    metrics = rec.get("metrics") or {}
    where = f"{rec.get('model')}/{rec.get('dataset')}/{rec.get('layer')}:{rec.get('setting')}"
    if metric not in metrics:
        scalar = sorted(k for k, v in metrics.items() if _is_number(v))
        raise DataValidationError(f"record {where} has no metric {metric!r}; its scalar metrics: "
                                  f"{', '.join(scalar) or '(none)'}")
    value = metrics[metric]
    if not _is_number(value):
        raise DataValidationError(f"metric {metric!r} of record {where} is not a number "
                                  f"({type(value).__name__}); correlations need one score per cell")
    return float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- public ---------------------------------------------------------------------------------
def measured_reference(records: Iterable[Mapping[str, Any]], dataset: str, setting: str,
                       metric: str = "top1", layer: str = "pre_logits") -> dict[str, float]:
    """Reference score per model measured by the pipeline: ``metric`` of ``setting`` on ``dataset``."""
    # Of several records of one model, the most recent is used. No matching record is an
    # error that lists what the records do hold.
    records = [dict(r) for r in records]
    chosen, _ = current_records(r for r in records if r.get("dataset") == dataset
                                and r.get("setting") == setting and r.get("layer") == layer)
    if not chosen:
        held = sorted({f"{r.get('dataset')}/{r.get('layer')}:{r.get('setting')}" for r in records})
        raise DataValidationError(
            f"no record of setting {setting!r} on dataset {dataset!r} at layer {layer!r} to measure the "
            f"reference from; records hold: {', '.join(held[:20]) or '(none)'}"
            + (f", ... ({len(held)} in all)" if len(held) > 20 else "")
        )
    return {rec["model"]: _metric_value(rec, metric) for rec in chosen}


def correlate_results(records: list[dict], config: BenchmarkConfig, reference: dict[str, float]) -> CorrelationReport:
    """Correlate every ``config.correlation.settings`` entry with ``reference`` (fractions per model)."""
    chosen, _ = current_records(records, config)
    settings = [_correlate_one(chosen, s, reference, config.correlation.bootstrap, config.correlation.seed)
                for s in config.correlation.settings]
    return CorrelationReport(reference_name=config.reference.name, reference=dict(reference),
                             settings=settings, bootstrap=int(config.correlation.bootstrap),
                             seed=int(config.correlation.seed))


def _correlate_one(records: list[dict], s: CorrelationSetting, reference: Mapping[str, float], n_bootstrap: int,
                   seed: int) -> SettingReport:
    # deferred: scipy, only when correlating
    from pipeline.analysis.correlation import MIN_MODELS, correlate_setting, logit

    report = SettingReport(name=s.name, protocol=s.protocol, metric=s.metric, layer=s.layer,
                           datasets=list(s.datasets), status=INVALID)
    # sorted: the ledger lists records in file-listing order, which varies between stores and
    # runs; the models' order changes a sum's last bits and the bootstrap's resamples
    mine = sorted((r for r in records if r.get("setting") == s.protocol and r.get("layer") == s.layer
                   and r.get("dataset") in s.datasets), key=lambda r: (str(r.get("model")), str(r.get("dataset"))))
    try:
        scores = {(r["model"], r["dataset"]): _metric_value(r, s.metric) for r in mine}
    except DataValidationError as exc:
        report.message = str(exc)
        return report
    for r in mine:
        report.scores.setdefault(r["model"], {})[r["dataset"]] = scores[(r["model"], r["dataset"])]
        report.cells.setdefault(r["model"], {})[r["dataset"]] = str(r.get("cell_id", ""))
    usable = _usable_models(report, reference)
    for model in sorted({str(r.get("model")) for r in records} - set(report.scores)):
        report.excluded[model] = f"no record of {s.protocol} at layer {s.layer} on these datasets"
    if not mine:
        report.status = NOT_ENOUGH_MODELS
        report.message = (f"not enough models (n=0; need {MIN_MODELS}): no record of protocol setting "
                          f"{s.protocol!r} at layer {s.layer!r} on {', '.join(s.datasets)}")
        return report
    if len(usable) < MIN_MODELS:
        report.status = NOT_ENOUGH_MODELS
        report.message = f"not enough models (n={len(usable)}; need {MIN_MODELS})"
        return report
    kept = {(m, d): v for (m, d), v in scores.items() if m in usable}
    try:
        result = correlate_setting(reference, kept, s.datasets, bounded=s.bounded,
                                   lower_is_better=s.lower_is_better, n_bootstrap=n_bootstrap, seed=seed)
        ref_logit = logit([reference[m] for m in result.models])
    except DataValidationError as exc:
        report.message = str(exc)
        return report
    report.status = OK
    report.models = [str(m) for m in result.models]
    report.setting = to_plain(result.setting)
    report.per_dataset = {str(d): to_plain(r) for d, r in result.per_dataset.items()}
    report.setting_scores = {str(m): float(v) for m, v in result.setting_scores.items()}
    report.reference_logit = {m: float(v) for m, v in zip(report.models, ref_logit)}
    return report


def _usable_models(report: SettingReport, reference: Mapping[str, float]) -> list[str]:
    """Models with a reference and a finite score on every dataset; the others go to ``excluded``."""
    usable = []
    for model in sorted(report.scores):
        have = report.scores[model]
        lacking = [d for d in report.datasets if d not in have]
        bad = [d for d in report.datasets if d in have and not math.isfinite(have[d])]
        if model not in reference:
            report.excluded[model] = "no reference score"
        elif lacking:
            report.excluded[model] = f"lacks dataset(s) {', '.join(lacking)}"
        elif bad:
            report.excluded[model] = f"non-finite {report.metric} on {', '.join(bad)}"
        else:
            usable.append(model)
    return usable


def figure_lines(correlation: Mapping[str, Any] | None) -> list[str]:
    """The figures a run prints at its end: per correlation setting, Pearson's r and
    Spearman's rho with the number of encoders, or why there are none."""
    # ``correlation`` is a run summary's (``CorrelationReport.to_dict()``), or None.
    lines = []
    for s in (correlation or {}).get("settings", []):
        r = s.get("setting") or {}
        if s.get("status") == OK and "pearson" in r and "spearman" in r:
            lines.append(f"  {s['name']}: Pearson r = {r['pearson']:.2f}, Spearman rho = {r['spearman']:.2f}, "
                         f"n = {s['n']} encoders")
        else:
            lines.append(f"  {s.get('name')}: {s.get('message') or s.get('status')}")
    return lines
