"""The ImageNet-CoG section (Sariyildiz et al. 2021, figures 3 and 4): accuracy on the
concept-generalisation levels, L1 the closest to the seen concepts, for every encoder, and
the same minus the baseline encoder's. Shown when the run has level datasets, named
``cog-l<k>`` as ``repeval cog-levels`` writes them; absent otherwise."""

from __future__ import annotations

import re
from typing import Any

from matplotlib.figure import Figure

from jobs.report.html import Markup, el, note, pct, row_head, section, table
from jobs.report.model import ReportRun
from jobs.report.plots import png

LEVEL_NAME = re.compile(r"^cog-l([1-9][0-9]*)$")


def level_of(dataset: str) -> int | None:
    """The level k of a dataset named ``cog-l<k>``, else None."""
    match = LEVEL_NAME.match(dataset)
    return int(match.group(1)) if match else None


def level_scores(run: ReportRun, setting: str) -> dict[str, dict[int, float]]:
    """model -> level -> score of ``setting`` (the model's best layer where it has several)."""
    out: dict[str, dict[int, float]] = {}
    for r in run.records:
        level, score = level_of(str(r.get("dataset"))), (r.get("metrics") or {}).get("score")
        if r.get("setting") != setting or level is None or not isinstance(score, (int, float)):
            continue
        by_level = out.setdefault(str(r.get("model")), {})
        by_level[level] = max(score, by_level.get(level, float("-inf")))
    return out


def _plot(setting: str, scores: dict[str, dict[int, float]], models: list[str], baseline: str | None) -> Markup:
    levels = sorted({k for s in scores.values() for k in s})
    fig = Figure(figsize=(11, 4))
    ax_abs, ax_rel = fig.subplots(1, 2)
    base = scores.get(baseline or "")
    for model in models:
        ks = [k for k in levels if k in scores[model]]
        ax_abs.plot(ks, [100 * scores[model][k] for k in ks], marker="o", label=model)
        if base:
            kr = [k for k in ks if k in base]
            ax_rel.plot(kr, [100 * (scores[model][k] - base[k]) for k in kr], marker="o", label=model)
    for ax in (ax_abs, ax_rel):
        ax.set_xticks(levels, [f"L{k}" for k in levels])
        ax.set_xlabel("concept-generalisation level (L1: closest to the seen concepts)")
        ax.grid(alpha=0.3)
    ax_abs.set_ylabel("test accuracy (%)")
    ax_abs.set_title(setting)
    ax_abs.legend(fontsize="small")
    if base:
        ax_rel.axhline(0.0, color="black", linewidth=0.8)
        ax_rel.set_ylabel(f"accuracy minus {baseline} (points)")
        ax_rel.set_title(f"relative to {baseline}")
    else:
        ax_rel.set_axis_off()
    return png(fig)


def cog_section(run: ReportRun) -> Markup:
    """Per protocol setting scored on two levels or more: the plot and the table."""
    body: list[Any] = []
    for setting in run.settings:
        scores = level_scores(run, setting)
        levels = sorted({k for s in scores.values() for k in s})
        if len(levels) < 2:
            continue
        models = [m for m in run.models if m in scores]
        body += [el("h3", f"{setting} ({run.protocol_of.get(setting, '?')})"),
                 _plot(setting, scores, models, run.baseline),
                 table(["encoder"] + [f"L{k} (%)" for k in levels],
                       [[row_head(m)] + [pct(scores[m].get(k)) for k in levels] for m in models], class_="scores")]
        if run.baseline and run.baseline not in scores:
            body.append(note(f"The baseline {run.baseline} has no {setting} scores on the levels."))
    if not body:
        return Markup("")
    intro = note("ImageNet-CoG (Sariyildiz et al. 2021): accuracy on each concept-generalisation level, "
                 "absolute and minus the baseline encoder's (figures 3 and 4); each encoder's best layer.")
    return section("cog", "Concept generalisation (ImageNet-CoG levels)", intro, body)
