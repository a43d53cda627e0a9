"""The correlation section: one scatter and table per correlation setting, and the reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.analysis.correlate import CorrelationReport, SettingReport
from jobs.report.html import Markup, el, link, note, num, pct, row_head, section, table
from jobs.report.model import ReportRun
from jobs.report.plots import scatter


def _ci(ci: Any) -> str:
    return f"[{num(ci[0], 2)}, {num(ci[1], 2)}]" if ci else "\u2013"


def _stats_table(s: SettingReport) -> Markup:
    rows = [[row_head("setting (mean logit)"), num(s.setting["pearson"]), _ci(s.setting["pearson_ci"]),
             num(s.setting["spearman"]), _ci(s.setting["spearman_ci"]), s.setting["n"]]]
    for d, c in s.per_dataset.items():
        rows.append([row_head(d), num(c["pearson"]), _ci(c["pearson_ci"]), num(c["spearman"]),
                     _ci(c["spearman_ci"]), c["n"]])
    return table(["", "Pearson r", "bootstrap CI", "Spearman \u03c1", "bootstrap CI", "n"], rows,
                 class_="correlation")


def _scores_table(s: SettingReport, reference: Mapping[str, float], records: dict[tuple[str, str], dict]) -> Markup:
    rows = []
    for m in s.models:
        row: list[Any] = [row_head(m), pct(reference.get(m)), num(s.reference_logit.get(m)),
                          num(s.setting_scores.get(m))]
        for d in s.datasets:
            rec = records.get((m, d))
            text = pct(s.scores.get(m, {}).get(d))
            row.append(link(rec, text) if rec else text)
        rows.append(row)
    return table(["encoder", "reference (%)", "reference logit", "mean logit"] + [f"{d} (%)" for d in s.datasets],
                 rows, class_="scores")


def _setting(s: SettingReport, report: CorrelationReport, run: ReportRun) -> Markup:
    body: list[Any] = [
        el("h3", s.name),
        note(f"protocol setting {s.protocol}, metric {s.metric}, layer {s.layer}, datasets "
             f"{', '.join(s.datasets)}; {report.bootstrap} bootstrap resamples over models"),
    ]
    if s.status == "ok":
        records = {(str(r.get("model")), str(r.get("dataset"))): r for r in run.records
                   if r.get("setting") == s.protocol and r.get("layer") == s.layer}
        x = [s.reference_logit[m] for m in s.models]
        y = [s.setting_scores[m] for m in s.models]
        body += [scatter(s.models, x, y, s.setting["pearson"], s.setting["spearman"],
                         f"{report.reference_name}: logit(score)",
                         f"{s.name}: mean logit({s.metric}) over {len(s.datasets)} dataset(s)"),
                 _stats_table(s), _scores_table(s, report.reference, records)]
    else:
        body.append(el("p", f"Not correlated: {s.message}", class_="notice"))
    if s.excluded:
        body += [el("p", "Models left out:"),
                 el("ul", [el("li", el("strong", m), f": {why}") for m, why in s.excluded.items()])]
    return el("div", body, class_="correlation-setting")


def _reference_table(reference: Mapping[str, float]) -> Markup:
    return table(["encoder", "reference (%)"], [[row_head(m), pct(v)] for m, v in reference.items()],
                 class_="scores")


def correlation_section(run: ReportRun, correlation: CorrelationReport | None,
                        reference: Mapping[str, float] | None) -> Markup:
    """The correlations with the reference score: figures, intervals and one scatter plot per setting."""
    body: list[Any] = [note("Logit-transformed scores correlated across models with the reference "
                            "(Ericsson et al. 2021): one point per encoder, least-squares line.")]
    if correlation is None:
        body.append(note("No correlation was computed for this run."))
        if reference:
            body.append(_reference_table(reference))
        return section("correlation", "Correlation", body, empty=not reference)
    if not correlation.settings:
        body.append(note("The config names no correlation setting."))
    body += [_setting(s, correlation, run) for s in correlation.settings]
    body += [el("h3", f"Reference: {correlation.reference_name}"),
             _reference_table(reference or correlation.reference)]
    return section("correlation", "Correlation", body)
