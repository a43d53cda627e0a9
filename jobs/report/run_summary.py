"""A run's summary: what it computed, took from the ledger, skipped and what failed."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from jobs.run.failures import FAILED, failure_line
from pipeline.protocols.fit_warnings import WARNING_CODES

_UNRELIABLE = {c for c, (severity, _) in WARNING_CODES.items() if severity == "unreliable"}

EXTRACTED = ("extracted", "resumed")


def build_summary(*, reason: str, units: int, cells: int, extractions: Sequence[Mapping[str, Any]],
                  outcomes: Sequence[Mapping[str, Any]], failures: Sequence[Mapping[str, Any]],
                  report: str | None, correlation: Any, started: float, new_encoders: Sequence[str] = (),
                  waiting: Sequence[str] = (), skipped_checkpoints: Sequence[Mapping[str, Any]] = (),
                  data_notes: Sequence[Mapping[str, Any]] = (), scan_notes: Sequence[str] = ()) -> dict[str, Any]:
    """The summary dict of one run (JSON-able; ``failures`` are failure records; ``data_notes``
    what the datasets' checks warn about, e.g. a class without images in a split;
    ``scan_notes`` the checkpoint folders that gave no file, and why)."""
    skipped_images: dict[str, list[str]] = {}
    for ext in extractions:
        if ext.get("skipped_ids"):
            skipped_images[f"{ext.get('dataset')}/{ext.get('split')}"] = list(ext["skipped_ids"])
    return {
        "reason": reason, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "units": units, "cells": cells,
        "extracted": sum(r.get("status") in EXTRACTED for r in extractions),
        "forward_batches": sum(int(r.get("forward_batches") or 0) for r in extractions),
        "images": sum(int(r.get("images") or 0) for r in extractions),
        "computed": sum(o.get("status") == "computed" for o in outcomes),
        "cached": sum(o.get("status") == "cached" for o in outcomes),
        "failed": [dict(o) for o in outcomes if o.get("status") == FAILED],
        "failed_extractions": [dict(r) for r in extractions if r.get("status") == FAILED],
        "failures": [dict(f) for f in failures],
        "new_encoders": list(new_encoders), "waiting_checkpoints": list(waiting), "scan_notes": list(scan_notes),
        "skipped_checkpoints": [dict(s) for s in skipped_checkpoints],
        "skipped_images": skipped_images, "data_warnings": [dict(n) for n in data_notes],
        "extractions": [dict(r) for r in extractions], "outcomes": [dict(o) for o in outcomes],
        "report": report, "correlation": correlation,
        "seconds": time.perf_counter() - started,
    }


def failure_message(summary: Mapping[str, Any]) -> str | None:
    """One line for the run's final state when something failed, else None."""
    fails = summary["failures"]
    if not fails:
        return None
    kinds: dict[str, int] = {}
    for f in fails:
        kinds[str(f.get("kind"))] = kinds.get(str(f.get("kind")), 0) + 1
    counts = ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in kinds.items())
    return f"{counts} failed: " + "; ".join(failure_line(f) for f in fails[:3]) + (
        f"; ... ({len(fails)} in all, see `repeval results --failed`)" if len(fails) > 3 else "")


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary as terminal lines: counts first, then every failure and data problem."""
    lines = [f"{summary['reason']}: extracted {summary['extracted']} of {summary['units']} encoder/dataset splits "
             f"({summary['images']} images), evaluated {summary['computed']} of {summary['cells']} cells "
             f"({summary['cached']} from the ledger, {len(summary['failed'])} failed) in {summary['seconds']:.1f} s"]
    if summary["new_encoders"]:
        lines.append(f"new encoders: {', '.join(summary['new_encoders'])}")
    for line in summary.get("scan_notes") or []:
        lines.append(line)
    for path in summary["waiting_checkpoints"]:
        lines.append(f"waiting: {path} is still being written; a later scan takes it")
    for rec in summary["skipped_checkpoints"]:
        lines.append(f"skipped: {rec.get('file')} failed before and is unchanged ({rec.get('reason')}); "
                     "retry with --retry-failed or replace the file")
    for where, ids in summary["skipped_images"].items():
        shown = ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
        lines.append(f"data: {len(ids)} unreadable image(s) left out of {where}: {shown}")
    for n in summary.get("data_warnings") or []:
        items = [str(i) for i in n.get("items") or []]
        shown = ", ".join(items[:5]) + (f", ... ({len(items)} in all)" if len(items) > 5 else "")
        lines.append(f"data warning: {n.get('where')}: {n.get('what')}" + (f": {shown}" if items else ""))
    if summary["failures"]:
        lines.append(f"FAILED ({len(summary['failures'])}):")
        lines.extend(f"  {f.get('kind')} {failure_line(f)}" for f in summary["failures"])
    for r in summary.get("regressions") or []:  # a series' newest checkpoint, significantly worse than its best
        lines.append(f"REGRESSED: {r['encoder']} is worse than {r['against']} on {r['cell']} "
                     f"({100 * r['difference']:+.2f} points, adjusted p = {r['p_adjusted']:.3g})")
    for r in summary.get("improvements") or []:  # tested as a regression is: significantly better
        lines.append(f"IMPROVED: {r['encoder']} is better than {r['against']} on {r['cell']} "
                     f"({100 * r['difference']:+.2f} points, adjusted p = {r['p_adjusted']:.3g})")
    lines.extend(warning_lines(summary.get("warnings") or []))

    if summary.get("report"):
        lines.append(f"report: {summary['report']}")
    if summary.get("summary_path"):
        lines.append(f"summary: {summary['summary_path']}")
    return lines


def summary_table(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows for a Prefect table artifact: one per fact, then one per failure."""
    rows = [{"item": k, "value": str(v)} for k, v in (
        ("why it ran", summary["reason"]), ("new encoders", ", ".join(summary["new_encoders"]) or "none"),
        ("extraction units", f"{summary['extracted']} extracted of {summary['units']}"),
        ("cells computed", summary["computed"]), ("cells from the ledger", summary["cached"]),
        ("cells failed", len(summary["failed"])), ("failures", len(summary["failures"])),
        ("report", summary.get("report") or "not written"), ("seconds", f"{summary['seconds']:.1f}"))]
    rows += [{"item": f"failed {f.get('kind')}", "value": failure_line(f)} for f in summary["failures"]]
    rows += [{"item": f"{'unreliable' if w.get('unreliable') else 'warning'} {w['encoder']} {w['cell']}",
              "value": ", ".join(w.get("codes") or [])} for w in summary.get("warnings") or []]
    return rows


def warning_lines(warnings: Sequence[Mapping[str, Any]], limit: int = 20) -> list[str]:
    """Terminal lines for the records with fit warnings (``jobs.report.events.warning_entry``):
    unreliable scores first, each with its reasons; the rest by their codes."""
    if not warnings:
        return []
    bad = [w for w in warnings if w.get("unreliable")]
    if bad:
        lines = [f"WARNINGS: {len(warnings)} record(s) carry fit warnings, {len(bad)} with a score that is not to "
                 "be trusted (no verdict is drawn from those)"]
    else:  # cautions only: the numbers stand, nothing to shout about
        lines = [f"cautions: {len(warnings)} record(s) carry cautions that do not change a number"]
    for w in bad[:limit]:
        reasons = "; ".join(m for m in w.get("messages") or [] if m.split(":")[0] in _UNRELIABLE)
        lines.append(f"  UNRELIABLE {w['encoder']} {w['cell']}: {reasons}")
    rest = [w for w in warnings if not w.get("unreliable")]
    for w in rest[:limit]:
        lines.append(f"  caution {w['encoder']} {w['cell']}: {', '.join(w.get('codes') or [])}")
    if len(bad) > limit or len(rest) > limit:
        lines.append("  ... (the report and `repeval results` list every one)")
    return lines
