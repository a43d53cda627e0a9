"""Gather a config's records from the ledger, correlate them, and write the report."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from jobs.analysis.correlate import INVALID, correlate_results, current_records, measured_reference
from jobs.analysis.series import analyse_series
from jobs.config import BenchmarkConfig
from jobs.report.data_notes import fewshot_notes, label_notes
from jobs.early.view import early_part, early_view
from jobs.evaluation.encoder_identity import config_identities, record_identity
from jobs.run.failures import correlation_setting_failure, sync_correlation_failures
from jobs.report.events import (
    build_report_summary, changes_since, read_summary, summary_path, write_summary as write_summary_file,
)
from pipeline.errors import DataValidationError, RepevalError
from pipeline.plain import to_plain
from storage_schema import FeatureStore
from storage_schema.keys import feature_key
from storage_schema.ledger import FailureLog, Ledger, failure_id

log = logging.getLogger(__name__)

NAME_FIELDS = ("model", "dataset", "layer", "setting")


def named(record: Mapping[str, Any], names: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` under the cell's names; ``recorded_as`` keeps the name it was computed under."""
    out = {**record, **{k: names[k] for k in NAME_FIELDS if k in names}}
    if record.get("model") != out.get("model"):
        out["recorded_as"] = record.get("model")
    return out


def run_records(store: FeatureStore, cells: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Ledger records of this run's cells (``cell_id`` plus the cell's names), one per name."""
    # A name sharing a record computed under another name keeps its own checkpoint file in
    # the record's provenance (``runs/moco_ep10.pth.tar``, not the other name's
    # ``moco.pth.tar``): its feature arrays, aliases of the other's, record it.
    ledger = Ledger(store)
    cache: dict[str, dict[str, Any]] = {}
    own: dict[tuple, Mapping[str, Any] | None] = {}
    out, seen = [], set()
    for c in cells:
        key = (c["cell_id"],) + tuple(c.get(k) for k in NAME_FIELDS)
        if key in seen:
            continue
        seen.add(key)
        if c["cell_id"] not in cache:
            cache[c["cell_id"]] = ledger.get(c["cell_id"])
        rec = named(cache[c["cell_id"]], c)
        prov = rec.get("provenance")
        if rec.get("recorded_as") and isinstance(prov, Mapping) and _from_checkpoint(prov.get("weights")):
            where = (rec.get("model"), rec.get("dataset"), rec.get("layer"))
            if where not in own:
                own[where] = _own_weights(store, rec)
            if own[where] is not None:
                rec["provenance"] = {**prov, "weights": dict(own[where])}
        out.append(rec)
    return out


def _from_checkpoint(weights: object) -> bool:
    return isinstance(weights, Mapping) and weights.get("source") == "checkpoint"


def _own_weights(store: FeatureStore, rec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The weights record of ``rec``'s own feature arrays (its name's), when from a checkpoint."""
    splits = list((rec["provenance"].get("feature_keys") or {}))
    if not splits:
        return None
    try:
        st = store.status(feature_key(str(rec["model"]), str(rec["dataset"]), splits[0], str(rec["layer"])))
    except (RepevalError, ValueError):  # a name that is no key: the shared record stands
        return None
    weights = ((st.attrs.get("encoder") or {}).get("weights")) if st is not None else None
    return weights if _from_checkpoint(weights) else None


def history(store: FeatureStore, cfg: BenchmarkConfig, shown: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Ledger records of this config's encoders and settings that are not shown: earlier
    settings of a setting name, features of replaced weights (what the report sets aside);
    never a record of another config's encoder of the same name (``jobs.evaluation.encoder_identity``;
    a record without an identity, of an older store, is taken by its name)."""
    models = {e.name for e in cfg.encoders}
    identities = config_identities(cfg)
    settings = {p.name for p in cfg.protocols}
    shown_ids = {r.get("cell_id") for r in shown}
    return [r for r in Ledger(store) if r.get("model") in models and r.get("setting") in settings
            and r.get("cell_id") not in shown_ids
            and record_identity(r) in (None, identities.get((r.get("model"), r.get("dataset"))))]


def config_failures(store: FeatureStore, cfg: BenchmarkConfig, cells: Iterable[Any] = (),
                    units: Iterable[Any] = ()) -> list[dict[str, Any]]:
    """The failure records of this config's work: its cells and units, files in its
    checkpoint folders, its correlation; cells and units of this plan only when given."""
    cell_ids = {failure_id(c.model, c.dataset, c.layer, c.setting) for c in cells}
    unit_ids = {failure_id(u.encoder.name, u.dataset.name, u.split) for u in units}
    folders = tuple(str(s.path).rstrip("/") + "/" for s in cfg.checkpoints)
    models = {e.name for e in cfg.encoders}
    out = []
    for rec in FailureLog(store).records():
        kind = rec.get("kind")
        if kind == "cell" and (rec.get("id") in cell_ids or (not cell_ids and rec.get("model") in models)):
            out.append(rec)
        elif kind == "extraction" and (rec.get("id") in unit_ids or (not unit_ids and rec.get("model") in models)):
            out.append(rec)
        elif kind == "checkpoint" and folders and str(rec.get("file", "")).startswith(folders):
            out.append(rec)
        elif kind == "correlation" and rec.get("report") == cfg.report.path:
            out.append(rec)
    return out


def correlation_failures(cfg: BenchmarkConfig, correlation: Any, problem: str | None) -> list[dict[str, Any]]:
    """The correlation settings this run could not compute, as failures: each setting left
    ``invalid`` (a record lacks its metric, a non-finite or out-of-range value), and every
    setting when a measured reference is unavailable. Too few models is not a failure (it
    is said in the report): a young series or a small config has them."""
    path = cfg.report.path
    if problem and correlation is None:
        return [correlation_setting_failure(path, s.name, problem) for s in cfg.correlation.settings]
    return [correlation_setting_failure(path, s.name, f"not correlated: {s.message}")
            for s in (correlation.settings if correlation is not None else []) if s.status == INVALID]


def reference_scores(records: list[dict[str, Any]], cfg: BenchmarkConfig) -> tuple[dict[str, float], str | None]:
    """Given reference scores plus measured ones; a measured reference that is missing is
    reported (second value), not fatal: the rest of the report is still worth having."""
    reference = cfg.reference_scores()
    if cfg.reference.dataset and cfg.reference.protocol:
        try:
            reference.update(measured_reference(records, cfg.reference.dataset, cfg.reference.protocol,
                                                metric=cfg.reference.metric))
        except DataValidationError as exc:
            return reference, f"measured reference unavailable: {exc}"
    return reference, None


def correlate_and_report(store: FeatureStore, cfg: BenchmarkConfig, cells: Iterable[Mapping[str, Any]],
                         path: str | None = None, *, plan=None, waiting: Iterable[str] = (),
                         write_summary: bool = True,
                         trackers: Iterable[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Correlate the records of ``cells`` (each a ``cell_id`` and the cell's names) and write
    the report, with this config's failures and data problems; ``plan`` (a ``jobs.run.plan.Plan``)
    narrows the failures to its cells; ``waiting``: checkpoints still being written;
    ``trackers``: what each experiment tracker logged this run (``jobs.report.trackers``), kept in
    the summary's ``trackers`` entry and shown on the report's first screen when one failed."""
    # The report opens with the run summary (leaderboard, checkpoint series' regressions, what
    # changed since the summary the previous run left beside the report); ``write_summary``
    # writes this run's summary there (a run does; re-rendering a report does not).
    cells = list(cells)
    records = run_records(store, cells)
    reference, problem = reference_scores(records, cfg)
    if problem:
        log.warning(problem)
    correlation = correlate_results(records, cfg, reference) if reference else None
    failed_correlations = sync_correlation_failures(store, cfg.report.path, correlation_failures(cfg, correlation,
                                                                                                  problem))
    notes = label_notes(store, [(d.name, s) for d in cfg.datasets for s in d.splits()])
    class_counts = {}
    for d in cfg.datasets:
        try:
            class_counts[d.name] = len(store.labels(d.name, d.train_split).attrs.get("class_names") or [])
        except RepevalError:  # not extracted yet
            continue
    notes += fewshot_notes(records, class_counts)
    failures = config_failures(store, cfg, plan.cells if plan else (),
                               plan.units if plan else ())
    known = {f.get("id") for f in failures}
    failures = [f for f in failed_correlations if f.get("id") not in known] + failures  # first: they are new
    from jobs.report.page import write_report  # deferred: matplotlib, only when a report is written

    path = path or cfg.report.path
    shown = current_records(records, cfg)[0]
    series = analyse_series(store, shown, cfg)
    evaluated = {str(c.get("model")) for c in cells if c.get("status") == "computed"}
    summary = build_report_summary(shown, failures, series, evaluated=evaluated, report=path, store=store.url)
    if trackers is not None:
        summary["trackers"] = [dict(t) for t in trackers]
    early = early_view(store, cfg)
    if early["estimates"]:  # its own part: never among the exact scores
        summary["early"] = early_part(early)
    previous = read_summary(summary_path(path))
    summary["changes"] = to_plain(changes_since(previous, summary))
    out = write_report(records, correlation, cfg, path, reference=reference,
                       failures=failures, aside=history(store, cfg, records), data_notes=notes,
                       waiting=list(waiting) or (plan.scan.waiting if plan else ()), problems=[problem] if problem else [],
                       series=series, summary=summary, changes=summary["changes"] if previous is not None else None,
                       early=early)
    written = None
    if write_summary:
        written = write_summary_file(summary_path(out), summary)
    return {"report": out, "correlation": correlation.to_dict() if correlation else None,
            "reference_problem": problem, "records": len(records), "failures": failures, "data_notes": notes,
            "summary": summary, "summary_path": written, "correlation_failures": failed_correlations}
