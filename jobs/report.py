"""The benchmark report: one static HTML file with its plots embedded.

Sections: accuracy tables per protocol setting and layer (best per column marked), low-shot
curves (absolute and relative to a baseline encoder, ImageNet-CoG style), correlation
scatters against the reference (Ericsson et al. 2021, figure 1), the invariance audit,
calibration, solver warnings and, one click from every number, each record's provenance.

Every piece of text passes through :func:`_el`, which escapes it: names come from configs
and checkpoint folders and are never trusted as HTML. Plots are drawn with matplotlib's
Agg canvas on private ``Figure`` objects (no pyplot global state) and embedded as base64
PNG data URIs, so the file stands alone.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from jobs.correlate import CorrelationReport, SettingReport, current_records
from storage_schema.provenance import now_iso, stable_hash

if TYPE_CHECKING:  # jobs.config pulls in the encoders (torch, timm): only for type checkers
    from jobs.config import BenchmarkConfig

__all__ = ["write_report"]

BEST_MARKER = "\u2605"  # the star after the best score of a column
VIOLATION_MARKER = "\u26a0"
ALL = "all"


# -- HTML building: everything that is not Markup is escaped ---------------------------------
_VOID = frozenset({"img", "meta", "br", "hr"})


class Markup(str):
    """A string that is already HTML (built by _el); never escaped again."""


def _esc(value: Any) -> Markup:
    return value if isinstance(value, Markup) else Markup(html.escape(str(value), quote=True))


def _join(parts: Iterable[Any], sep: str = "") -> Markup:
    return Markup(sep.join(_esc(p) for p in parts if p is not None))


def _el(tag: str, *children: Any, **attrs: Any) -> Markup:
    """``<tag attrs>children</tag>``; ``class_`` gives ``class``, ``data_x`` gives ``data-x``."""
    flat: list[Any] = []
    for child in children:
        if isinstance(child, (list, tuple)):
            flat.extend(child)
        else:
            flat.append(child)
    attr = "".join(f' {k.rstrip("_").replace("_", "-")}="{_esc(v)}"' for k, v in attrs.items()
                   if v is not None and v is not False)
    if tag in _VOID:
        return Markup(f"<{tag}{attr}>")
    return Markup(f"<{tag}{attr}>{_join(flat)}</{tag}>")


def _table(header: Sequence[Any], rows: Iterable[Sequence[Any]], class_: str | None = None) -> Markup:
    """Rows whose cells are text, Markup or ready ``<td>``/``<th>`` elements."""
    def cell(c: Any) -> Markup:
        return c if isinstance(c, Markup) and c.startswith(("<td", "<th")) else _el("td", c)

    head = _el("thead", _el("tr", [_el("th", h) for h in header]))
    body = _el("tbody", [_el("tr", [cell(c) for c in row]) for row in rows])
    return _el("table", head, body, class_=class_)


def _section(sid: str, title: str, *body: Any) -> Markup:
    return _el("section", _el("h2", title), *body, id=sid)


def _note(text: Any) -> Markup:
    return _el("p", text, class_="note")


# -- numbers, labels, anchors ----------------------------------------------------------------
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pct(value: Any, digits: int = 1) -> str:
    return f"{100.0 * value:.{digits}f}" if _is_number(value) else "n/a"


def _num(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if _is_number(value) else "n/a"


def _label(rec: Mapping[str, Any]) -> str:
    return f"{rec.get('model')}/{rec.get('dataset')}/{rec.get('layer')}:{rec.get('setting')}"


def _anchor(rec: Mapping[str, Any]) -> str:
    cid = str(rec.get("cell_id") or stable_hash(_label(rec), length=16))
    return "cell-" + re.sub(r"[^A-Za-z0-9_-]", "_", cid)


def _link(rec: Mapping[str, Any], text: Any) -> Markup:
    return _el("a", text, href=f"#{_anchor(rec)}", title=f"provenance of {_label(rec)}")


def _order(preferred: Iterable[str], present: Iterable[str]) -> list[str]:
    """``preferred`` (config order) first where present, then the rest sorted."""
    present = set(present)
    head = [p for p in dict.fromkeys(preferred) if p in present]
    return head + sorted(present - set(head))


def _png(fig: Figure) -> Markup:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return _el("img", src=f"data:image/png;base64,{data}", alt="plot", class_="plot")


# -- what the report is built from -----------------------------------------------------------
@dataclass
class _Run:
    records: list[dict]  # one per (setting, layer, model, dataset): the ones shown
    aside: list[dict]  # superseded or stale records, still listed under provenance
    models: list[str]
    datasets: list[str]
    settings: list[str]
    layers: list[str]
    protocol_of: dict[str, str]
    baseline: str | None  # configured low-shot baseline

    def group(self, predicate) -> list[tuple[str, str, list[dict]]]:
        """(setting, layer, records) in config order, for the records matching ``predicate``."""
        out = []
        for setting in self.settings:
            for layer in self.layers:
                recs = [r for r in self.records if r.get("setting") == setting and r.get("layer") == layer
                        and predicate(r)]
                if recs:
                    out.append((setting, layer, recs))
        return out


def _run(records: list[dict], config: BenchmarkConfig) -> _Run:
    chosen, aside = current_records(records, config)
    models = _order([e.name for e in config.encoders], (str(r.get("model")) for r in chosen))
    datasets = _order([d.name for d in config.datasets], (str(r.get("dataset")) for r in chosen))
    settings = _order([p.name for p in config.protocols], (str(r.get("setting")) for r in chosen))
    layer_pref = ["pre_logits"] + [layer for p in config.protocols for layer in p.layers]
    layers = _order(layer_pref, (str(r.get("layer")) for r in chosen))
    protocol_of = {p.name: p.protocol for p in config.protocols}
    for r in chosen:
        protocol_of.setdefault(str(r.get("setting")), str(r.get("protocol")))
    return _Run(chosen, aside, models, datasets, settings, layers, protocol_of, config.report.baseline)


def _heading(run: _Run, setting: str, layer: str) -> str:
    return f"{setting} ({run.protocol_of.get(setting, '?')}), layer {layer}"


# -- sections --------------------------------------------------------------------------------
def _overview(run: _Run, config: BenchmarkConfig) -> Markup:
    contents = [("accuracy", "Accuracy"), ("lowshot", "Low-shot curves"), ("correlation", "Correlation"),
                ("invariance", "Invariance audit"), ("calibration", "Calibration"),
                ("warnings", "Solver warnings"), ("provenance", "Provenance")]
    facts = [
        ("generated", now_iso()),
        ("records shown", len(run.records)),
        ("records set aside (older or of changed settings)", len(run.aside)),
        ("encoders", ", ".join(run.models) or "(none)"),
        ("datasets", ", ".join(run.datasets) or "(none)"),
        ("protocol settings", ", ".join(f"{s} ({run.protocol_of.get(s)})" for s in run.settings) or "(none)"),
        ("store", config.store),
    ]
    return _section(
        "overview", "Overview",
        _table(["", ""], facts, class_="facts"),
        _el("nav", _el("ul", [_el("li", _el("a", title, href=f"#{sid}")) for sid, title in contents])),
    )


def _has_score(rec: Mapping[str, Any]) -> bool:
    return "score" in (rec.get("metrics") or {})


def _score_text(rec: Mapping[str, Any]) -> str:
    m = rec.get("metrics") or {}
    if _is_number(m.get("ci95")):  # few-shot: mean accuracy over episodes with its 95 % CI
        return f"{_pct(m.get('mean', m.get('score')))} \u00b1 {_pct(m['ci95'])}"
    return _pct(m.get("score"))


def _accuracy_table(run: _Run, recs: list[dict], table_id: str) -> Markup:
    cells = {(r["model"], r["dataset"]): r for r in recs}
    datasets = [d for d in run.datasets if any(k[1] == d for k in cells)]
    models = [m for m in run.models if any(k[0] == m for k in cells)]
    best = {}
    for d in datasets:
        vals = [r["metrics"]["score"] for (m, dd), r in cells.items() if dd == d and _is_number(r["metrics"]["score"])]
        best[d] = max(vals) if vals else None
    rows = []
    for m in models:
        row: list[Any] = [_el("th", m, scope="row")]
        for d in datasets:
            rec = cells.get((m, d))
            if rec is None:
                row.append(_el("td", "\u2013", class_="missing", title="not evaluated"))
                continue
            is_best = best[d] is not None and rec["metrics"]["score"] == best[d]
            text = _link(rec, _score_text(rec))
            content = [_el("strong", text), " ", _el("span", BEST_MARKER, class_="best-marker")] if is_best else [text]
            row.append(_el("td", content, class_="best" if is_best else None, data_model=m, data_dataset=d,
                           data_table=table_id, title="best in column" if is_best else None))
        rows.append(row)
    return _table(["encoder"] + datasets, rows, class_="scores")


def _accuracy_section(run: _Run) -> Markup:
    groups = run.group(_has_score)
    body: list[Any] = [_note(
        f"Test accuracy in %: the dataset's headline score (top-1, or mean per-class accuracy where the "
        f"dataset declares it); few-shot cells are the mean over episodes \u00b1 the 95 % confidence "
        f"interval; low-shot cells are the accuracy with every train image ('all'), else with the "
        f"largest N. Bold with {BEST_MARKER}: best in its column. Each number links to its provenance.")]
    if not groups:
        body.append(_note("No scored records."))
    for setting, layer, recs in groups:
        table_id = f"{setting}@{layer}"
        body += [_el("h3", _heading(run, setting, layer), id=f"acc-{stable_hash(table_id, 12)}"),
                 _accuracy_table(run, recs, table_id)]
    return _section("accuracy", "Accuracy", body)


def _shot_key(shot: str) -> tuple[int, float]:
    return (1, 0.0) if shot == ALL else (0, float(shot))


def _shot_positions(shots: Sequence[str]) -> dict[str, float]:
    """log2(N) per shot; "all" one step right of the largest N."""
    nums = [math.log2(float(s)) for s in shots if s != ALL]
    pos = {s: math.log2(float(s)) for s in shots if s != ALL}
    if ALL in shots:
        pos[ALL] = (max(nums) + 1.0) if nums else 0.0
    return pos


def _is_shot(key: str) -> bool:
    return key == ALL or (key.isdigit() and int(key) >= 1)


def _curves(recs: list[dict]) -> dict[str, dict[str, float]]:
    return {r["model"]: {str(k): v for k, v in (r["metrics"].get("curve") or {}).items()
                         if _is_shot(str(k)) and _is_number(v)} for r in recs}


def _lowshot_plot(curves: dict[str, dict[str, float]], order: list[str], baseline: str | None,
                  title: str) -> Markup:
    shots = sorted({s for c in curves.values() for s in c}, key=_shot_key)
    pos = _shot_positions(shots)
    fig = Figure(figsize=(11, 4))
    ax_abs, ax_rel = fig.subplots(1, 2)
    for model in order:
        c = curves[model]
        xs = [s for s in shots if s in c]
        ax_abs.plot([pos[s] for s in xs], [100 * c[s] for s in xs], marker="o", label=model)
        if baseline is not None:
            common = [s for s in xs if s in curves[baseline]]
            ax_rel.plot([pos[s] for s in common], [100 * (c[s] - curves[baseline][s]) for s in common],
                        marker="o", label=model)
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
    return _png(fig)


def _lowshot_table(recs: list[dict], order: list[str]) -> Markup:
    by_model = {r["model"]: r for r in recs}
    shots = sorted({str(s) for r in recs for s in (r["metrics"].get("curve") or {}) if _is_shot(str(s))},
                   key=_shot_key)
    rows = []
    for m in order:
        rec = by_model[m]
        mean, std = rec["metrics"].get("curve") or {}, rec["metrics"].get("curve_std") or {}
        row: list[Any] = [_el("th", m, scope="row")]
        for s in shots:
            text = f"{_pct(mean[s])} \u00b1 {_pct(std.get(s))}" if s in mean else "\u2013"
            row.append(_link(rec, text) if s in mean else text)
        rows.append(row)
    return _table(["encoder"] + [f"N = {s}" for s in shots], rows, class_="scores")


def _pick_baseline(run: _Run, available: list[str]) -> tuple[str | None, str | None]:
    """(baseline, note): the configured baseline, else the first encoder with a curve."""
    if run.baseline is not None:
        if run.baseline in available:
            return run.baseline, None
        return None, (f"The configured baseline {run.baseline!r} has no low-shot curve here; relative "
                      f"curves are left out (encoders with one: {', '.join(available)}).")
    return (available[0], None) if available else (None, None)


def _lowshot_section(run: _Run) -> Markup:
    groups = run.group(lambda r: isinstance((r.get("metrics") or {}).get("curve"), Mapping))
    body: list[Any] = [_note("Mean test accuracy over the repeated train samples (\u00b1 std in the "
                             "tables) against train images per class; right: minus the baseline "
                             "encoder's accuracy, in percentage points (ImageNet-CoG).")]
    if not groups:
        body.append(_note("No low-shot records."))
    for setting, layer, recs in groups:
        body.append(_el("h3", _heading(run, setting, layer)))
        for d in [d for d in run.datasets if any(r["dataset"] == d for r in recs)]:
            drecs = [r for r in recs if r["dataset"] == d]
            curves = _curves(drecs)
            order = [m for m in run.models if m in curves]
            baseline, note = _pick_baseline(run, order)
            body += [_el("h4", d), _lowshot_plot(curves, order, baseline, f"{d}: {setting}, {layer}")]
            if note:
                body.append(_note(note))
            body.append(_lowshot_table(drecs, order))
    return _section("lowshot", "Low-shot curves", body)


def _scatter(s: SettingReport, reference_name: str) -> Markup:
    x = np.array([s.reference_logit[m] for m in s.models])
    y = np.array([s.setting_scores[m] for m in s.models])
    fig = Figure(figsize=(5.5, 4.5))
    ax = fig.subplots()
    ax.scatter(x, y, zorder=3)
    for m, xi, yi in zip(s.models, x, y):
        ax.annotate(m, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize="small")
    slope, intercept = np.polyfit(x, y, 1)
    xs = np.linspace(x.min(), x.max(), 50)
    ax.plot(xs, intercept + slope * xs, color="tab:red", linewidth=1)
    r, rho = s.setting["pearson"], s.setting["spearman"]
    ax.text(0.03, 0.97, f"r = {r:.2f}, \u03c1 = {rho:.2f}, n = {s.n}", transform=ax.transAxes,
            va="top", ha="left", bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"})
    ax.set_xlabel(f"{reference_name}: logit(score)")
    ax.set_ylabel(f"{s.name}: mean logit({s.metric}) over {len(s.datasets)} dataset(s)")
    ax.grid(alpha=0.3)
    return _png(fig)


def _ci(ci: Any) -> str:
    return f"[{_num(ci[0], 2)}, {_num(ci[1], 2)}]" if ci else "\u2013"


def _correlation_table(s: SettingReport) -> Markup:
    rows = [[_el("th", "setting (mean logit)", scope="row"), _num(s.setting["pearson"]), _ci(s.setting["pearson_ci"]),
             _num(s.setting["spearman"]), _ci(s.setting["spearman_ci"]), s.setting["n"]]]
    for d, c in s.per_dataset.items():
        rows.append([_el("th", d, scope="row"), _num(c["pearson"]), _ci(c["pearson_ci"]), _num(c["spearman"]),
                     _ci(c["spearman_ci"]), c["n"]])
    return _table(["", "Pearson r", "bootstrap CI", "Spearman \u03c1", "bootstrap CI", "n"], rows,
                  class_="correlation")


def _correlation_scores(s: SettingReport, reference: Mapping[str, float], records: dict[str, dict]) -> Markup:
    rows = []
    for m in s.models:
        row: list[Any] = [_el("th", m, scope="row"), _pct(reference.get(m)), _num(s.reference_logit.get(m)),
                          _num(s.setting_scores.get(m))]
        for d in s.datasets:
            rec = records.get(s.cells.get(m, {}).get(d, ""))
            text = _pct(s.scores.get(m, {}).get(d))
            row.append(_link(rec, text) if rec else text)
        rows.append(row)
    return _table(["encoder", "reference (%)", "reference logit", "mean logit"] + [f"{d} (%)" for d in s.datasets],
                  rows, class_="scores")


def _correlation_setting(s: SettingReport, report: CorrelationReport, records: dict[str, dict]) -> Markup:
    body: list[Any] = [
        _el("h3", s.name),
        _note(f"protocol setting {s.protocol}, metric {s.metric}, layer {s.layer}, datasets "
              f"{', '.join(s.datasets)}; {report.bootstrap} bootstrap resamples over models"),
    ]
    if s.status == "ok":
        body += [_scatter(s, report.reference_name), _correlation_table(s),
                 _correlation_scores(s, report.reference, records)]
    else:
        body.append(_el("p", f"Not correlated: {s.message}", class_="notice"))
    if s.excluded:
        body += [_el("p", "Models left out:"),
                 _el("ul", [_el("li", _el("strong", m), f": {why}") for m, why in s.excluded.items()])]
    return _el("div", body, class_="correlation-setting")


def _reference_table(reference: Mapping[str, float]) -> Markup:
    return _table(["encoder", "reference (%)"], [[_el("th", m, scope="row"), _pct(v)] for m, v in reference.items()],
                  class_="scores")


def _correlation_section(run: _Run, correlation: CorrelationReport | None,
                         reference: Mapping[str, float] | None) -> Markup:
    body: list[Any] = [_note("Logit-transformed scores correlated across models with the reference "
                             "(PROTOCOLS.md section 8): one point per encoder, least-squares line.")]
    if correlation is None:
        body.append(_note("No correlation was computed for this run."))
        if reference:
            body.append(_reference_table(reference))
        return _section("correlation", "Correlation", body)
    records = {str(r.get("cell_id")): r for r in run.records}
    if not correlation.settings:
        body.append(_note("The config names no correlation setting."))
    body += [_correlation_setting(s, correlation, records) for s in correlation.settings]
    body += [_el("h3", f"Reference: {correlation.reference_name}"),
             _reference_table(reference or correlation.reference)]
    return _section("correlation", "Correlation", body)


def _invariance_table(rec: Mapping[str, Any]) -> Markup:
    cells = [c for c in rec["metrics"]["records"] if isinstance(c, Mapping)]
    protocols = list(dict.fromkeys(str(c.get("protocol")) for c in cells))
    maps = list(dict.fromkeys(str(c.get("map")) for c in cells))
    at = {(str(c.get("protocol")), str(c.get("map"))): c for c in cells}
    rows = []
    for p in protocols:
        row: list[Any] = [_el("th", p, scope="row")]
        for mp in maps:
            c = at.get((p, mp))
            if c is None:
                row.append("\u2013")
                continue
            expected = {True: "yes", False: "no"}.get(c.get("expected_invariant"), "\u2013")
            violation = c.get("expected_invariant") is True and (c.get("n_changed") or 0) > 0
            text = [_link(rec, f"{_pct(c.get('fraction_changed'))} %"),
                    _el("span", f" expected {expected}", class_="expected")]
            if violation:
                text.append(_el("strong", f" {VIOLATION_MARKER} violation"))
            row.append(_el("td", text, class_="violation" if violation else None,
                           title=f"{c.get('n_changed')} of {c.get('n_test')} test predictions changed; accuracy "
                                 f"{_pct(c.get('accuracy_before'))} -> {_pct(c.get('accuracy_after'))} %"))
        rows.append(row)
    return _table(["protocol"] + maps, rows, class_="invariance")


def _invariance_section(run: _Run) -> Markup:
    recs = [r for r in run.records if isinstance((r.get("metrics") or {}).get("records"), list)]
    body: list[Any] = [_note("Fraction of test predictions changed by each map of the features, and whether "
                             "the protocol is expected to ignore it (PROTOCOLS.md section 9). A cell expected "
                             f"invariant whose predictions changed is a violation ({VIOLATION_MARKER}).")]
    if not recs:
        body.append(_note("No invariance audit in this run."))
    for rec in recs:
        n_bad = rec["metrics"].get("violations", 0)
        body += [_el("h3", _link(rec, _label(rec))),
                 _el("p", f"violations: {n_bad}", class_="notice" if n_bad else None),
                 _invariance_table(rec)]
    return _section("invariance", "Invariance audit", body)


def _calibration_section(run: _Run) -> Markup:
    recs = [r for r in run.records if "ece" in (r.get("metrics") or {})]
    body: list[Any] = [_note("Expected calibration error (equal-width confidence bins) of the logistic probe "
                             "on test, before and after temperature scaling fitted on validation "
                             "(Ericsson 4.7). Lower is better.")]
    if not recs:
        body.append(_note("No calibration results (no logistic probe with a validation split)."))
        return _section("calibration", "Calibration", body)
    order = {m: i for i, m in enumerate(run.models)}
    recs.sort(key=lambda r: (str(r.get("setting")), str(r.get("layer")), order.get(r.get("model"), len(order)),
                             str(r.get("dataset"))))
    rows = []
    for r in recs:
        m, dg = r["metrics"], r.get("diagnostics") or {}
        rows.append([_el("th", r["model"], scope="row"), r["dataset"], r["layer"], r["setting"],
                     _link(r, _pct(m.get("score"))), _link(r, _pct(m.get("ece"), 2)),
                     _link(r, _pct(m.get("ece_temperature_scaled"), 2)), _num(dg.get("temperature"))])
    body.append(_table(["encoder", "dataset", "layer", "setting", "accuracy (%)", "ECE (%)",
                        "ECE after T (%)", "temperature T"], rows, class_="scores"))
    return _section("calibration", "Calibration", body)


def _needs_warning(rec: Mapping[str, Any]) -> bool:
    return rec.get("converged") is False or bool(rec.get("warnings"))


def _problems(failed: Sequence[Mapping[str, Any]], problems: Sequence[str]) -> list[Any]:
    """Cells that could not be evaluated this run, and run-level problems: never hidden."""
    body: list[Any] = []
    if failed:
        body.append(_el("p", f"{len(failed)} cell(s) could not be evaluated:", class_="notice"))
        body.append(_table(["cell", "error"], [[f.get("cell", "?"), f.get("error", "")] for f in failed],
                           class_="warnings"))
    body.extend(_el("p", p, class_="notice") for p in problems)
    return body


def _warnings_section(run: _Run, failed: Sequence[Mapping[str, Any]] = (), problems: Sequence[str] = ()) -> Markup:
    shown = [(r, False) for r in run.records if _needs_warning(r)]
    shown += [(r, True) for r in run.aside if _needs_warning(r)]
    body: list[Any] = _problems(failed, problems)
    if not shown:
        body.append(_note("Every fit converged and no record carries a warning."))
        return _section("warnings", "Solver warnings", body)
    body.append(_el("p", f"{len(shown)} record(s) did not converge or carry warnings:", class_="notice"))
    rows = []
    for rec, aside in shown:
        dg = rec.get("diagnostics") or {}
        solver = ", ".join(f"{k} = {dg[k]}" for k in ("n_iter", "C", "alpha", "calibration_fit_converged") if k in dg)
        warnings = rec.get("warnings") or []
        rows.append([_link(rec, _label(rec) + (" (set aside)" if aside else "")), rec.get("model"), rec.get("dataset"),
                     rec.get("layer"), rec.get("setting"), "no" if rec.get("converged") is False else "yes",
                     _el("ul", [_el("li", w) for w in warnings]) if warnings else "\u2013", solver or "\u2013"])
    body.append(_table(["cell", "encoder", "dataset", "layer", "setting", "converged", "warnings",
                        "solver diagnostics"], rows, class_="warnings"))
    return _section("warnings", "Solver warnings", body)


_PROVENANCE_PARTS = ("settings", "fingerprints", "provenance", "diagnostics", "timings", "metrics", "warnings")


def _provenance_block(rec: Mapping[str, Any], aside: bool) -> Markup:
    head = {k: rec.get(k) for k in ("cell_id", "protocol", "protocol_version", "config_hash", "splits",
                                    "converged", "n_train", "n_test", "dim", "recorded") if k in rec}
    parts = [_el("h4", "cell"), _el("pre", json.dumps(head, indent=1, default=str))]
    for key in _PROVENANCE_PARTS:
        if key in rec:
            parts += [_el("h4", key), _el("pre", json.dumps(rec[key], indent=1, sort_keys=True, default=str))]
    summary = _label(rec) + (" (set aside: older record or changed settings)" if aside else "")
    return _el("details", _el("summary", summary), parts, id=_anchor(rec))


def _provenance_section(run: _Run) -> Markup:
    seen: set[str] = set()
    blocks = []
    for rec, aside in [(r, False) for r in run.records] + [(r, True) for r in run.aside]:
        if _anchor(rec) not in seen:
            seen.add(_anchor(rec))
            blocks.append(_provenance_block(rec, aside))
    return _section("provenance", "Provenance",
                    _note("Settings, feature fingerprints, encoder provenance, diagnostics and timings of "
                          "every record."), blocks)


# -- the page --------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th[scope=row],table.warnings td,table.facts td{text-align:left}thead th{background:#f2f2f2}
td.best{background:#e6f4e6}.best-marker{color:#b8860b}td.violation{background:#fbe3e3}
.note{color:#555}.notice{color:#a40000;font-weight:bold}img.plot{max-width:100%;display:block}
a{color:inherit}details{margin:0.3em 0}details:target,details[open]{background:#fafafa}
pre{font-size:12px;overflow-x:auto}
"""
# Following a provenance link opens the <details> block it points at.
_JS = ("function openTarget(){var e=document.getElementById(decodeURIComponent(location.hash.slice(1)));"
       "if(e&&e.tagName==='DETAILS'){e.open=true;}}"
       "window.addEventListener('hashchange',openTarget);window.addEventListener('load',openTarget);")


def _page(title: str, sections: Sequence[Markup]) -> str:
    head = _el("head", Markup('<meta charset="utf-8">'), _el("title", title), Markup(f"<style>{_CSS}</style>"),
               Markup(f"<script>{_JS}</script>"))
    return "<!DOCTYPE html>\n" + _el("html", head, _el("body", _el("h1", title), list(sections)), lang="en") + "\n"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the report from the lab
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_report(records: list[dict], correlation: CorrelationReport | None, config: BenchmarkConfig, path: str,
                 reference: dict[str, float] | None = None, failed: Sequence[Mapping[str, Any]] = (),
                 problems: Sequence[str] = ()) -> str:
    """Write the benchmark's HTML report for ``records`` (ledger records) to ``path``; return the path.

    ``failed`` (cells that raised a data error) and ``problems`` (run-level messages) are
    listed with the solver warnings."""
    run = _run(list(records), config)
    sections = [
        _overview(run, config),
        _accuracy_section(run),
        _lowshot_section(run),
        _correlation_section(run, correlation, reference),
        _invariance_section(run),
        _calibration_section(run),
        _warnings_section(run, failed, problems),
        _provenance_section(run),
    ]
    out = Path(path)
    _write_atomic(out, _page("repeval benchmark report", sections))
    return str(out)
