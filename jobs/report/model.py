"""What the report is built from: the records shown, those set aside, the names in config
order, and what went wrong (failures, data problems) that the report must not hide."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobs.analysis.correlate import current_records

if TYPE_CHECKING:  # only for type checkers: reading a config is cheap, but not needed here
    from jobs.config import BenchmarkConfig


@dataclass
class ReportRun:
    """What the report shows, gathered once: the records and those set aside, the config's
    names in its order, failures, notes and the run's summary."""

    records: list[dict]  # one per (setting, layer, model, dataset): the ones shown
    aside: list[dict]  # superseded or stale records, still listed under provenance
    models: list[str]
    datasets: list[str]
    settings: list[str]
    layers: list[str]
    protocol_of: dict[str, str]
    baseline: str | None  # configured low-shot baseline
    store: str
    failures: list[dict] = field(default_factory=list)  # failure records of this config's work
    data_notes: list[dict] = field(default_factory=list)  # {"where", "skipped": [...], "small_classes": {...}}
    waiting: list[str] = field(default_factory=list)  # checkpoints still being written
    problems: list[str] = field(default_factory=list)  # run-level messages
    series: list[Any] = field(default_factory=list)  # jobs.analysis.series.SeriesAnalysis of each checkpoint series
    summary: dict | None = None  # the run summary written beside the report (jobs.report.events)
    changes: dict | None = None  # what changed since the previous run's summary; None: no previous one
    reference: dict[str, float] = field(default_factory=dict)  # reference score per encoder
    early: dict | None = None  # the early pass's estimates and checks (jobs.early.view); never records

    def group(self, predicate: Callable[[dict], bool]) -> list[tuple[str, str, list[dict]]]:
        """(setting, layer, records) in config order, for the records matching ``predicate``."""
        out = []
        for setting in self.settings:
            for layer in self.layers:
                recs = [r for r in self.records if r.get("setting") == setting and r.get("layer") == layer
                        and predicate(r)]
                if recs:
                    out.append((setting, layer, recs))
        return out

    def heading(self, setting: str, layer: str) -> str:
        """A table's heading: the setting, its protocol and the layer."""
        return f"{setting} ({self.protocol_of.get(setting, '?')}), layer {layer}"


def order(preferred: Iterable[str], present: Iterable[str]) -> list[str]:
    """``preferred`` (config order) first where present, then the rest sorted."""
    present = set(present)
    head = [p for p in dict.fromkeys(preferred) if p in present]
    return head + sorted(present - set(head))


def build_run(records: Sequence[Mapping[str, Any]], config: BenchmarkConfig, *,
              aside: Sequence[Mapping[str, Any]] | None = None, failures: Sequence[Mapping[str, Any]] = (),
              data_notes: Sequence[Mapping[str, Any]] = (), waiting: Sequence[str] = (),
              problems: Sequence[str] = ()) -> ReportRun:
    """``aside``: records set aside elsewhere (older settings, the whole ledger's history);
    the ones ``current_records`` sets aside among ``records`` are added to them."""
    chosen, dropped = current_records(records, config)
    models = order([e.name for e in config.encoders], (str(r.get("model")) for r in chosen))
    datasets = order([d.name for d in config.datasets], (str(r.get("dataset")) for r in chosen))
    settings = order([p.name for p in config.protocols], (str(r.get("setting")) for r in chosen))
    layer_pref = ["pre_logits"] + [layer for e in config.encoders for layer in e.layers]
    layers = order(layer_pref, (str(r.get("layer")) for r in chosen))
    protocol_of = {p.name: p.protocol for p in config.protocols}
    for r in chosen:
        protocol_of.setdefault(str(r.get("setting")), str(r.get("protocol")))
    return ReportRun(chosen, [dict(r) for r in aside or ()] + dropped, models, datasets, settings, layers,
                     protocol_of, config.report.baseline, config.store, [dict(f) for f in failures],
                     [dict(n) for n in data_notes], list(waiting), list(problems))
