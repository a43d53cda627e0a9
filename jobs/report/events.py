"""The machine-readable summary each run writes beside its report, and what it alerts on."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jobs.analysis.compare import cell_key, cell_label, record_score
from jobs.report.files import write_atomic
from pipeline.analysis.leaderboard import RunChanges, diff_summaries, leaderboard
from pipeline.plain import to_plain
from pipeline.errors import DataValidationError
from pipeline.protocols.fit_warnings import WARNING_CODES, record_warnings, unreliable_reasons
from storage_schema.provenance import now_iso

log = logging.getLogger(__name__)

SUMMARY_VERSION = 1
EVENT_LIST_LIMIT = 50
_FAILURE_FIELDS = ("kind", "label", "reason", "model", "dataset", "layer", "setting", "file", "first_failed",
                   "attempts")


def summary_path(report_path: str) -> str:
    """Where the summary of a report goes: beside it, ``<stem>.summary.json``."""
    return str(Path(report_path).with_suffix(".summary.json"))


def setting_scores(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Each encoder's score per protocol setting, for the leaderboard."""
    # A setting's score is the mean over its datasets of the encoder's best layer on each;
    # an encoder lacking a dataset that another encoder has in that setting gets no score
    # there (a mean over fewer datasets would not compare).
    best: dict[tuple[str, str, str], float] = {}
    for rec in records:
        score = record_score(rec)
        if score is None:
            continue
        key = (str(rec.get("model")), str(rec.get("setting")), str(rec.get("dataset")))
        best[key] = max(score, best.get(key, score))
    datasets: dict[str, set[str]] = {}
    for _, setting, dataset in best:
        datasets.setdefault(setting, set()).add(dataset)
    out: dict[str, dict[str, float]] = {}
    for model in sorted({m for m, _, _ in best}):
        row = {}
        for setting, names in sorted(datasets.items()):
            values = [best.get((model, setting, d)) for d in sorted(names)]
            if all(v is not None for v in values):
                row[setting] = sum(values) / len(values)
        out[model] = row
    return out


def leaderboard_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The leaderboard (mean rank over settings) as plain rows; [] without any score."""
    records = list(records)
    table = {m: row for m, row in setting_scores(records).items() if row}
    if not table:
        return []
    untrusted = untrusted_settings(records)
    return [{**to_plain(row), "unreliable": sorted(s for s in untrusted.get(row.model, ()) if s in row.scores)}
            for row in leaderboard(table, missing="exclude")]


def untrusted_settings(records: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Each encoder's settings whose leaderboard score rests on a record not to be trusted."""
    # A setting's score takes each dataset's best layer (:func:`setting_scores`); where that
    # record carries an ``unreliable`` fit warning, the setting's score is marked.
    best: dict[tuple[str, str, str], tuple[float, bool]] = {}
    for rec in records:
        score = record_score(rec)
        if score is None:
            continue
        key = (str(rec.get("model")), str(rec.get("setting")), str(rec.get("dataset")))
        bad = bool(unreliable_reasons(rec))
        if key not in best or score > best[key][0] or (score == best[key][0] and not bad):
            best[key] = (score, bad)  # a trusted layer with the same score backs it
    out: dict[str, set[str]] = {}
    for (model, setting, _), (_, bad) in best.items():
        if bad:
            out.setdefault(model, set()).add(setting)
    return out


def build_report_summary(records: Sequence[Mapping[str, Any]], failures: Sequence[Mapping[str, Any]],
                         series: Sequence[Any], *, evaluated: Iterable[str] = (), report: str | None = None,
                         store: str | None = None) -> dict[str, Any]:
    """The summary written beside the report (see the module docstring), without ``changes``;
    the run's own terminal summary is ``jobs.report.run_summary.build_summary``."""
    encoders: dict[str, dict[str, Any]] = {}
    flagged = []
    for rec in records:
        score = record_score(rec)
        found = record_warnings(rec)
        if found:
            flagged.append(warning_entry(rec, found))
        weights = (rec.get("provenance") or {}).get("weights_fingerprint")
        if weights and score is not None:  # which weights the scores are of: a rewritten file is not a "change"
            encoders.setdefault(str(rec.get("model")), {"cells": {}}).setdefault("weights", str(weights))
        if score is not None:
            cells = encoders.setdefault(str(rec.get("model")), {"cells": {}})["cells"]
            cells[cell_label(cell_key(rec))] = {"status": "ok", "score": score,
                                                **({"warnings": flagged[-1]["codes"]} if found else {})}
    for f in failures:
        if f.get("kind") == "cell" and f.get("model"):
            cells = encoders.setdefault(str(f["model"]), {"cells": {}})["cells"]
            cells[cell_label(cell_key(f))] = {"status": "failed", "error": str(f.get("reason", ""))}
    regressions = [r for s in series for r in s.regressions()]
    improvements = [r for s in series for r in s.improvements()]
    return {
        "version": SUMMARY_VERSION, "written": now_iso(), "report": report, "store": store,
        "evaluated": sorted(set(evaluated)), "encoders": encoders, "leaderboard": leaderboard_rows(records),
        "series": [s.to_dict() for s in series], "regressions": regressions, "improvements": improvements,
        "warnings": sorted(flagged, key=lambda w: (not w["unreliable"], w["encoder"], w["cell"])),
        "failures": [{k: f[k] for k in _FAILURE_FIELDS if k in f} for f in failures],
    }


def warning_entry(rec: Mapping[str, Any], found: Sequence[Mapping[str, str]] | None = None) -> dict[str, Any]:
    """A record's fit warnings as the summary lists them."""
    found = record_warnings(rec) if found is None else found
    codes = list(dict.fromkeys(w["code"] for w in found))
    return {"encoder": str(rec.get("model")), "cell": cell_label(cell_key(rec)), "codes": codes,
            "unreliable": any(WARNING_CODES[c][0] == "unreliable" for c in codes),
            "messages": [f"{w['code']}: {w['message']}" for w in found]}


def read_summary(path: str) -> dict[str, Any] | None:
    """The summary a previous run left at ``path``; None when there is none or it is unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # torn or foreign: this run's changes are then "everything"
        log.warning("previous run summary %s is unreadable (%s); comparing with nothing", path, exc)
        return None
    return data if isinstance(data, dict) and isinstance(data.get("encoders"), dict) else None


def changes_since(previous: Mapping[str, Any] | None, current: Mapping[str, Any]) -> RunChanges:
    """What changed since the previous summary (new encoders and cells, regressions, failures)."""
    try:
        return diff_summaries(previous, current)
    except DataValidationError as exc:  # a summary of another version: compare with nothing
        log.warning("previous run summary does not compare (%s); listing everything as new", exc)
        return diff_summaries(None, current)


def write_summary(path: str, summary: Mapping[str, Any]) -> str:
    """Write the summary atomically (a reader never sees half a file); its path."""
    write_atomic(Path(path), json.dumps(summary, indent=1, sort_keys=True, default=str) + "\n")
    return path


def _cut(items: Sequence[Any]) -> list[Any]:
    return list(items[:EVENT_LIST_LIMIT])


def event_payload(summary: Mapping[str, Any], path: str | None) -> dict[str, Any]:
    """What the run's events carry: the summary without the per-cell scores, lists cut."""
    changes = dict(summary.get("changes") or {})
    lists = {
        "evaluated": list(summary.get("evaluated") or []),
        "regressions": list(summary.get("regressions") or []),
        "failures": [{k: f.get(k) for k in ("kind", "label", "reason")} for f in summary.get("failures") or []],
        "leaderboard": [{"model": r["model"], "mean_rank": r["mean_rank"]} for r in summary.get("leaderboard") or []],
        "warnings": [{k: w.get(k) for k in ("encoder", "cell", "codes", "unreliable")}
                     for w in summary.get("warnings") or []],
    }
    change_lists = {k: list(changes.get(k) or []) for k in ("new_encoders", "new_cells", "regressions", "failures",
                                                           "recovered")}
    truncated = any(len(v) > EVENT_LIST_LIMIT for v in [*lists.values(), *change_lists.values()])
    return {
        "summary_path": path, "report": summary.get("report"), "written": summary.get("written"),
        **{k: _cut(v) for k, v in lists.items()},
        "series": [{"series": s.get("series"), "newest": s.get("newest"), "flagged": s.get("flagged"),
                    "unreliable": _cut(list(s.get("unreliable") or []))} for s in summary.get("series") or []],
        "changes": {k: _cut(v) for k, v in change_lists.items()}, "truncated": truncated,
    }
