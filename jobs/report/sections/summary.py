"""The report's first screen: what the night's questions need, in the order they are asked.

1. the verdict in one line per series (and failures, untrusted scores, in one line each);
2. what regressed or improved: the effect, its interval and the test that decided it (and,
   where the bootstrap interval and the verdict may disagree, the line saying why:
   ``pipeline.analysis.compare.agreement``);
3. the leaderboard and the best checkpoint so far per series;
4. what is not to be trusted (``sections.trust``: unreliable cells in red, few; cautions
   that do not change a number grey, grouped by code, folded);
5. what changed since the previous run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobs.report.events import leaderboard_rows
from jobs.report.html import Markup, el, is_number, note, pct, row_head, section, table
from jobs.report.marks import FAILURE_MARKER, IMPROVEMENT_MARKER, REGRESSION_MARKER, UNRELIABLE_MARKER, mark
from jobs.report.model import ReportRun
from jobs.report.sections.trust import cautions_block, untrusted_block, untrusted_count

__all__ = ["REGRESSION_MARKER", "summary_section"]


def _leaderboard(rows: Sequence[Mapping[str, Any]]) -> Markup:
    settings = sorted({s for r in rows for s in r.get("scores", {})})
    body = []
    ranked = [r for r in rows if r.get("mean_rank") is not None]
    for place, r in enumerate(rows, 1):
        rank = r.get("mean_rank")
        cells: list[Any] = [str(place) if rank is not None else "\u2013", row_head(r["model"]),
                            f"{rank:.2f}" if is_number(rank) else "not ranked"]
        for s in settings:
            score, pos = r.get("scores", {}).get(s), r.get("ranks", {}).get(s)
            text = pct(score) if score is not None else "\u2013"
            cells.append(el("td", text + (f" ({pos:g})" if is_number(pos) else ""), data_model=r["model"],
                            data_setting=s))
        body.append(cells)
    parts = [table(["#", "encoder", "mean rank"] + settings, body, class_="scores leaderboard")]
    left_out = [r for r in rows if r.get("mean_rank") is None]
    if left_out:
        parts.append(note("Not ranked (no score in every setting): " + "; ".join(
            f"{r['model']} (missing {', '.join(r.get('missing', []))})" for r in left_out)))
    if not ranked:
        parts.append(note("No encoder has a score in every setting, so none is ranked."))
    return Markup("".join(parts))


def _interval(r: Mapping[str, Any]) -> str:
    """The deciding test's interval where it has one (exact McNemar), else the bootstrap one."""
    low, high = r.get("test_ci_low"), r.get("test_ci_high")
    if is_number(low) and is_number(high):
        return f"[{pct(low, 2)}, {pct(high, 2)}] (exact McNemar, given the discordant images)"
    low, high = r.get("ci_low"), r.get("ci_high")
    if is_number(low) and is_number(high):
        return f"[{pct(low, 2)}, {pct(high, 2)}] (bootstrap)"
    return "\u2013"


def _test(r: Mapping[str, Any]) -> str:
    test = r.get("test")
    if not test:
        return "\u2013"
    if str(test).startswith("mcnemar") and r.get("a_only") is not None:
        return f"{test}, {r['a_only'] + r['b_only']} of {r.get('n')} images discordant"
    return f"{test}, n = {r.get('n')}" if r.get("n") is not None else str(test)


def _regression_rows(regressions: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    rows = []
    for r in regressions:
        p_adj = r.get("p_adjusted")
        rows.append([el("td", mark(REGRESSION_MARKER), " worse", class_="regression"), r.get("series", "?"),
                     row_head(r["cell"]), f"{r['encoder']} (step {r.get('step', '?')})",
                     f"{r['against']} (step {r.get('best_step', '?')})", pct(r.get("difference"), 2),
                     _interval(r), _test(r), f"{p_adj:.3g}" if is_number(p_adj) else "\u2013"])
        if r.get("agreement"):
            rows.append([el("td", note(r["agreement"]), colspan=9, class_="agreement")])
    return rows


def _improvement_rows(run: ReportRun) -> list[list[Any]]:
    """Cells where the newest checkpoint is the best so far, by its margin over the previous best
    (not a tested claim: the series tests the newest against an earlier best, not the reverse)."""
    rows = []
    for analysis in run.series:
        newest, check = analysis.newest, analysis.check
        if newest is None or check is None:
            continue
        untrusted = {u["cell"] for u in analysis.unreliable}
        for cell in check.newest_is_best:
            label = "/".join(cell)
            running = analysis.running.get(cell) or []
            if label in untrusted or len(running) < 2:
                continue
            before = running[-2]
            if running[-1].score <= before.best_score:
                continue
            rows.append([el("td", mark(IMPROVEMENT_MARKER), " best so far", class_="improvement"), analysis.name,
                         row_head(label), f"{newest.encoder} (step {newest.step})",
                         f"{analysis.encoder_at(before.best_step)} (step {before.best_step})",
                         "+" + pct(running[-1].score - before.best_score, 2), "\u2013",
                         "not tested (a series tests its newest checkpoint for a regression)", "\u2013"])
    return rows


def _verdict_lines(run: ReportRun, regressions: Sequence[Mapping[str, Any]]) -> list[Markup]:
    """One line per series (its newest checkpoint's verdict), then failures and untrusted scores."""
    lines: list[Markup] = []
    for a in run.series:
        newest = a.newest
        if newest is None or a.check is None:
            continue
        worse = [r for r in regressions if r.get("series") == a.name]
        untrusted = {u["cell"] for u in a.unreliable}
        best = [c for c in a.check.newest_is_best if "/".join(c) not in untrusted]
        judged = len(a.scores)
        if worse:
            lines.append(el("p", mark(REGRESSION_MARKER), f" Series {a.name}: the newest checkpoint {newest.encoder} "
                                 f"(step {newest.step}) is significantly worse than the best so far on "
                                 f"{len(worse)} of {judged} cell(s).", class_="verdict bad"))
        else:
            lines.append(el("p", mark(IMPROVEMENT_MARKER) if best else "", f" Series {a.name}: the newest "
                                 f"checkpoint {newest.encoder} (step {newest.step}) is the best so far on "
                                 f"{len(best)} of {judged} cell(s) and significantly worse on none.",
                            class_="verdict good"))
    if not run.series and run.records:
        rows = leaderboard_rows(run.records)
        if rows and rows[0].get("mean_rank") is not None:
            lines.append(el("p", f"Best encoder by mean rank: {rows[0]['model']} (of {len(rows)}).", class_="verdict"))
    if run.failures:
        lines.append(el("p", mark(FAILURE_MARKER), " ", el("a", f"{len(run.failures)} failure(s)", href="#failed"),
                        ": those have no result.", class_="verdict bad"))
    n_bad = untrusted_count(run)
    if n_bad:
        lines.append(el("p", mark(UNRELIABLE_MARKER), " ", el("a", f"{n_bad} score(s) not to be trusted",
                                                               href="#untrusted"),
                        ": no verdict is drawn from them.", class_="verdict bad"))
    if not run.failures and run.records:
        lines.append(el("p", "Nothing failed and every score can back a verdict." if not n_bad
                        else "Nothing failed.", class_="verdict"))
    return lines


def _best_so_far(run: ReportRun) -> Markup | str:
    rows = []
    for a in run.series:
        for cell, running in sorted(a.running.items()):
            if not running:
                continue
            last = running[-1]
            rows.append([a.name, row_head("/".join(cell)), f"{a.encoder_at(last.best_step)} (step {last.best_step})",
                         pct(last.best_score), f"{pct(last.score)} (step {last.step})"])
    if not rows:
        return ""
    return table(["series", "cell", "best so far", "its score (%)", "newest (%)"], rows, class_="scores best-so-far")


def _changes(changes: Mapping[str, Any] | None) -> list[Markup]:
    if changes is None:
        return [note("No previous run summary beside this report: everything here is new.")]
    items: list[Markup] = []
    for key, title in (("new_encoders", "new encoders"), ("removed_encoders", "encoders no longer shown"),
                       ("new_cells", "new cells")):
        if changes.get(key):
            items.append(el("li", f"{title} ({len(changes[key])}): {', '.join(map(str, changes[key][:30]))}"))
    if changes.get("regressions"):
        items.append(el("li", f"new regressions ({len(changes['regressions'])}): " + "; ".join(
            f"{r['encoder']} {r['cell']} against {r['against']}" for r in changes["regressions"][:20])))
    fails = changes.get("failures") or []
    new_fails = [f for f in fails if f.get("new")]
    if fails:
        items.append(el("li", f"failed cells: {len(fails)} ({len(new_fails)} new since the previous run)"))
    if changes.get("recovered"):
        items.append(el("li", f"recovered ({len(changes['recovered'])}): " + ", ".join(
            f"{r['encoder']} {r['cell']}" for r in changes["recovered"][:20])))
    moved = changes.get("changed_scores") or []
    if moved:
        biggest = sorted(moved, key=lambda c: -abs(c["change"]))[:10]
        items.append(el("li", f"scores that changed ({len(moved)}), largest first: " + ", ".join(
            f"{c['encoder']} {c['cell']} {pct(c['change'], 2):s} pts" for c in biggest)))
    if not items:
        return [note("Nothing changed since the previous run.")]
    return [el("ul", items)]


def summary_section(run: ReportRun) -> Markup:
    """The first screen: verdicts, what regressed or improved, leaderboard and best so far,
    what is not to be trusted, what changed since the previous run."""
    summary = run.summary or {}
    regressions = summary.get("regressions") or [r for s in run.series for r in s.regressions()]
    body: list[Any] = [el("div", _verdict_lines(run, regressions), id="verdict")]
    moved = _regression_rows(regressions) + _improvement_rows(run)
    if moved:
        body += [el("h3", "Regressed or improved"),
                 table(["", "series", "cell", "newest", "against", "effect (points)", "95 % interval (points)",
                        "test", "adjusted p"], moved, class_="warnings changes"),
                 note("Effect: newest minus the best earlier checkpoint. The interval is the deciding test's own "
                      "where it has one (exact McNemar: Clopper-Pearson on the discordant images), else the "
                      "paired bootstrap's; adjusted p: Benjamini-Hochberg over the series' cells.")]
    body.append(el("h3", "Leaderboard"))
    rows = summary.get("leaderboard") if "leaderboard" in summary else leaderboard_rows(run.records)
    body.append(_leaderboard(rows) if rows else note("No scored records yet."))
    body.append(note("Mean rank over the protocol settings (1 = best; ties share the average rank). A setting's "
                     "score (%) is the mean over its datasets of the encoder's best layer; its rank in brackets."))
    best = _best_so_far(run)
    if best:
        body += [el("h3", "Best so far per series"), best]
    body += [untrusted_block(run), cautions_block(run)]
    body.append(el("h3", "Since the previous run"))
    body += _changes(run.changes)
    return section("summary", "Summary", body)
