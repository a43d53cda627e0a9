"""What must not be missed: failures (at the top), data problems, solver warnings (every
record with a fit warning: untrusted scores red, cautions grey and folded), and the
invariance audit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.report.html import Markup, el, label_of, link, note, notice, pct, row_head, section, table
from jobs.report.model import ReportRun
from jobs.report.marks import CAUTION_MARKER, UNRELIABLE_MARKER, mark
from pipeline.protocols.fit_warnings import record_warnings, unreliable_reasons

VIOLATION_MARKER = "\u26a0"
_KIND_TITLE = {"cell": "cell", "extraction": "extraction", "checkpoint": "checkpoint file",
               "correlation": "correlation and report"}


def failed_section(run: ReportRun) -> Markup:
    """Every failure of this config's work still on record (a later success clears it)."""
    fails = run.failures
    if not fails:
        return section("failed", "Failed cells", note("Nothing failed: every cell, extraction, checkpoint "
                                                      "and correlation of this config succeeded when last run."),
                       empty=True)
    rows = [[_KIND_TITLE.get(str(f.get("kind")), str(f.get("kind"))), f.get("label", "?"), f.get("reason", ""),
             f.get("attempts", 1), f.get("first_failed", ""), f.get("recorded", "")] for f in fails]
    return section("failed", "Failed cells",
                   notice(f"{len(fails)} failure(s): these have no result; the rest of the report "
                          "stands without them. A later run that succeeds clears them."),
                   table(["what", "name", "reason", "attempts", "first failed", "last failed"], rows,
                         class_="warnings"), class_="failing")


def data_section(run: ReportRun) -> Markup:
    """What the dataset adapters tolerated (unreadable images left out, classes with too few
    images), and checkpoints still being written."""
    body: list[Any] = []
    for n in run.data_notes:
        items = [str(i) for i in n.get("items") or []]
        body.append(notice(f"{n.get('where')}: {n.get('what')}"))
        if items:
            body.append(el("ul", [el("li", i) for i in items[:50]]
                           + ([el("li", f"... {len(items) - 50} more")] if len(items) > 50 else [])))
    for path in run.waiting:
        body.append(note(f"checkpoint {path} is still being written; a later scan evaluates it"))
    if not body:
        return section("data", "Data problems", note("No image was left out and no class was too small for a "
                                                      "protocol."), empty=True)
    return section("data", "Data problems", body)


def _invariance_table(rec: Mapping[str, Any]) -> Markup:
    cells = [c for c in rec["metrics"]["records"] if isinstance(c, Mapping)]
    protocols = list(dict.fromkeys(str(c.get("protocol")) for c in cells))
    maps = list(dict.fromkeys(str(c.get("map")) for c in cells))
    at = {(str(c.get("protocol")), str(c.get("map"))): c for c in cells}
    rows = []
    for p in protocols:
        row: list[Any] = [row_head(p)]
        for mp in maps:
            c = at.get((p, mp))
            if c is None:
                row.append("\u2013")
                continue
            expected = {True: "yes", False: "no"}.get(c.get("expected_invariant"), "\u2013")
            violation = c.get("expected_invariant") is True and (c.get("n_changed") or 0) > 0
            text = [link(rec, f"{pct(c.get('fraction_changed'))} %"),
                    el("span", f" expected {expected}", class_="expected")]
            if violation:
                text.append(el("strong", f" {VIOLATION_MARKER} violation"))
            row.append(el("td", text, class_="violation" if violation else None,
                          title=f"{c.get('n_changed')} of {c.get('n_test')} test predictions changed; accuracy "
                                f"{pct(c.get('accuracy_before'))} -> {pct(c.get('accuracy_after'))} %"))
        rows.append(row)
    return table(["protocol"] + maps, rows, class_="invariance")


def invariance_section(run: ReportRun) -> Markup:
    """The invariance audit: predictions changed by each feature map, violations marked."""
    recs = [r for r in run.records if isinstance((r.get("metrics") or {}).get("records"), list)]
    body: list[Any] = [note("Fraction of test predictions changed by each map of the features, and whether "
                            "the protocol is expected to ignore it. A cell expected invariant whose "
                            f"predictions changed is a violation ({VIOLATION_MARKER}).")]
    if not recs:
        return section("invariance", "Invariance audit", body, note("No invariance audit in this run."), empty=True)
    for rec in recs:
        n_bad = rec["metrics"].get("violations", 0)
        body += [el("h3", link(rec, label_of(rec))),
                 el("p", f"violations: {n_bad}", class_="notice" if n_bad else None),
                 _invariance_table(rec)]
    return section("invariance", "Invariance audit", body)


def _needs_warning(rec: Mapping[str, Any]) -> bool:
    return bool(record_warnings(rec))


def _warning_rows(shown: list[tuple[dict, bool]]) -> list[list[Any]]:
    """One row per record with warnings: its cell, whether it converged, the warnings, the solver's facts."""
    rows = []
    for rec, aside in shown:
        dg = rec.get("diagnostics") or {}
        solver = ", ".join(f"{k} = {dg[k]}" for k in ("n_iter", "C", "alpha", "calibration_fit_converged") if k in dg)
        warnings = [f"{w['code']}: {w['message']}" for w in record_warnings(rec)]
        rows.append([link(rec, label_of(rec) + (" (set aside)" if aside else "")), rec.get("model"),
                     rec.get("dataset"), rec.get("layer"), rec.get("setting"),
                     "no" if rec.get("converged") is False else "yes",
                     el("ul", [el("li", w) for w in warnings]) if warnings else "\u2013", solver or "\u2013"])
    return rows


_WARNING_HEADER = ["cell", "encoder", "dataset", "layer", "setting", "converged", "warnings", "solver diagnostics"]


def warnings_section(run: ReportRun) -> Markup:
    """Every record with a fit warning or an unconverged solver, and the run's problems: the
    scores not to be trusted in red, the cautions (the number stands, an unconverged fit
    included) grey and folded, as on the first screen."""
    shown = [(r, False) for r in run.records if _needs_warning(r)]
    shown += [(r, True) for r in run.aside if _needs_warning(r)]
    body: list[Any] = [notice(p) for p in run.problems]
    if not shown:
        body.append(note("Every fit converged and no record carries a warning."))
        return section("warnings", "Solver warnings", body, empty=not run.problems)
    bad = [(r, aside) for r, aside in shown if unreliable_reasons(r)]
    mild = [(r, aside) for r, aside in shown if not unreliable_reasons(r)]
    if bad:
        body += [notice([mark(UNRELIABLE_MARKER), f" {len(bad)} record(s) whose score is not to be trusted:"]),
                 table(_WARNING_HEADER, _warning_rows(bad), class_="warnings untrusted")]
    if mild:
        codes: dict[str, int] = {}
        for rec, _ in mild:
            for code in dict.fromkeys(w["code"] for w in record_warnings(rec)):
                codes[code] = codes.get(code, 0) + 1
        counts = ", ".join(f"{c} \u00d7{n}" for c, n in sorted(codes.items(), key=lambda kv: -kv[1]))
        body.append(el("details", el("summary", mark(CAUTION_MARKER), f" {len(mild)} record(s) with cautions that "
                                                                       f"do not change a number: {counts}"),
                       table(_WARNING_HEADER, _warning_rows(mild), class_="warnings"), class_="cautions"))
    return section("warnings", "Solver warnings", body)
