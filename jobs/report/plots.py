"""The report's figures: matplotlib's Agg canvas on private ``Figure`` objects (no pyplot
global state), embedded as base64 PNG data URIs so the file stands alone."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from jobs.report.html import Markup, el

ALL = "all"  # the low-shot point with every train image


def png(fig: Figure) -> Markup:
    """A matplotlib figure as an inline ``<img>`` (a PNG data URL)."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return el("img", src=f"data:image/png;base64,{data}", alt="plot", class_="plot")


def shot_key(shot: str) -> tuple[int, float]:
    """Sort key of a low-shot point: by images per class, ``all`` last."""
    return (1, 0.0) if shot == ALL else (0, float(shot))


def shot_positions(shots: Sequence[str]) -> dict[str, float]:
    """log2(N) per shot; "all" one step right of the largest N."""
    nums = [math.log2(float(s)) for s in shots if s != ALL]
    pos = {s: math.log2(float(s)) for s in shots if s != ALL}
    if ALL in shots:
        pos[ALL] = (max(nums) + 1.0) if nums else 0.0
    return pos


def lowshot_plot(curves: Mapping[str, Mapping[str, float]], relative: Mapping[str, Mapping[str, float]],
                 order: Sequence[str], baseline: str | None, title: str) -> Markup:
    """Absolute curves (left) and, when a baseline is given, curves minus the baseline (right)."""
    shots = sorted({s for c in curves.values() for s in c}, key=shot_key)
    pos = shot_positions(shots)
    fig = Figure(figsize=(11, 4))
    ax_abs, ax_rel = fig.subplots(1, 2)
    for model in order:
        c = curves[model]
        xs = [s for s in shots if s in c]
        ax_abs.plot([pos[s] for s in xs], [100 * c[s] for s in xs], marker="o", label=model)
        if model in relative:
            rel = relative[model]
            xr = [s for s in shots if s in rel]
            ax_rel.plot([pos[s] for s in xr], [100 * rel[s] for s in xr], marker="o", label=model)
    for ax in (ax_abs, ax_rel):
        ax.set_xticks([pos[s] for s in shots], shots)
        ax.set_xlabel("train images per class (log2 scale)")
        ax.grid(alpha=0.3)
    ax_abs.set_ylabel("test accuracy (%)")
    ax_abs.set_title(title)
    if baseline is not None:
        ax_rel.axhline(0.0, color="black", linewidth=0.8)
        ax_rel.set_ylabel(f"accuracy minus {baseline} (points)")
        ax_rel.set_title(f"relative to {baseline}")
    else:
        ax_rel.set_axis_off()
    ax_abs.legend(fontsize="small")
    return png(fig)


def scatter(models: Sequence[str], x: Sequence[float], y: Sequence[float], r: float, rho: float, xlabel: str,
            ylabel: str) -> Markup:
    """One point per encoder with its name, and the least-squares line."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    fig = Figure(figsize=(5.5, 4.5))
    ax = fig.subplots()
    ax.scatter(x, y, zorder=3)
    for m, xi, yi in zip(models, x, y):
        ax.annotate(m, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize="small")
    slope, intercept = np.polyfit(x, y, 1)
    xs = np.linspace(x.min(), x.max(), 50)
    ax.plot(xs, intercept + slope * xs, color="tab:red", linewidth=1)
    ax.text(0.03, 0.97, f"r = {r:.2f}, \u03c1 = {rho:.2f}, n = {len(models)}", transform=ax.transAxes,
            va="top", ha="left", bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"})
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return png(fig)
