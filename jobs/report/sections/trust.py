"""What is not to be trusted, on the first screen: the records whose score is unreliable (red,
each named, few), and the cautions that do not change a number (grey, grouped by warning
code with a count, folded: a night of plateaus is one line, not a wall of red)."""

from __future__ import annotations

from typing import Any

from jobs.report.html import Markup, el, label_of, link, note
from jobs.report.marks import CAUTION_MARKER, UNRELIABLE_MARKER, mark
from jobs.report.model import ReportRun
from pipeline.protocols.fit_warnings import CAUTION, WARNING_CODES, record_warnings, unreliable_reasons

__all__ = ["cautions_block", "untrusted_block", "untrusted_count"]


def _series_only(run: ReportRun) -> list[tuple[str, dict[str, str]]]:
    """Series cells without a verdict whose newest record is not itself listed as unreliable
    (the best earlier checkpoint's record is the untrusted one)."""
    listed = {(str(r.get("model")), f"{r.get('setting')}/{r.get('dataset')}/{r.get('layer')}")
              for r in run.records if unreliable_reasons(r)}
    out = []
    for a in run.series:
        newest = a.newest.encoder if a.newest else "?"
        out += [(a.name, u) for u in a.unreliable if (newest, u["cell"]) not in listed]
    return out


def untrusted_count(run: ReportRun) -> int:
    """How many scores (or series verdicts) are not to be trusted."""
    return sum(1 for r in run.records if unreliable_reasons(r)) + len(_series_only(run))


def untrusted_block(run: ReportRun) -> Markup:
    """The unreliable records (red, linked to their provenance); empty when there are none."""
    bad = sorted((r for r in run.records if unreliable_reasons(r)), key=label_of)
    series = _series_only(run)
    if not bad and not series:
        return Markup("")
    items = [el("li", mark(UNRELIABLE_MARKER), " ", link(r, label_of(r)), ": ", "; ".join(unreliable_reasons(r)))
             for r in bad]
    items += [el("li", mark(UNRELIABLE_MARKER), f" series {name}, {u['cell']}: no verdict: {u['reason']}")
              for name, u in series]
    return el("div", el("h3", mark(UNRELIABLE_MARKER), f" Not to be trusted ({len(items)})"),
              note("No comparison, best mark or series verdict is drawn from these scores."),
              el("ul", items, class_="untrusted"), id="untrusted", class_="untrusted")


def cautions_block(run: ReportRun) -> Markup:
    """The cautions (severity ``caution``: the number stands), grouped by code, folded."""
    by_code: dict[str, list[tuple[dict, str]]] = {}
    for rec in run.records:
        for w in record_warnings(rec):
            if WARNING_CODES[w["code"]][0] == CAUTION:
                by_code.setdefault(w["code"], []).append((rec, w["message"]))
    if not by_code:
        return Markup("")
    total = sum(len(v) for v in by_code.values())
    counts = ", ".join(f"{code} \u00d7{len(v)}" for code, v in sorted(by_code.items(), key=lambda kv: -len(kv[1])))
    groups: list[Any] = []
    for code, found in sorted(by_code.items(), key=lambda kv: -len(kv[1])):
        groups.append(el("details", el("summary", mark(CAUTION_MARKER), f" {code} ({len(found)}): ",
                                       WARNING_CODES[code][1]),
                         el("ul", [el("li", link(rec, label_of(rec)), ": ", message) for rec, message in found]),
                         class_="caution-code", data_code=code))
    return el("details", el("summary", mark(CAUTION_MARKER), f" {total} caution(s) that do not change a number: "
                                                               f"{counts}"),
              note("Worth knowing, but the score stands; the full list is under the solver warnings."),
              groups, id="cautions", class_="cautions")
