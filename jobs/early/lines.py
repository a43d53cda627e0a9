"""What the terminal, the run summary and the report say of the early pass."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.protocols.registry import headline_value

__all__ = ["check_lines", "early_ranks", "early_summary", "estimate_line", "figure", "rank_line"]


def figure(value: float | None, bounded: bool = True) -> str:
    """A score as the early lines print it: a percentage with one decimal for fractions."""
    if value is None:
        return "-"
    return f"{100 * value:.1f} %" if bounded else f"{value:.4g}"


def estimate_line(rec: Mapping[str, Any]) -> str:
    """One line per early estimate: the cell, the estimate and its interval, how it was made,
    and each early verdict; or why there is none."""
    cell = f"{rec['setting']}/{rec['dataset']}/{rec['layer']}"
    head = f"early {rec['model']} {cell}:"
    if rec.get("status") != "estimated":
        return f"{head} {rec.get('reason')}"
    e = rec["estimate"]
    text = (f"{head} {figure(e['value'])} [{figure(e['low'])}, {figure(e['high'])}] ({e['level']:.0%}, "
            f"{e['method']}: {rec.get('how')})")
    for v in rec.get("verdicts") or []:
        what = "" if v.get("against_what", "exact") == "exact" else f"{v['against_what']} "
        text += f"; vs {v['kind']} {v['against']} ({what}{figure(v.get('against_value'))}): {v['verdict']}"
        if v.get("reason"):  # what decided it, and where the exact test may not tell the two apart
            text += f" ({v['reason']})"
    if rec.get("unreliable") and not rec.get("verdicts"):  # else each verdict's reason says it
        text += f"; its early fit is unreliable: {' | '.join(rec['unreliable'])}"
    return text


def early_ranks(estimates: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Where each newly estimated encoder would rank per setting, by its estimate, among the
    encoders with exact figures on the same datasets and the other new encoders' estimates
    (each setting's score is the mean over its datasets of the encoder's best layer, as the
    leaderboard's), and from its interval's ends the best and worst rank it allows."""
    # Only estimates of the full figures (``paired``, ``history``, ``change``) rank. A sampling
    # estimate is of the readout fitted on the early rows, which usually scores below the
    # full one, so a setting with one gives no rank.
    exact: dict[tuple[str, str], dict[str, dict[str, float]]] = {}  # (setting, model) -> dataset -> layer score
    for rec in records:
        score = headline_value(rec)
        if score is not None:
            exact.setdefault((rec["setting"], rec["model"]), {}).setdefault(rec["dataset"], {})[rec["layer"]] = score
    mine: dict[tuple[str, str], dict[str, list]] = {}
    sampled = set()
    for rec in estimates:
        if rec.get("status") != "estimated":
            continue
        e = rec["estimate"]
        if e["method"] == "sampling":
            sampled.add((rec["model"], rec["setting"]))
        mine.setdefault((rec["model"], rec["setting"]), {}).setdefault(rec["dataset"], []).append(
            (e["value"], e["low"], e["high"]))
    of_full = {k: v for k, v in mine.items() if k not in sampled}

    def setting_score(by_dataset: Mapping[str, list], datasets: list[str], i: int) -> float:
        best = [max(by_dataset[d]) for d in datasets]  # the best layer by its estimate
        return sum(b[i] for b in best) / len(best)

    out = []
    for (model, setting), by_dataset in sorted(of_full.items()):
        datasets = sorted(by_dataset)
        value, low, high = (setting_score(by_dataset, datasets, i) for i in range(3))
        others = [sum(max(layers.values()) for layers in (scores[d] for d in datasets)) / len(datasets)
                  for (s, m), scores in exact.items() if s == setting and m != model and all(d in scores for d in datasets)]
        others += [setting_score(theirs, datasets, 0) for (m, s), theirs in of_full.items()
                   if s == setting and m != model and all(d in theirs for d in datasets)]
        out.append({"model": model, "setting": setting, "datasets": datasets, "estimate": value,
                    "rank": 1 + sum(o > value for o in others), "best_rank": 1 + sum(o > high for o in others),
                    "worst_rank": 1 + sum(o >= low for o in others), "of": len(others) + 1})
    return out


def rank_line(rank: Mapping[str, Any]) -> str:
    """One early rank: ``early rank of <encoder> on <setting>: 3 of 8 (2 to 5 within its intervals)``."""
    spread = (f"{rank['best_rank']} to {rank['worst_rank']}" if rank["best_rank"] != rank["worst_rank"]
              else f"{rank['rank']}")
    return (f"early rank of {rank['model']} on {rank['setting']} ({', '.join(rank['datasets'])}): {rank['rank']} of "
            f"{rank['of']} by its estimate, {spread} within its intervals")


def early_summary(estimates: list[Mapping[str, Any]], checks: list[Mapping[str, Any]],
                  coverage: Mapping[tuple[str, str], Any], left_out: list[Mapping[str, str]],
                  records: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The run summary's ``early`` part."""
    return {
        "estimates": [{k: rec.get(k) for k in ("model", "setting", "dataset", "layer", "status", "reason",
                                               "estimate", "how", "verdicts", "early_score", "unreliable", "id")}
                      for rec in estimates],
        "lines": [estimate_line(rec) for rec in estimates],
        "ranks": early_ranks(estimates, records),
        "checks": [dict(c) for c in checks],
        "coverage": [{"protocol": p, "config_hash": h, "checks": s.checks, "covered": s.covered,
                      "level": s.level, "off": s.off, "line": s.line()} for (p, h), s in sorted(coverage.items())],
        "left_out": list(left_out),
    }


def check_lines(summary: Mapping[str, Any] | None) -> list[str]:
    """What a run says after its exact figures replaced its early estimates: how far each
    estimate was, how many intervals held, and every protocol setting whose early pass the
    coverage turned off."""
    if not summary:
        return []
    out = []
    checks = summary.get("checks") or []
    if checks:
        errors = sorted(abs(c["error"]) for c in checks)
        held = sum(bool(c["covered"]) for c in checks)
        out.append(f"early estimates replaced by the exact figures: {len(checks)} checked, median error "
                   f"{100 * errors[len(errors) // 2]:.1f} points, {held} of {len(checks)} intervals held their figure")
        for c in checks:
            if not c["covered"]:
                out.append(f"  early estimate of {c['model']} {c['setting']}/{c['dataset']}/{c['layer']} missed: "
                           f"{figure(c['estimate'])} [{figure(c['low'])}, {figure(c['high'])}], "
                           f"the figure was {figure(c['target'])} ({c['method']})")
    for cov in summary.get("coverage") or []:
        if cov["off"]:
            out.append(f"WARNING early pass of protocol {cov['protocol']} (settings {cov['config_hash']}): "
                       f"{cov['line']}")
    return out
