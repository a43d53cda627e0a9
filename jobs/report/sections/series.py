"""The checkpoint series section: score against training step for each protocol setting (one
line per dataset, the reference score too), the best checkpoint so far marked, and a flag
on the newest checkpoint where it is significantly worse than the series' best."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from jobs.report.html import Markup, el, note, notice, pct, row_head, section, table
from jobs.report.model import ReportRun
from jobs.report.plots import png
from jobs.report.sections.scores import BEST_MARKER
from jobs.report.marks import REGRESSION_MARKER, UNRELIABLE_MARKER, mark


def series_figure(analysis: Any, setting: str, layer: str, datasets: Sequence[str], reference: Mapping[str, float],
                  regressed: set) -> Figure:
    """Score against training step of one setting and layer: a line per dataset, the best so
    far starred, a regressed newest checkpoint ringed, an untrusted score crossed; whole steps on the axis."""
    fig = Figure(figsize=(7, 3.6))
    ax = fig.subplots()
    for d in datasets:
        cell = (setting, d, layer)
        running = analysis.running.get(cell) or []
        if not running:
            continue
        steps = [b.step for b in running]
        line, = ax.plot(steps, [100 * b.score for b in running], marker="o", label=d)
        best = running[-1]
        ax.scatter([best.best_step], [100 * best.best_score], marker="*", s=180, color=line.get_color(),
                   edgecolors="black", zorder=4)
        bad = sorted(analysis.untrusted.get(cell, {}))
        if bad:  # a score not to be trusted: crossed
            by_step = {b.step: b.score for b in running}
            ax.scatter(bad, [100 * by_step[s] for s in bad], marker="x", s=90, color="#b00000", zorder=6)
        if cell in regressed:
            ax.scatter([best.step], [100 * best.score], marker="o", s=160, facecolors="none", edgecolors="red",
                       linewidths=2, zorder=5)
    ref = [(p.step, reference[p.encoder]) for p in analysis.points if p.encoder in reference]
    if ref:
        ax.plot([s for s, _ in ref], [100 * v for _, v in ref], linestyle="--", color="black", marker=".",
                label="reference")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a step is a whole number: no tick at 1.5
    ax.set_xlabel("training step")
    ax.set_ylabel("score (%)")
    ax.set_title(f"{analysis.name}: {setting}, layer {layer}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _table(analysis: Any, setting: str, layer: str, datasets: Sequence[str], reference: Mapping[str, float],
           regressed: set) -> Markup:
    newest = analysis.newest
    # a checkpoint's name on one line (table.series' headers): a table of long names scrolls in its box
    header = ["dataset"] + [f"{p.encoder} (step {p.step})" for p in analysis.points]
    rows = []
    for d in datasets:
        cell = (setting, d, layer)
        scores = analysis.scores.get(cell, {})
        running = analysis.running.get(cell) or []
        best_step = running[-1].best_step if running else None
        row: list[Any] = [row_head(d)]
        for p in analysis.points:
            if p.step not in scores:
                row.append("\u2013")
                continue
            text = pct(scores[p.step])
            why = analysis.untrusted.get(cell, {}).get(p.step)
            if why is not None:  # an untrusted score: marked, whatever else it is
                row.append(el("td", text, " ", mark(UNRELIABLE_MARKER), class_="untrusted", data_step=p.step,
                              data_dataset=d, title=f"not to be trusted: {why}"))
            elif p.step == best_step:
                row.append(el("td", el("strong", text), " ", el("span", BEST_MARKER, class_="best-marker"),
                              class_="best", title="best so far", data_step=p.step, data_dataset=d))
            elif p == newest and cell in regressed:
                row.append(el("td", text, f" {REGRESSION_MARKER}", class_="violation", data_step=p.step,
                              data_dataset=d, title="significantly worse than the best so far"))
            else:
                row.append(el("td", text, data_step=p.step, data_dataset=d))
        rows.append(row)
    if any(p.encoder in reference for p in analysis.points):
        rows.append([row_head("reference")] + [pct(reference[p.encoder]) if p.encoder in reference else "\u2013"
                                               for p in analysis.points])
    return el("div", table(header, rows, class_="scores series"), class_="wide")


def _verdict_lines(analysis: Any) -> list[Markup]:
    newest = analysis.newest
    out: list[Markup] = []
    if analysis.flagged:
        out.append(notice(f"{REGRESSION_MARKER} the newest checkpoint {newest.encoder} (step {newest.step}) is "
                          f"significantly worse than the best so far on {len(analysis.check.regressed)} cell(s)"))
        rows = [[r["cell"], f"{r['against']} (step {r['best_step']})", pct(r["difference"], 2),
                 f"{r['p_adjusted']:.3g}"] for r in analysis.regressions()]
        out.append(table(["cell", "best so far", "difference (points)", "adjusted p"], rows, class_="warnings"))
    elif analysis.check is not None:
        check = analysis.check
        untrusted = {u["cell"] for u in analysis.unreliable}
        judged = sum(1 for c, v in analysis.verdicts.items() if c in check.to_compare and v.verdict != "unreliable")
        leads = sum(1 for c in check.newest_is_best if "/".join(c) not in untrusted)
        better = len(analysis.improvements())
        out.append(note(f"Newest checkpoint {newest.encoder} (step {newest.step}): best so far on "
                        f"{leads} cell(s), significantly better than the earlier best on {better} of them; on "
                        f"{judged} other cell(s) not significantly worse than the best (paired test, false "
                        "discovery rate controlled over the series' cells)."))
    if analysis.unreliable:
        out.append(notice(f"{UNRELIABLE_MARKER} no verdict on {len(analysis.unreliable)} cell(s): a score there is "
                          "not to be trusted (see 'Not to be trusted' in the summary)"))
        out.append(el("ul", [el("li", f"{u['cell']}: unreliable: {u['reason']}") for u in analysis.unreliable]))
    for n in analysis.not_compared:
        out.append(note(f"not compared: {n['cell']}: {n['reason']}"))
    for u in analysis.unplaced:
        out.append(note(f"{u['encoder']} is left out of the series: {u['reason']}"))
    if analysis.check is not None and analysis.check.missing:
        out.append(note(f"The newest checkpoint has no score on {len(analysis.check.missing)} cell(s) "
                        "(failed or not evaluated yet)."))
    return out


def series_section(run: ReportRun) -> Markup:
    """One block per checkpoint series: verdict of the newest checkpoint, plots and tables."""
    body: list[Any] = [note(
        f"Checkpoints found by a checkpoints scan form a series (the folder, or the scan's series name), ordered "
        f"by training step. Per protocol setting and layer: score against step, one line per dataset and the "
        f"reference score (dashed); {BEST_MARKER} marks the best checkpoint so far, a red ring (tables: "
        f"{REGRESSION_MARKER}) the newest checkpoint where a paired test says it is significantly worse than "
        f"that best, and a cross (tables: {UNRELIABLE_MARKER}) a score not to be trusted.")]
    if not run.series:
        body.append(note("No checkpoint series in this config."))
        return section("series", "Checkpoint series", body, empty=True)
    reference = run.reference or {}
    for analysis in run.series:
        body.append(el("h3", f"Series {analysis.name}: {len(analysis.points)} checkpoint(s)"))
        if analysis.problem:
            body.append(notice(f"The series cannot be ordered: {analysis.problem}"))
            continue
        if not analysis.points or not analysis.scores:
            body.append(note("No scored checkpoint in this series yet."))
            body += [note(f"{u['encoder']} is left out of the series: {u['reason']}") for u in analysis.unplaced]
            continue
        body += _verdict_lines(analysis)
        regressed = set(analysis.check.regressed) if analysis.check else set()
        groups = sorted({(c[0], c[2]) for c in analysis.scores},
                        key=lambda g: (run.settings.index(g[0]) if g[0] in run.settings else len(run.settings), g))
        for setting, layer in groups:
            datasets = [d for d in run.datasets if (setting, d, layer) in analysis.scores]
            datasets += sorted({c[1] for c in analysis.scores if c[0] == setting and c[2] == layer} - set(datasets))
            body += [el("h4", run.heading(setting, layer)),
                     png(series_figure(analysis, setting, layer, datasets, reference, regressed)),
                     _table(analysis, setting, layer, datasets, reference, regressed)]
    return section("series", "Checkpoint series", body)
