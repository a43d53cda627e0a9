"""The rank-agreement section (Ericsson et al. 2021, fig. 7): per dataset, Kendall's tau
between every pair of protocol settings as a matrix, the pairs' statistics with bootstrap
intervals and order flips, and a radar chart of each encoder's rank per setting, the
reference (e.g. ImageNet top-1) as the first axis when it scores those encoders."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from jobs.analysis.ranks import RankAgreement, rank_agreement_of
from jobs.report.html import Markup, el, note, num, row_head, section, table
from jobs.report.model import ReportRun
from jobs.report.plots import png

_MAX_RADAR_MODELS = 12  # polygons on one chart before it becomes unreadable


def _ci(ci: Any) -> str:
    return f"[{num(ci[0], 2)}, {num(ci[1], 2)}]" if ci else "\u2013"


def tau_matrix(agreement: RankAgreement) -> np.ndarray:
    """Kendall's tau between the dataset's settings (1 on the diagonal, NaN where not compared)."""
    index = {s: i for i, s in enumerate(agreement.settings)}
    m = np.full((len(index), len(index)), np.nan)
    np.fill_diagonal(m, 1.0)
    for p in agreement.pairs:
        i, j = index[p["setting_a"]], index[p["setting_b"]]
        m[i, j] = m[j, i] = p["kendall_tau"]
    return m


def _heatmap(agreement: RankAgreement) -> Markup:
    m = tau_matrix(agreement)
    n = len(agreement.settings)
    fig = Figure(figsize=(1.2 + 0.7 * n, 0.9 + 0.6 * n))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(m), vmin=-1, vmax=1, cmap="RdBu")
    for i in range(n):
        for j in range(n):
            ax.text(j, i, "\u2013" if math.isnan(m[i, j]) else f"{m[i, j]:.2f}", ha="center", va="center",
                    fontsize="small")
    ax.set_xticks(range(n), agreement.settings, rotation=45, ha="right")
    ax.set_yticks(range(n), agreement.settings)
    ax.set_title(f"{agreement.dataset}: Kendall's \u03c4 between settings")
    fig.colorbar(image, ax=ax, shrink=0.8)
    return png(fig)


def radar_axes(agreement: RankAgreement, reference: Mapping[str, float] | None) -> tuple[list[str], dict, list[str]]:
    """(models, {axis: {model: rank}}, settings left off): the models ranked by the most
    settings, every setting that ranks them all, and the reference when it scores them all
    (a model that a single setting ranks does not take the others off the chart)."""
    # deferred: scipy, only when the report ranks encoders
    from pipeline.analysis.rank_agreement import encoder_ranks

    counts: dict[str, int] = {}
    for ranks in agreement.ranks.values():
        for m in ranks:
            counts[m] = counts.get(m, 0) + 1
    models = [m for m, c in counts.items() if c == max(counts.values())]
    axes: dict[str, dict[str, float]] = {}
    if reference and all(m in reference for m in models):
        axes["reference"] = encoder_ranks({m: reference[m] for m in models})
    left_off = []
    for setting, ranks in agreement.ranks.items():
        if all(m in ranks for m in models):
            axes[setting] = encoder_ranks({m: ranks[m] for m in models}, lower_is_better=True)
        else:
            left_off.append(setting)
    return models, axes, left_off


def _radar(dataset: str, models: Sequence[str], axes: Mapping[str, Mapping[str, float]]) -> Markup:
    names = list(axes)
    angles = np.linspace(0, 2 * np.pi, len(names), endpoint=False)
    fig = Figure(figsize=(6, 6))
    ax = fig.add_subplot(projection="polar")
    closed = np.append(angles, angles[0])
    for model in models[:_MAX_RADAR_MODELS]:
        ranks = [axes[a][model] for a in names]
        ax.plot(closed, ranks + ranks[:1], marker="o", label=model)
    ax.set_xticks(angles, names)
    ax.set_ylim(len(models) + 0.5, 0.5)  # rank 1 (the best) at the rim
    ax.set_title(f"{dataset}: rank of each encoder (1 = best, at the rim)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.05, 1.0))
    return png(fig)


def _pairs_table(agreement: RankAgreement) -> Markup:
    rows = [[row_head(f"{p['setting_a']} vs {p['setting_b']}"), p["n"], num(p["kendall_tau"]),
             _ci(p["kendall_ci"]), num(p["spearman_rho"]), _ci(p["spearman_ci"]),
             f"{p['flips']} of {p['n_pairs']}"] for p in agreement.pairs]
    return table(["settings", "encoders", "Kendall \u03c4", "bootstrap CI", "Spearman \u03c1", "bootstrap CI",
                  "pairs flipped"], rows, class_="ranks")


def _dataset(agreement: RankAgreement, reference: Mapping[str, float] | None) -> list[Any]:
    body: list[Any] = [el("h3", agreement.dataset)]
    if agreement.pairs:
        body += [_heatmap(agreement), _pairs_table(agreement)]
    else:
        body.append(note("No pair of settings could be compared on this dataset."))
    if agreement.skipped:
        body += [el("p", "Not compared:"),
                 el("ul", [el("li", el("strong", f"{a} vs {b}"), f": {why}") for a, b, why in agreement.skipped])]
    models, axes, left_off = radar_axes(agreement, reference)
    if len(axes) >= 3 and len(models) >= 2:
        body.append(_radar(agreement.dataset, models, axes))
        if len(models) > _MAX_RADAR_MODELS:
            body.append(note(f"The radar chart shows the first {_MAX_RADAR_MODELS} of {len(models)} encoders."))
        if left_off:
            body.append(note(f"Not on the radar chart (they rank fewer encoders): {', '.join(left_off)}."))
    return body


def ranks_section(run: ReportRun, reference: Mapping[str, float] | None, n_bootstrap: int = 1000,
                  seed: int = 0) -> Markup:
    """The section: every dataset's rank agreement between the run's protocol settings."""
    intro = note("Do the protocol settings order the encoders alike? Per dataset, the encoders are ranked by "
                 "their score under each setting (their best layer for it); every pair of settings is compared "
                 f"by Kendall's \u03c4 and Spearman's \u03c1 with {n_bootstrap} bootstrap resamples over encoders, "
                 "and by the number of encoder pairs whose order flips (Ericsson et al. 2021, fig. 7). "
                 "`repeval results --ranks` prints the ranks.")
    agreements = rank_agreement_of(run.records, n_bootstrap, seed)
    if not agreements:
        return section("ranks", "Rank agreement", intro, note("No scored records to rank."), empty=True)
    body: list[Any] = [intro]
    for agreement in agreements:
        body += _dataset(agreement, reference)
    # one setting per dataset: nothing to compare, nothing to list in the contents
    return section("ranks", "Rank agreement", body, empty=not any(a.pairs or a.skipped for a in agreements))
