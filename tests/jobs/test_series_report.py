"""Checkpoint series from a scanned folder, on a small real store: steps from names and
metadata, the newest checkpoint flagged when significantly worse than the best, and the
report that opens with the leaderboard, the regressions and what changed since the
previous run, with the run summary written beside it."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from jobs.report.events import event_payload, read_summary, summary_path
from jobs.analysis.compare import compare_records
from jobs.config import load_config
from jobs.evaluation.evaluate import evaluate_cells
from jobs.run.plan import list_work
from jobs.report.inputs import correlate_and_report
from jobs.analysis.series import analyse_series
from jobs.report.results import config_records
from pipeline.errors import ConfigError
from storage_schema.ledger import Ledger
from tests.helpers.evidence import DATASET, SETTINGS, noisy_encoders
from tests.helpers.html import parse_strict

# step -> noise: step 200 is the best checkpoint, step 300 (the newest) much worse
NOISE = {100: 3.0, 200: 0.0, 300: 8.0}


class _Sections(HTMLParser):
    """The text of each <section id=...> and the sources of the images."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.section, self.section_text, self.images = None, {}, []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("id")
        if tag == "img":
            self.images.append(a.get("src") or "")

    def handle_data(self, data):
        if self.section:
            self.section_text[self.section] = self.section_text.get(self.section, "") + data


def _page(text: str) -> _Sections:
    parse_strict(text)  # well formed
    return _Sections(text)


def _checkpoint(folder: Path, name: str, step: int | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.safetensors"
    # weights of its own: a file with another file's tensors is an alias of it, not an encoder
    own = np.frombuffer(name.encode().ljust(8, b"_")[:8], np.uint8).astype(np.float32)
    save_file({"w": own}, str(path), metadata=None if step is None else {"global_step": str(step)})
    return path


def _config(tmp: Path, **scan) -> dict:
    return {
        "store": str(tmp / "store"),
        "checkpoints": [{"path": str(tmp / "run7"), "arch": "resnet18", "settle_seconds": 0, **scan}],
        "datasets": [{"name": DATASET, "adapter": "features", "params": {"path": str(tmp / "unused.npz")}}],
        "protocols": [{"name": s, "protocol": SETTINGS[s][0], "settings": SETTINGS[s][1]} for s in ("knn", "few")],
        "reference": {"scores": {"ck-step100": 0.5, "ck-step200": 0.7, "ck-step300": 0.6}},
        "report": {"path": str(tmp / "out" / "report.html")},
    }


def _run(tmp: Path, raw: dict, steps) -> dict:
    """Checkpoints of ``steps`` in the folder, their features in the store, their cells evaluated, the report."""
    for step in steps:
        _checkpoint(tmp / "run7", f"ck-step{step}")
    cfg = load_config(raw)
    store = noisy_encoders(tmp, {f"ck-step{s}": NOISE[s] for s in steps}, store=cfg.open_store())
    plan = list_work(cfg, ready_only=False)
    outcomes = evaluate_cells(store, plan.cells)
    assert all(o["status"] in ("computed", "cached") for o in outcomes), outcomes
    return correlate_and_report(store, plan.config, [o for o in outcomes if o.get("cell_id")], plan=plan)


def test_a_scanned_folder_is_a_series_with_steps_from_names_or_metadata(tmp_path):
    _checkpoint(tmp_path / "run7", "ck-step100")
    _checkpoint(tmp_path / "run7", "late", step=250)
    _checkpoint(tmp_path / "run7", "nostep")
    plan = list_work(load_config(_config(tmp_path, step_pattern="ck-step{step}")), ready_only=False)
    got = {e.name: (e.series, e.step) for e in plan.config.encoders}
    assert got == {"ck-step100": ("run7", 100), "late": ("run7", 250), "nostep": ("run7", None)}
    named = list_work(load_config(_config(tmp_path, series="vit-b16")), ready_only=False)
    assert {e.name: (e.series, e.step) for e in named.config.encoders} == {
        "ck-step100": ("vit-b16", None), "late": ("vit-b16", 250), "nostep": ("vit-b16", None)}
    with pytest.raises(ConfigError, match=r"checkpoints\[0\]\.step_pattern: .*exactly once"):
        load_config(_config(tmp_path, step_pattern="ck-step"))


def test_newest_checkpoint_significantly_worse_than_the_best_is_flagged(tmp_path):
    raw = _config(tmp_path, step_pattern="ck-step{step}")
    out = _run(tmp_path, raw, [100, 200, 300])
    cfg = list_work(load_config(raw), ready_only=False).config
    store = cfg.open_store(read_only=True)
    records, _ = config_records(store, load_config(raw))
    [series] = analyse_series(store, records, cfg)
    assert [(p.encoder, p.step) for p in series.points] == [("ck-step100", 100), ("ck-step200", 200),
                                                            ("ck-step300", 300)]
    assert series.flagged and set(series.check.regressed) == {("knn", DATASET, "pre_logits"),
                                                              ("few", DATASET, "pre_logits")}
    by = {(r["model"], r["setting"]): r for r in records}
    direct = {s: compare_records(store, by["ck-step300", s], by["ck-step200", s]) for s in ("knn", "few")}
    low, high = sorted(d.p_value for d in direct.values())
    adjusted = {low: min(2 * low, high), high: high}  # Benjamini-Hochberg over the series' two cells
    for reg in series.regressions():
        d = direct[reg["cell"].split("/")[0]]
        assert reg["against"] == "ck-step200" and reg["best_step"] == 200 and reg["encoder"] == "ck-step300"
        assert reg["difference"] == d.difference < 0
        assert reg["p_adjusted"] == pytest.approx(adjusted[d.p_value], rel=1e-12)
    # the summary beside the report says the same, for machines
    summary = json.loads(Path(out["summary_path"]).read_text())
    assert out["summary_path"] == summary_path(raw["report"]["path"])
    assert {(r["encoder"], r["cell"], r["against"]) for r in summary["regressions"]} == {
        ("ck-step300", f"knn/{DATASET}/pre_logits", "ck-step200"), ("ck-step300", f"few/{DATASET}/pre_logits",
                                                                    "ck-step200")}
    assert summary["evaluated"] == ["ck-step100", "ck-step200", "ck-step300"]
    assert summary["encoders"]["ck-step200"]["cells"][f"knn/{DATASET}/pre_logits"]["score"] == by[
        "ck-step200", "knn"]["metrics"]["score"]
    assert [r["model"] for r in summary["leaderboard"]] == ["ck-step200", "ck-step100", "ck-step300"]
    assert summary["series"][0]["flagged"] and summary["series"][0]["newest"] == {"encoder": "ck-step300",
                                                                                 "step": 300}
    payload = event_payload(summary, out["summary_path"])
    assert payload["regressions"] == summary["regressions"] and "encoders" not in payload
    json.dumps(payload)  # what the event carries is plain JSON


def test_report_opens_with_failures_then_the_summary_and_shows_the_series(tmp_path):
    raw = _config(tmp_path, step_pattern="ck-step{step}")
    first = _run(tmp_path, raw, [100, 200])
    text = Path(first["report"]).read_text(encoding="utf-8")
    page = _page(text)
    order = [text.index(f'<section id="{s}">') for s in ("summary", "overview", "series", "accuracy")]
    assert order == sorted(order)
    assert "No previous run summary beside this report" in page.section_text["summary"]
    assert "No checkpoint series" not in page.section_text["series"]
    assert "best so far" in text and "not significantly worse" in page.section_text["series"]
    # the next night: a new, worse checkpoint; the report says what changed, and flags it
    second = _run(tmp_path, raw, [100, 200, 300])
    text = Path(second["report"]).read_text(encoding="utf-8")
    page = _page(text)
    summary_text = page.section_text["summary"]
    assert "new encoders (1): ck-step300" in summary_text and "new regressions (2)" in summary_text
    assert "is significantly worse than the best so far on 2 of 2 cell(s)" in summary_text
    assert "Regressed or improved" in summary_text and "ck-step200 (step 200)" in summary_text
    series_text = page.section_text["series"]
    assert "newest checkpoint ck-step300 (step 300) is significantly worse than the best so far on 2 cell(s)" \
        in series_text
    assert text.count('class="violation"') >= 2 and "reference" in series_text
    assert len([s for s in page.images if s.startswith("data:image/png;base64,")]) >= 2  # one plot per setting
    changes = read_summary(second["summary_path"])["changes"]
    assert changes["new_encoders"] == ["ck-step300"] and len(changes["regressions"]) == 2
    # re-rendering the report does not move the previous-run mark
    again = correlate_and_report(load_config(raw).open_store(), list_work(load_config(raw),
                                 ready_only=False).config, [], write_summary=False)
    assert again["summary_path"] is None and read_summary(second["summary_path"])["changes"] == changes


def test_a_series_without_a_better_earlier_checkpoint_is_not_flagged(tmp_path):
    raw = _config(tmp_path, step_pattern="ck-step{step}")
    out = _run(tmp_path, raw, [100, 200])  # the newest (200) is the best
    summary = read_summary(out["summary_path"])
    assert summary["regressions"] == [] and not summary["series"][0]["flagged"]
    assert sorted(summary["series"][0]["newest_is_best"]) == [f"few/{DATASET}/pre_logits",
                                                              f"knn/{DATASET}/pre_logits"]
    assert len(Ledger(load_config(raw).open_store(read_only=True))) == 4


def test_a_copy_or_link_of_a_checkpoint_at_its_step_is_one_point_of_the_series(tmp_path):
    # Lightning's save_last writes last.ckpt beside epoch=1-step=200.ckpt: one step, the same weights
    names = {"epoch=0-step=100": (100, "a"), "epoch=1-step=200": (200, "b"), "last": (200, "b"), "other": (200, "c")}
    raw = {**_config(tmp_path), "checkpoints": [], "encoders": [
        {"name": n, "arch": "resnet18", "series": "runs", "step": step} for n, (step, _) in names.items()
        if n != "other"]}
    cfg = load_config(raw)
    records = [{"model": n, "dataset": DATASET, "layer": "pre_logits", "setting": "knn",
                "metrics": {"score": step / 1000}, "provenance": {"weights_fingerprint": fp}}
               for n, (step, fp) in names.items()]
    [series] = analyse_series(None, records, cfg)  # the newest is best: nothing to compare, no store read
    assert series.problem is None and [(p.encoder, p.step) for p in series.points] == [
        ("epoch=0-step=100", 100), ("epoch=1-step=200", 200)]
    assert series.unplaced == [{"encoder": "last", "reason": "the same weights as epoch=1-step=200 (step 200), "
                                                             "which stands for both"}]
    cfg = load_config({**raw, "encoders": raw["encoders"] + [
        {"name": "other", "arch": "resnet18", "series": "runs", "step": 200}]})
    [series] = analyse_series(None, records, cfg)  # other weights at one step: the series cannot be ordered
    assert series.problem == "epoch=1-step=200 and other both have step 200; a series needs one checkpoint per step"


def test_the_step_axis_has_whole_steps_only():
    from jobs.analysis.series import SeriesAnalysis, SeriesPoint
    from jobs.report.sections.series import series_figure
    from pipeline.analysis.series import best_so_far

    cell = ("knn", DATASET, "pre_logits")
    scores = {1: 0.5, 2: 0.7, 3: 0.6}  # matplotlib's default ticks would be 1.0, 1.25, 1.5, ...
    analysis = SeriesAnalysis("run7", points=[SeriesPoint(f"ck{s}", s) for s in scores], scores={cell: scores},
                              running={cell: best_so_far(scores)})
    fig = series_figure(analysis, "knn", "pre_logits", [DATASET], {}, set())
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    [ax] = fig.axes
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert {1, 2, 3} <= set(ticks)


# -- the first night of a series, as the first screen shows it ----------------------------------
@pytest.fixture(scope="module")
def night(tmp_path_factory):
    from tests.helpers.small_series import night_one

    out = night_one(tmp_path_factory.mktemp("night1"))
    out["text"] = Path(out["report"]).read_text(encoding="utf-8")
    parse_strict(out["text"])
    return out


def _between(text: str, start: str, end: str) -> str:
    """The part of ``text`` from ``start`` up to the first ``end`` after it."""
    part = text[text.index(start):]
    return part[:part.index(end)]


def test_an_improvement_is_tested_as_a_regression_is(night):
    from jobs.analysis.compare import compare_encoders
    from tests.helpers.small_series import NIGHT_ONE

    newest, previous = list(NIGHT_ONE)[2], list(NIGHT_ONE)[1]
    improved = {r["cell"]: r for r in night["summary"]["improvements"]}
    assert set(improved) == {f"knn/{DATASET}/pre_logits", f"few/{DATASET}/pre_logits"}
    # `repeval compare newest previous` judges the same cells in the same family: the same verdicts and p
    direct = compare_encoders(night["config"].open_store(read_only=True), night["records"], newest, previous)
    for cell, r in improved.items():
        v = direct.verdicts[tuple(cell.split("/"))]
        assert v.verdict == "better" and r["against"] == previous and r["best_step"] == 100
        assert r["difference"] == v.comparison.difference > 0
        assert r["p_adjusted"] == pytest.approx(v.p_adjusted, rel=1e-12) and r["p_adjusted"] <= 0.05
    knn = improved[f"knn/{DATASET}/pre_logits"]
    assert knn["test"] == "mcnemar-exact" and 0 < knn["test_ci_low"] < knn["test_ci_high"]
    # the first screen: each change with its effect, interval, test and adjusted p; nothing untested
    summary = _between(night["text"], '<section id="summary">', "</section>")
    changes = _between(summary, '<table class="warnings changes">', "</table>")
    assert changes.count("mark-improvement") == 2 and "not tested" not in summary
    assert f"+{100 * knn['difference']:.2f}" in changes and "exact McNemar" in changes and "(bootstrap)" in changes
    assert f"{knn['p_adjusted']:.3g}" in changes
    assert "significantly better than the earlier best on 2" in summary
    # the plateau cell's earlier best is untrusted: the lead stands, but no change is claimed from it
    assert night["series"][0].verdicts[("plateau", DATASET, "pre_logits")].verdict == "unreliable"


def test_a_lead_without_a_significant_difference_is_no_change(night, tmp_path):
    import dataclasses

    from jobs.report.events import build_report_summary
    from jobs.report.page import write_report

    [series] = night["series"]
    untested = dataclasses.replace(series, verdicts={c: dataclasses.replace(v, verdict="indistinguishable")
                                                    for c, v in series.verdicts.items()})
    assert untested.improvements() == []
    summary = build_report_summary(night["records"], [], [untested])
    path = write_report(night["records"], None, night["config"], str(tmp_path / "r.html"), series=[untested],
                        summary=summary)
    text = Path(path).read_text(encoding="utf-8")
    summary_text = _between(text, '<section id="summary">', "</section>")
    assert "Regressed or improved" not in summary_text and "mark-improvement" not in summary_text
    assert "is the best so far on 3 of 3 cell(s) (significantly better than the earlier best on none)" in summary_text


def test_the_leaderboard_marks_untrusted_scores_and_ties_share_a_place(night):
    from tests.helpers.small_series import NIGHT_ONE, TWINS

    rows = {r["model"]: r for r in night["summary"]["leaderboard"]}
    step0, step100, step200 = NIGHT_ONE
    assert rows[step0]["unreliable"] == ["plateau"] and rows[step200]["unreliable"] == []
    assert rows[TWINS[0]]["mean_rank"] == rows[TWINS[1]]["mean_rank"]
    board = _between(night["text"], '<table class="scores leaderboard">', "</table>")
    places = {}
    for row in re.findall(r"<tr>(.*?)</tr>", board, re.S)[1:]:
        model = re.search(r'<th scope="row"[^>]*>([^<]*)', row).group(1).strip()
        places[html.unescape(model)] = (re.match(r"<td[^>]*>(\d+)</td>", row).group(1), row)
    assert {m: p for m, (p, _) in places.items()} == {step200: "1", TWINS[0]: "2", TWINS[1]: "2", step100: "4",
                                                     step0: "5"}
    for model in (step0, step100):  # marked beside the name and on the setting's score
        row = places[model][1]
        assert 'th scope="row" class="untrusted"' in row and 'data-setting="plateau" class="untrusted"' in row
    assert "mark-unreliable" not in places[step200][1]
    assert "its rank is no verdict" in night["text"]


def test_untrusted_scores_are_marked_in_the_series_table(night):
    series = _between(night["text"], '<section id="series">', "</section>")
    untrusted = re.findall(r'<td class="untrusted" data-step="(\d+)" data-dataset="[^"]*" title="not to be trusted: '
                           r'[^"]*grid_edge', series)
    assert sorted(untrusted) == ["0", "100"]


def test_cautions_are_grey_and_folded_in_the_solver_warnings(night):
    warnings = _between(night["text"], '<section id="warnings">', "</section>")
    assert "did not converge or carry warnings" not in warnings
    red = _between(warnings, '<p class="notice">', "</table>")
    assert "2 record(s) whose score is not to be trusted" in red and red.count("grid_edge:") == 2
    folded = _between(warnings, '<details class="cautions">', "</details>")
    assert "3 record(s) with cautions that do not change a number: plateau \u00d73" in folded
    assert "grid_edge" not in folded
