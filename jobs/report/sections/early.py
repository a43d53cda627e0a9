"""The early estimates section: every early estimate of the config's encoders, marked as an
estimate, with its interval and how it was made, its early verdicts, and (once the exact
figure is in) how far it was and whether its interval held; then each protocol setting's
coverage. Never mixed with the exact tables above it."""

from __future__ import annotations

from typing import Any

from jobs.report.html import Markup, el, note, notice, pct, row_head, section, table
from jobs.report.model import ReportRun

__all__ = ["EARLY_MARKER", "early_section"]

#: Marks every early figure in the report.
EARLY_MARKER = "\u2248"


def _estimate(rec: dict[str, Any]) -> list[Any]:
    if rec.get("status") != "estimated":
        return ["-", rec.get("status", ""), rec.get("reason", "")]
    e = rec["estimate"]
    return [f"{EARLY_MARKER} {pct(e['value'])} [{pct(e['low'])}, {pct(e['high'])}]", e["method"], rec.get("how", "")]


def _verdicts(rec: dict[str, Any]) -> Markup | str:
    verdicts = rec.get("verdicts") or []
    if not verdicts:
        return "-"
    # each verdict with its reason (its interval against the figure, what backs it, when the
    # exact test may not tell the two apart) in the cell, and where the pointer rests
    return Markup("<br>".join(el("span", f"{v['kind']} {v['against']}: ", el("b", v["verdict"]),
                                 el("small", f" ({v['reason']})") if v.get("reason") else "", title=v.get("reason"))
                              for v in verdicts))


def _check(rec: dict[str, Any]) -> list[Any]:
    c = rec.get("check")
    if not c:
        return ["not yet", "", ""]
    held = "held" if c["covered"] else Markup(el("span", "missed", class_="mark-regression"))
    if c["method"] == "sampling":  # its interval is of the early fit over the whole test split, not of the exact
        held = Markup(f"{held} its figure (the early fit over the whole test split: {pct(c['target'])} %)")
    return [pct(c["exact"]), f"{100 * c['error']:+.1f}", held]


def early_section(run: ReportRun) -> Markup:
    """The section (empty when no early pass has estimated the config's encoders)."""
    view = run.early or {}
    estimates = view.get("estimates") or []
    if not estimates:
        return section("early", "Early estimates", note("No early pass has run for this config's encoders."),
                       empty=True)
    header = ["encoder", "cell", f"early estimate {EARLY_MARKER} (%, interval)", "method", "how", "early verdicts",
              "exact (%)", "estimate - exact (points)", "interval"]
    rows = [[row_head(r["model"]), f"{r['setting']}/{r['dataset']}/{r['layer']}", *_estimate(r), _verdicts(r),
             *_check(r)] for r in estimates]
    body: list[Any] = [
        note(f"Estimates ({EARLY_MARKER}) made from a part of each dataset before the exact figures existed "
             "(see docs/early.md): never used in the tables, correlations or verdicts above. Each is replaced "
             "by its exact figure in the same run; the last three columns say how far it was."),
        table(header, rows, class_="early")]
    coverage = view.get("coverage") or []
    if coverage:
        body.append(el("h3", "Coverage of the early intervals"))
        body.append(el("ul", [el("li", f"{c['setting']} ({c['protocol']}): {c['line']}") for c in coverage]))
        off = [c for c in coverage if c["off"]]
        if off:
            body.append(notice("Early pass off for: " + ", ".join(c["setting"] for c in off)
                               + " (its intervals held their figures less often than stated)."))
    return section("early", "Early estimates", *body)
