"""The report's opening: a leaderboard (mean rank over the protocol settings, with each
setting's score) and what changed since the previous run (new encoders and cells,
regressions of checkpoint series, failures), before the detailed tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobs.report.events import leaderboard_rows
from jobs.report.html import Markup, el, is_number, note, notice, pct, row_head, section, table
from jobs.report.model import ReportRun

REGRESSION_MARKER = "\u26a0"


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


def _regression_lines(regressions: Sequence[Mapping[str, Any]]) -> list[Markup]:
    out = []
    for r in regressions:
        out.append(el("li", f"{REGRESSION_MARKER} {r['encoder']} (series {r.get('series', '?')}, step "
                             f"{r.get('step', '?')}) is worse than {r['against']} (step {r.get('best_step', '?')}) on "
                             f"{r['cell']}: {pct(r.get('difference'), 2)} points, adjusted p = "
                             f"{r.get('p_adjusted', float('nan')):.3g}"))
    return out


def _changes(changes: Mapping[str, Any] | None) -> list[Markup]:
    if changes is None:
        return [note("No previous run summary beside this report: everything below is new.")]
    items: list[Markup] = []
    for key, title in (("new_encoders", "new encoders"), ("removed_encoders", "encoders no longer shown"),
                       ("new_cells", "new cells")):
        if changes.get(key):
            items.append(el("li", f"{title} ({len(changes[key])}): {', '.join(map(str, changes[key][:30]))}"))
    if changes.get("regressions"):
        items.append(el("li", f"new regressions ({len(changes['regressions'])}):",
                        el("ul", _regression_lines(changes["regressions"]))))
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
    """Leaderboard, regressions and changes since the previous run (empty without a summary)."""
    summary = run.summary or {}
    body: list[Any] = []
    regressions = summary.get("regressions") or [r for s in run.series for r in s.regressions()]
    if regressions:
        body.append(notice(f"{REGRESSION_MARKER} {len(regressions)} regression(s): the newest checkpoint of a "
                           "series is significantly worse than the series' best so far"))
        body.append(el("ul", _regression_lines(regressions)))
    untrusted = [(str((entry.get("newest") or {}).get("encoder")), u) for entry in summary.get("series") or []
                 for u in entry.get("unreliable") or []]
    if untrusted:  # neither a regression nor an improvement is claimed from these
        body.append(notice(f"{REGRESSION_MARKER} no verdict on {len(untrusted)} cell(s) of a series' newest "
                           "checkpoint: a score there is not to be trusted"))
        body.append(el("ul", [el("li", f"{enc} {u['cell']}: unreliable: {u['reason']}") for enc, u in untrusted]))
    body.append(el("h3", "Leaderboard"))
    body.append(note("Mean rank over the protocol settings (1 = best; ties share the average rank). A "
                     "setting's score (%) is the mean over its datasets of the encoder's best layer; the rank "
                     "in that setting is in brackets."))
    rows = summary.get("leaderboard") if "leaderboard" in summary else leaderboard_rows(run.records)
    body.append(_leaderboard(rows) if rows else note("No scored records yet."))
    body.append(el("h3", "Since the previous run"))
    body += _changes(run.changes)
    return section("summary", "Summary", body)
