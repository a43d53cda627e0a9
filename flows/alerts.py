"""Prefect events of a benchmark run, for automations that notify a channel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect.events import emit_event

from jobs.report.events import event_payload
from storage_schema.provenance import stable_hash

EVALUATED_EVENT = "repeval.checkpoint.evaluated"
REGRESSED_EVENT = "repeval.checkpoint.regressed"
EARLY_EVENT = "repeval.checkpoint.early"
EARLY_REGRESSED_EVENT = "repeval.checkpoint.early-regressed"
#: Entries an event's lists keep (the whole record is one file away).
EVENT_LIST_LIMIT = 50


def report_resource(report_path: str) -> dict[str, str]:
    """The events' resource: one benchmark, named by its report's path."""
    return {"prefect.resource.id": f"repeval.report.{stable_hash(str(report_path), 16)}",
            "prefect.resource.name": str(report_path)}


def emit_run_events(payload: Mapping[str, Any], report_path: str) -> list[str]:
    """Emit the run's events; the names of those emitted."""
    resource = report_resource(report_path)
    names = [EVALUATED_EVENT] + ([REGRESSED_EVENT] if payload.get("regressions") else [])
    for name in names:
        emit_event(event=name, resource=resource, payload=dict(payload))
    return names


def run_payload(final: Mapping[str, Any] | None, outcomes: list[Mapping[str, Any]],
                failures: list[Mapping[str, Any]], report_path: str) -> dict[str, Any]:
    """The events' payload: from the summary the report step wrote, or, when that step
    failed, what the run itself knows (encoders evaluated, failures; no verdicts)."""
    if final and final.get("summary") is not None:
        return event_payload(final["summary"], final.get("summary_path"))
    evaluated = sorted({str(o.get("model")) for o in outcomes if o.get("status") == "computed"})
    fallback = {"report": None, "evaluated": evaluated, "regressions": [], "series": [], "leaderboard": [],
                "failures": [dict(f) for f in failures], "changes": {}}
    payload = event_payload(fallback, None)
    payload["report_failed"] = report_path
    return payload


def emit_early_event(estimates: list[Mapping[str, Any]], report_path: str) -> dict[str, Any]:
    """Emit ``repeval.checkpoint.early`` for a run's early estimates, and
    ``repeval.checkpoint.early-regressed`` when an early verdict is ``worse``; the payload."""
    # The payload: ``encoders`` (the new ones), ``worse`` and ``better`` (each early verdict
    # that is one: ``encoder``, ``cell``, ``kind``, ``against``, ``estimate``, ``low``, ``high``,
    # ``against_value``), ``estimates`` (how many), ``early: true`` and ``truncated`` (a list
    # cut at ``EVENT_LIST_LIMIT`` entries). Early verdicts are estimates: an automation that
    # acts on them says so.
    found: dict[str, list[dict[str, Any]]] = {"worse": [], "better": []}
    for rec in estimates:
        e = rec.get("estimate") or {}
        for v in rec.get("verdicts") or []:
            if v.get("verdict") in found:
                found[v["verdict"]].append({
                    "encoder": rec["model"], "cell": f"{rec['setting']}/{rec['dataset']}/{rec['layer']}",
                    "kind": v["kind"], "against": v["against"], "estimate": e.get("value"), "low": e.get("low"),
                    "high": e.get("high"), "against_value": v.get("against_value")})
    payload = {"early": True, "encoders": sorted({str(r["model"]) for r in estimates}),
               "estimates": sum(r.get("status") == "estimated" for r in estimates),
               "truncated": any(len(v) > EVENT_LIST_LIMIT for v in found.values()),
               **{k: v[:EVENT_LIST_LIMIT] for k, v in found.items()}}
    for name in [EARLY_EVENT] + ([EARLY_REGRESSED_EVENT] if found["worse"] else []):
        emit_event(event=name, resource=report_resource(report_path), payload=payload)
    return payload
