"""The early estimates of a config as the report and ``repeval results --early`` show them:
the latest estimate of each of its encoders' cells under the current settings, beside the
check against its exact figure once there, and each protocol setting's coverage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.config import BenchmarkConfig
from jobs.config.protocols import settings_hash
from jobs.early.coverage import coverage_by_setting
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords

__all__ = ["early_part", "early_view"]


def early_view(store: FeatureStore, cfg: BenchmarkConfig | None) -> dict[str, Any]:
    """The early part of a config's report."""
    records = EarlyRecords(store)
    models = None if cfg is None else {e.name for e in cfg.encoders}
    current = None if cfg is None else {p.name: (p.protocol, settings_hash(p.protocol, p.settings))
                                        for p in cfg.protocols}
    latest: dict[tuple, Mapping[str, Any]] = {}
    for rec in records.iter("estimates"):
        if cfg is not None and (rec.get("model") not in models or current.get(rec.get("setting")) != (
                rec.get("protocol"), rec.get("config_hash"))):
            continue
        key = (rec["model"], rec["setting"], rec["dataset"], rec["layer"])
        if key not in latest or str(rec.get("recorded")) > str(latest[key].get("recorded")):
            latest[key] = rec
    checks = {c["id"]: c for c in records.iter("checks")}
    estimates = [{**rec, "check": checks.get(rec.get("id"))} for _, rec in sorted(latest.items())]
    names = {v: n for n, v in (current or {}).items()}
    coverage = [{"setting": names.get(key, key[0]), "protocol": key[0], "config_hash": key[1], "checks": s.checks,
                 "covered": s.covered, "level": s.level, "off": s.off, "line": s.line()}
                for key, s in sorted(coverage_by_setting(checks.values()).items()) if current is None or key in names]
    return {"estimates": estimates, "coverage": coverage}


def early_part(view: Mapping[str, Any]) -> dict[str, Any]:
    """The summary beside the report's ``early`` part: per estimate, its cell, value,
    interval, method, early verdicts and check; and the coverage lines."""
    out = []
    for rec in view.get("estimates") or []:
        e = rec.get("estimate") or {}
        check = rec.get("check") or {}
        out.append({"encoder": rec["model"], "cell": f"{rec['setting']}/{rec['dataset']}/{rec['layer']}",
                    "status": rec.get("status"), "estimate": e.get("value"), "low": e.get("low"),
                    "high": e.get("high"), "level": e.get("level"), "method": e.get("method"),
                    "reason": rec.get("reason"), "recorded": rec.get("recorded"),
                    "verdicts": [{k: v.get(k) for k in ("kind", "against", "verdict", "reason")}
                                 for v in rec.get("verdicts") or []],
                    "exact": check.get("exact"),
                    # what the interval is of: the exact figure, or (sampling) the early fit over the whole split
                    "target": check.get("target"), "held": check.get("covered")})
    return {"estimates": out, "coverage": list(view.get("coverage") or [])}
