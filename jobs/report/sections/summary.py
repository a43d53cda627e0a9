"""The report's first screen: what the night's questions need, in the order they are asked."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from jobs.report.events import leaderboard_rows
from jobs.report.html import Markup, el, is_number, name, note, pct, row_head, section, table
from jobs.report.marks import FAILURE_MARKER, IMPROVEMENT_MARKER, REGRESSION_MARKER, UNRELIABLE_MARKER, mark
from jobs.report.model import ReportRun
from jobs.report.sections.trust import cautions_block, untrusted_block, untrusted_count

__all__ = ["REGRESSION_MARKER", "summary_section"]


def _places(rows: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Each row's place: 1 + the ranked rows with a smaller mean rank, so tied mean ranks
    share one place (None: not ranked)."""
    ranks = [r.get("mean_rank") for r in rows]
    known = [x for x in ranks if is_number(x)]
    # a mean rank is a mean of halves and wholes: equal within float rounding is a tie
    return [1 + sum(1 for y in known if y < x and not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12))
            if is_number(x) else None for x in ranks]


def _leaderboard(rows: Sequence[Mapping[str, Any]]) -> Markup:
    settings = sorted({s for r in rows for s in r.get("scores", {})})
    body = []
    ranked = [r for r in rows if r.get("mean_rank") is not None]
    places = _places(rows)
    tied = {p for p in places if p is not None and places.count(p) > 1}
    for r, place in zip(rows, places):
        rank = r.get("mean_rank")
        untrusted = set(r.get("unreliable") or ())
        head: list[Any] = [r["model"]]
        if untrusted:
            head += [" ", mark(UNRELIABLE_MARKER)]
        cells: list[Any] = [
            el("td", str(place), title="tied" if place in tied else None) if place is not None else "\u2013",
            el("th", head, scope="row", class_="untrusted" if untrusted else None,
               title=f"a score not to be trusted ({', '.join(sorted(untrusted))}): its rank is no verdict"
               if untrusted else None),
            f"{rank:.2f}" if is_number(rank) else "not ranked"]
        for s in settings:
            score, pos = r.get("scores", {}).get(s), r.get("ranks", {}).get(s)
            text = pct(score) if score is not None else "\u2013"
            content: list[Any] = [text + (f" ({pos:g})" if is_number(pos) else "")]
            if s in untrusted:
                content += [" ", mark(UNRELIABLE_MARKER)]
            cells.append(el("td", content, data_model=r["model"], data_setting=s,
                            class_="untrusted" if s in untrusted else None,
                            title="not to be trusted" if s in untrusted else None))
        body.append(cells)
    parts = [table(["#", "encoder", "mean rank"] + settings, body, class_="scores leaderboard")]
    if any(r.get("unreliable") for r in rows):
        parts.append(note(f"{UNRELIABLE_MARKER}: the score rests on a record not to be trusted (see 'Not to be "
                          "trusted' below); its rank is no verdict."))
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
        return f"[{pct(low, 2)}, {pct(high, 2)}] (exact McNemar)"
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


def _named(encoder: str, step: Any) -> Markup:
    """``<encoder> (step <n>)``, each part on one line (a long name never splits at a hyphen)."""
    return Markup(name(encoder) + " " + name(f"(step {'?' if step is None else step})"))


def _signed(value: Any) -> str:
    """An effect in points with its sign (+2.04, -3.20)."""
    return f"{100.0 * value:+.2f}" if is_number(value) else "n/a"


def _change_rows(entries: Sequence[Mapping[str, Any]], better: bool) -> list[list[Any]]:
    """A regression's (or an improvement's) row: the effect, the deciding test's interval,
    the test and its adjusted p, and where the bootstrap interval reads otherwise, why."""
    symbol, word, cls = ((IMPROVEMENT_MARKER, " better", "improvement") if better
                         else (REGRESSION_MARKER, " worse", "regression"))
    rows = []
    for r in entries:
        p_adj = r.get("p_adjusted")
        # newest over against in one cell, each name whole but free to break before its step:
        # two long checkpoint names side by side push the test and its p off a 1280-pixel screen
        pair = el("td", _named(r["encoder"], r.get("step")), Markup("<br>"), "against ",
                  _named(r["against"], r.get("best_step")), class_="pair")
        rows.append([el("td", mark(symbol), word, class_=cls), r.get("series", "?"), row_head(r["cell"]), pair,
                     _signed(r.get("difference")), _interval(r), _test(r),
                     f"{p_adj:.3g}" if is_number(p_adj) else "\u2013"])
        if r.get("agreement"):
            rows.append([el("td", note(r["agreement"]), colspan=8, class_="agreement")])
    return rows


def _verdict_lines(run: ReportRun, regressions: Sequence[Mapping[str, Any]],
                   improvements: Sequence[Mapping[str, Any]]) -> list[Markup]:
    """One line per series (its newest checkpoint's verdict), then failures and untrusted scores."""
    lines: list[Markup] = []
    for a in run.series:
        newest = a.newest
        if newest is None or a.check is None:
            continue
        worse = [r for r in regressions if r.get("series") == a.name]
        gained = [r for r in improvements if r.get("series") == a.name]
        untrusted = {u["cell"] for u in a.unreliable}
        best = [c for c in a.check.newest_is_best if "/".join(c) not in untrusted]
        judged = len(a.scores)
        gains = (f"significantly better than the earlier best on {len(gained)}" if gained
                 else "significantly better than the earlier best on none")
        if worse:
            lines.append(el("p", mark(REGRESSION_MARKER), f" Series {a.name}: the newest checkpoint {newest.encoder}"
                                 f" (step {newest.step}) is significantly worse than the best so "
                            f"far on {len(worse)} of {judged} cell(s)" + (f"; {gains}." if gained else "."),
                            class_="verdict bad"))
        else:
            lines.append(el("p", mark(IMPROVEMENT_MARKER) if gained else "", f" Series {a.name}: the newest "
                                 f"checkpoint {newest.encoder} (step {newest.step}) is the best so far on {len(best)} "
                                 f"of {judged} cell(s) ({gains}) and significantly worse on none.",
                            class_="verdict good"))
    if not run.series and run.records:
        rows = leaderboard_rows(run.records)
        places = _places(rows)
        top = [r for r, p in zip(rows, places) if p == 1]
        if top:
            shaky = [r["model"] for r in top if r.get("unreliable")]
            text = (f"Best encoder by mean rank: {top[0]['model']} (of {len(rows)})." if len(top) == 1 else
                    f"Best encoders by mean rank, tied: {', '.join(r['model'] for r in top)} (of {len(rows)}).")
            if shaky:
                lines.append(el("p", text, " ", mark(UNRELIABLE_MARKER), f" A score of {', '.join(shaky)} is not "
                                "to be trusted: the rank is no verdict.", class_="verdict"))
            else:
                lines.append(el("p", text, class_="verdict"))
    if run.failures:
        lines.append(el("p", mark(FAILURE_MARKER), " ", el("a", f"{len(run.failures)} failure(s)", href="#failed"),
                        ": those have no result.", class_="verdict bad"))
    lost = [t for t in (run.summary or {}).get("trackers") or [] if t.get("error")]
    for t in lost:  # the scores are in the ledger and here; the lab's tracker lacks them
        lines.append(el("p", mark(FAILURE_MARKER), f" {t.get('kind')} tracker {t.get('where')}: the new scores "
                        f"were not logged: {t['error']} (the records are in the ledger).",
                        class_="verdict bad tracker"))
    n_bad = untrusted_count(run)
    if n_bad:
        lines.append(el("p", mark(UNRELIABLE_MARKER), " ", el("a", f"{n_bad} score(s) not to be trusted",
                                                               href="#untrusted"),
                        ": no verdict is drawn from them.", class_="verdict bad"))
    if not run.failures and not lost and run.records:
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
            bad = a.untrusted.get(cell, {})
            best_score: list[Any] = [pct(last.best_score)] + ([" ", mark(UNRELIABLE_MARKER)]
                                                               if last.best_step in bad else [])
            newest: list[Any] = [f"{pct(last.score)} (step {last.step})"] + ([" ", mark(UNRELIABLE_MARKER)]
                                                                              if last.step in bad else [])
            rows.append([a.name, row_head("/".join(cell)),
                         el("td", _named(a.encoder_at(last.best_step), last.best_step), class_="pair"),
                         el("td", best_score, class_="untrusted" if last.best_step in bad else None),
                         el("td", newest, class_="untrusted" if last.step in bad else None)])
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
    improvements = summary.get("improvements") or [r for s in run.series for r in s.improvements()]
    body: list[Any] = [el("div", _verdict_lines(run, regressions, improvements), id="verdict")]
    moved = _change_rows(regressions, better=False) + _change_rows(improvements, better=True)
    if moved:
        level = next((r["confidence"] for r in [*regressions, *improvements] if is_number(r.get("confidence"))),
                     0.95)
        body += [el("h3", "Regressed or improved"),
                 table(["", "series", "cell", "newest, against", "effect (points)",
                        f"{100 * level:g} % interval (points)", "test", "adjusted p"], moved,
                       class_="warnings changes"),
                 note("Effect: newest minus the best earlier checkpoint; an improvement is tested as a regression "
                      "is, and a newest checkpoint that leads without a significant difference is not shown here. "
                      "The interval is the deciding test's own where it has one (exact McNemar: Clopper-Pearson "
                      "on the discordant images), else the paired bootstrap's; adjusted p: Benjamini-Hochberg "
                      "over the series' cells.")]
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
