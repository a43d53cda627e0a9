"""Score sections: accuracy tables, the best layer per encoder, low-shot curves, calibration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.report.html import Markup, el, is_number, link, note, pct, row_head, section, table
from jobs.report.marks import CAUTION_MARKER, UNRELIABLE_MARKER
from jobs.report.model import ReportRun
from jobs.report.plots import ALL, lowshot_plot, shot_key
from jobs.report.sections.dense import is_dense
from pipeline.errors import DataValidationError
from pipeline.protocols.fit_warnings import record_warnings, unreliable_reasons
from pipeline.protocols.registry import headline_metric, headline_value

BEST_MARKER = "\u2605"  # the star after the best score of a column
WARNING_MARKER = UNRELIABLE_MARKER  # after a score not to be trusted (CAUTION_MARKER: after one that stands)


def has_score(rec: Mapping[str, Any]) -> bool:
    """Whether a record has a headline score (its entry's primary metric) to tabulate."""
    metric = headline_metric(rec.get("protocol"))
    return metric is not None and metric in (rec.get("metrics") or {})


def score_text(rec: Mapping[str, Any]) -> str:
    """A record's score as the tables print it (few-shot: the mean with its 95 % interval)."""
    m = rec.get("metrics") or {}
    if is_number(m.get("ci95")):  # few-shot: mean accuracy over episodes with its 95 % CI
        return f"{pct(m.get('mean', m.get('score')))} \u00b1 {pct(m['ci95'])}"
    metric = headline_metric(rec.get("protocol"))
    return pct(None if metric is None else m.get(metric))


def _score(rec: Mapping[str, Any]) -> float | None:
    return headline_value(rec)


def _warned(rec: Mapping[str, Any]) -> list[Any]:
    """The marker after a score with fit warnings (its messages as the tooltip); [] without."""
    found = record_warnings(rec)
    if not found:
        return []
    bad = bool(unreliable_reasons(rec))
    text = f"{UNRELIABLE_MARKER} unreliable" if bad else f"{CAUTION_MARKER} {', '.join(w['code'] for w in found)}"
    return [" ", el("span", text, class_="notice" if bad else "note",
                    title="; ".join(f"{w['code']}: {w['message']}" for w in found))]


def _accuracy_table(run: ReportRun, recs: list[dict], table_id: str) -> Markup:
    cells = {(r["model"], r["dataset"]): r for r in recs}
    datasets = [d for d in run.datasets if any(k[1] == d for k in cells)]
    models = [m for m in run.models if any(k[0] == m for k in cells)]
    best = {}
    for d in datasets:  # an untrusted score is never marked best
        vals = [s for (m, dd), r in cells.items() if dd == d and (s := _score(r)) is not None
                and not unreliable_reasons(r)]
        best[d] = max(vals) if vals else None
    rows = []
    for m in models:
        row: list[Any] = [row_head(m)]
        for d in datasets:
            rec = cells.get((m, d))
            if rec is None:
                row.append(el("td", "\u2013", class_="missing", title="not evaluated"))
                continue
            is_best = best[d] is not None and _score(rec) == best[d] and not unreliable_reasons(rec)
            text = link(rec, score_text(rec))
            content = [el("strong", text), " ", el("span", BEST_MARKER, class_="best-marker")] if is_best else [text]
            content += _warned(rec)
            row.append(el("td", content, class_="best" if is_best else None, data_model=m, data_dataset=d,
                          data_table=table_id, title="best in column" if is_best else None))
        rows.append(row)
    return table(["encoder"] + datasets, rows, class_="scores")


def accuracy_section(run: ReportRun) -> Markup:
    """The test scores per setting and layer: encoders by datasets, the best per dataset marked."""
    groups = run.group(lambda r: has_score(r) and not is_dense(r))
    body: list[Any] = [note(
        f"Test accuracy in %: the dataset's headline score (top-1, or mean per-class accuracy where the "
        f"dataset declares it); few-shot cells are the mean over episodes \u00b1 the 95 % confidence "
        f"interval; low-shot cells are the accuracy with every train image ('all'), else with the "
        f"largest N; a protocol of another kind shows its headline metric, named above its table (retrieval: "
        f"mAP@R). One table per protocol setting and layer. Bold with {BEST_MARKER}: best in its "
        f"column. {UNRELIABLE_MARKER} unreliable: the score is not to be trusted and is never marked best; "
        f"{CAUTION_MARKER}: a caution, the score stands (hover for the warnings). Each number links to its "
        f"provenance.")]
    if not groups:
        return section("accuracy", "Accuracy", body, note("No scored records."), empty=True)
    for setting, layer, recs in groups:
        table_id = f"{setting}@{layer}"
        body.append(el("h3", run.heading(setting, layer), id=f"acc-{setting}-{layer}".replace(" ", "_")))
        metric = headline_metric(recs[0].get("protocol"))
        if metric != "score":  # another kind's headline (mAP@R, mIoU): named above its table
            body.append(note(f"{metric} in %"))
        body.append(_accuracy_table(run, recs, table_id))
    return section("accuracy", "Accuracy", body)


def best_layer_section(run: ReportRun) -> Markup:
    """Per protocol setting, the layer where each encoder scores best on each dataset."""
    body: list[Any] = [note("The best layer of each encoder per protocol setting and dataset: its score (%) and "
                            "the layer, among the layers evaluated. Only settings evaluated on more than one "
                            "layer are listed.")]
    shown = 0
    for setting in run.settings:
        recs = [r for r in run.records if r.get("setting") == setting and _score(r) is not None]
        if len({r.get("layer") for r in recs}) < 2:
            continue
        shown += 1
        datasets = [d for d in run.datasets if any(r["dataset"] == d for r in recs)]
        rows = []
        for m in [m for m in run.models if any(r["model"] == m for r in recs)]:
            row: list[Any] = [row_head(m)]
            for d in datasets:
                mine = [r for r in recs if r["model"] == m and r["dataset"] == d]
                if not mine:
                    row.append("\u2013")
                    continue
                best = max(mine, key=lambda r: (_score(r), -run.layers.index(str(r["layer"]))))
                row.append(el("td", link(best, score_text(best)), f" ({best['layer']})", data_layer=best["layer"],
                              data_model=m, data_dataset=d, data_setting=setting))
            rows.append(row)
        body += [el("h3", f"{setting} ({run.protocol_of.get(setting, '?')})"),
                 table(["encoder"] + datasets, rows, class_="scores best-layer")]
    if not shown:
        body.append(note("No protocol setting was evaluated on more than one layer."))
    return section("layers", "Best layer per encoder", body, empty=not shown)


def _is_shot(key: str) -> bool:
    return key == ALL or (key.isdigit() and int(key) >= 1)


def _curve(rec: Mapping[str, Any], part: str = "curve") -> dict[str, float]:
    return {str(k): float(v) for k, v in ((rec.get("metrics") or {}).get(part) or {}).items()
            if _is_shot(str(k)) and is_number(v)}


def lowshot_result(rec: Mapping[str, Any]):
    """The record's curve as the low-shot result it summarises (for relative curves)."""
    # deferred: the low-shot module imports torch, scikit-learn and scipy; a report fits nothing
    from pipeline.protocols.episodic.lowshot import LowShotResult

    s = rec.get("settings") or {}
    mean, std = _curve(rec), _curve(rec, "curve_std")
    shots = tuple(int(k) if k != ALL else ALL for k in sorted(mean, key=shot_key))
    key = {str(k): k for k in shots}
    return LowShotResult(
        shots=shots, mean={key[k]: v for k, v in mean.items()}, std={key[k]: v for k, v in std.items() if k in key},
        per_seed={}, runs=(), skipped={}, probe=str(s.get("probe")), transform=str(s.get("transform")),
        transform_params={}, probe_params={}, n_seeds=int(s.get("n_seeds") or 0), seed=int(s.get("seed") or 0),
        n_classes=int(rec.get("n_classes") or 0), n_test=int(rec.get("n_test") or 0))


def _relative_curves(recs: dict[str, dict], order: list[str], baseline: str | None
                     ) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Each encoder's curve minus the baseline's; an encoder whose curve cannot be compared
    (another probe, shots the baseline lacks) is left out with the reason."""
    # deferred: torch, scikit-learn and scipy, as in lowshot_result
    from pipeline.protocols.episodic.lowshot import relative_to_baseline

    if baseline is None:
        return {}, []
    base = lowshot_result(recs[baseline])
    out, notes = {}, []
    for m in order:
        try:
            rel = relative_to_baseline(lowshot_result(recs[m]), base)
        except DataValidationError as exc:
            notes.append(f"{m}: no relative curve ({exc})")
            continue
        out[m] = {str(k): float(v) for k, v in rel.items()}
    return out, notes


def _lowshot_table(recs: list[dict], order: list[str]) -> Markup:
    by_model = {r["model"]: r for r in recs}
    shots = sorted({s for r in recs for s in _curve(r)}, key=shot_key)
    rows = []
    for m in order:
        rec = by_model[m]
        mean, std = _curve(rec), _curve(rec, "curve_std")
        row: list[Any] = [row_head(m)]
        for s in shots:
            text = f"{pct(mean[s])} \u00b1 {pct(std.get(s))}" if s in mean else "\u2013"
            row.append(link(rec, text) if s in mean else text)
        rows.append(row)
    return table(["encoder"] + [f"N = {s}" for s in shots], rows, class_="scores")


def _pick_baseline(run: ReportRun, available: list[str]) -> tuple[str | None, str | None]:
    """(baseline, note): the configured baseline, else the first encoder with a curve."""
    if run.baseline is not None:
        if run.baseline in available:
            return run.baseline, None
        return None, (f"The configured baseline {run.baseline!r} has no low-shot curve here; relative "
                      f"curves are left out (encoders with one: {', '.join(available)}).")
    return (available[0], None) if available else (None, None)


def lowshot_section(run: ReportRun) -> Markup:
    """The low-shot curves: accuracy against images per class, and against the baseline encoder."""
    groups = run.group(lambda r: isinstance((r.get("metrics") or {}).get("curve"), Mapping))
    body: list[Any] = [note("Mean test accuracy over the repeated train samples (\u00b1 std in the "
                            "tables) against train images per class; right: minus the baseline "
                            "encoder's accuracy, in percentage points (ImageNet-CoG).")]
    if not groups:
        return section("lowshot", "Low-shot curves", body, note("No low-shot records."), empty=True)
    for setting, layer, recs in groups:
        body.append(el("h3", run.heading(setting, layer)))
        for d in [d for d in run.datasets if any(r["dataset"] == d for r in recs)]:
            by_model = {r["model"]: r for r in recs if r["dataset"] == d}
            order = [m for m in run.models if m in by_model and _curve(by_model[m])]
            baseline, why = _pick_baseline(run, order)
            relative, left_out = _relative_curves(by_model, order, baseline)
            curves = {m: _curve(by_model[m]) for m in order}
            body += [el("h4", d), lowshot_plot(curves, relative, order, baseline, f"{d}: {setting}, {layer}")]
            body += [note(n) for n in ([why] if why else []) + left_out]
            body.append(_lowshot_table(list(by_model.values()), order))
    return section("lowshot", "Low-shot curves", body)


def calibration_section(run: ReportRun) -> Markup:
    """Calibration: ECE before and after temperature scaling, the temperature at its bound flagged."""
    recs = [r for r in run.records if "ece" in (r.get("metrics") or {})]
    body: list[Any] = [note("Expected calibration error (equal-width confidence bins) of the logistic probe "
                            "on test, before and after temperature scaling fitted on validation "
                            "(Ericsson et al. 2021). Lower is better. A temperature at its search bound "
                            f"({WARNING_MARKER}) means the validation likelihood had no optimum inside it: the ECE "
                            "after T is then the bound's.")]
    if not recs:
        body.append(note("No calibration results (no logistic probe with a validation split)."))
        return section("calibration", "Calibration", body, empty=True)
    rank = {m: i for i, m in enumerate(run.models)}
    recs.sort(key=lambda r: (str(r.get("setting")), str(r.get("layer")), rank.get(r.get("model"), len(rank)),
                             str(r.get("dataset"))))
    rows = []
    for r in recs:
        m, dg = r["metrics"], r.get("diagnostics") or {}
        temperature = dg.get("temperature")
        at_bound = [f" {WARNING_MARKER} at its search bound"] if dg.get("temperature_at_bound") else []
        rows.append([row_head(r["model"]), r["dataset"], r["layer"], r["setting"],
                     el("td", link(r, pct(m.get("score"))), *_warned(r)), link(r, pct(m.get("ece"), 2)),
                     link(r, pct(m.get("ece_temperature_scaled"), 2)),
                     el("td", f"{temperature:.3f}" if is_number(temperature) else "n/a", *at_bound,
                        class_="violation" if at_bound else None)])
    body.append(table(["encoder", "dataset", "layer", "setting", "accuracy (%)", "ECE (%)",
                       "ECE after T (%)", "temperature T"], rows, class_="scores"))
    return section("calibration", "Calibration", body)
