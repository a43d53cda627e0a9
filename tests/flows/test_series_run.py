"""A checkpoint series end to end through ``repeval run``, two nights: real timm checkpoints
in a folder, their steps in the file names, a real Dask cluster and Prefect API. On the
second night a collapsed checkpoint (every image gives the same features) joins; it is
flagged against the series' best in the report, in the summary beside it (with what
changed since the first night), and in the events the run emits.
The automation docs/series.md shows is one Prefect accepts, and its message
renders from those events."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from pathlib import Path

import pytest
import yaml

from flows.alerts import EVALUATED_EVENT, REGRESSED_EVENT, report_resource
from flows.cli.main import main
from jobs.report.events import event_payload, read_summary, summary_path
from tests.helpers.cli import REPO
from tests.helpers.configs import write_checkpoint
from tests.helpers.html import parse_strict

# random-init resnet10t features tell the four textures apart well above chance at 32 px
ARCH = "resnet10t"
SETTINGS = ("knn", "few")
CELLS = {f"{s}/tex/pre_logits" for s in SETTINGS}


def _collapsed_checkpoint(folder: Path, name: str) -> Path:
    """A resnet10t whose stem ignores its input (zero first convolution, constant batch-norm
    output after it): every image has the same features, so it scores at chance."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(2)
    state = timm.create_model(ARCH, pretrained=False, num_classes=0).state_dict()
    state["conv1.0.weight"] = torch.zeros_like(state["conv1.0.weight"])
    state["conv1.1.bias"] = torch.ones_like(state["conv1.1.bias"])
    path = folder / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


def _config(tmp: Path) -> Path:
    raw = {
        "store": str(tmp / "store"),
        "dask": {"n_workers": 1, "processes": False},
        "extract": {"batch_size": 40, "chunk_batches": 2},
        "checkpoints": [{"path": str(tmp / "run7"), "arch": ARCH, "input_size": 32, "settle_seconds": 0,
                         "series": "r10t-run7", "step_pattern": "ck-step{step}"}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 20, "test": 40}}}],
        "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 5}},
                      {"name": "few", "protocol": "fewshot", "settings": {"n_way": 4, "n_shot": 5, "n_episodes": 40}}],
        # the trackers' defaults: out/tensorboard/ and the file: URI of out/mlruns/
        "report": {"path": str(tmp / "out" / "report.html"), "trackers": [{"kind": "tensorboard"}, {"kind": "mlflow"}]},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _events(resource_id: str, expected: dict[str, int], timeout: float = 60.0) -> dict[str, list]:
    """The benchmark's events as the Prefect API stored them, by name, oldest first; waits
    until ``expected`` (name -> count) have arrived (they are persisted asynchronously)."""
    from prefect import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    flt = EventFilter(event=EventNameFilter(prefix=["repeval.checkpoint."]),
                      resource=EventResourceFilter(id=[resource_id]))
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            found: dict[str, list] = {}
            for e in sorted(client.read_events(filter=flt, limit=50).events, key=lambda e: e.occurred):
                found.setdefault(e.event, []).append(e)
        if all(len(found.get(n, [])) >= k for n, k in expected.items()) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def _documented_automation():
    """The automation of docs/series.md ("Events and automations"), as Prefect reads it."""
    from prefect.events.schemas.automations import AutomationCore

    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "series.md").read_text(encoding="utf-8"),
                                    re.S)
              if REGRESSED_EVENT in b]
    assert len(blocks) == 1, blocks
    return AutomationCore.model_validate(yaml.safe_load(blocks[0]))


def _render(template: str, event) -> str:
    from prefect.server.utilities.user_templates import render_user_template_sync, validate_user_template

    validate_user_template(template)
    return render_user_template_sync(template, {"event": event})


def _run(config: Path) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", str(config), "--json"])
    return code, json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def series_run(tmp_path_factory, prefect_harness):
    """Two nights: two good checkpoints, then a third, collapsed one joins the folder."""
    tmp = tmp_path_factory.mktemp("series")
    folder, config, report = tmp / "run7", _config(tmp), tmp / "out" / "report.html"
    write_checkpoint(folder, "ck-step100", seed=0, score=0.4, arch=ARCH)
    write_checkpoint(folder, "ck-step200", seed=1, score=0.6, arch=ARCH)
    first_code, first = _run(config)
    first_summary = read_summary(summary_path(str(report)))
    _collapsed_checkpoint(folder, "ck-step300")
    code, summary = _run(config)
    return {"tmp": tmp, "first_code": first_code, "first": first, "first_summary": first_summary,
            "code": code, "summary": summary, "report": report}


@pytest.mark.slow
def test_first_night_has_no_regression(series_run):
    assert series_run["first_code"] == 0 and series_run["first"]["regressions"] == []
    summary = series_run["first_summary"]
    assert summary["evaluated"] == ["ck-step100", "ck-step200"] and summary["regressions"] == []
    [series] = summary["series"]
    assert not series["flagged"] and series["newest"] == {"encoder": "ck-step200", "step": 200}
    assert summary["changes"]["new_encoders"] == ["ck-step100", "ck-step200"]


@pytest.mark.slow
def test_newest_checkpoint_is_flagged_in_the_run_summary_and_the_json_beside_the_report(series_run):
    assert series_run["code"] == 0  # a regression is a finding, not a failed run
    run = series_run["summary"]
    assert run["failures"] == [] and run["summary_path"] == summary_path(str(series_run["report"]))
    summary = read_summary(run["summary_path"])
    [series] = summary["series"]
    assert series["series"] == "r10t-run7" and series["flagged"]
    assert series["checkpoints"] == [{"encoder": f"ck-step{s}", "step": s} for s in (100, 200, 300)]
    assert series["newest"] == {"encoder": "ck-step300", "step": 300} and series["newest_is_best"] == []
    assert set(series["verdicts"]) == CELLS and set(series["verdicts"].values()) == {"worse"}
    regressions = {r["cell"]: r for r in summary["regressions"]}
    assert set(regressions) == CELLS and run["regressions"] == summary["regressions"]
    for cell, r in regressions.items():
        setting = cell.split("/")[0]
        best = max((100, 200), key=lambda s: summary["encoders"][f"ck-step{s}"]["cells"][cell]["score"])
        newest = summary["encoders"]["ck-step300"]["cells"][cell]["score"]
        assert r["encoder"] == "ck-step300" and r["against"] == f"ck-step{best}" and r["best_step"] == best
        assert r["difference"] == pytest.approx(newest - summary["encoders"][f"ck-step{best}"]["cells"][cell]["score"])
        assert r["difference"] < 0 and r["p_adjusted"] < 0.05, (setting, r)
        assert newest == pytest.approx(0.25, abs=0.05)  # four classes, one answer for every image
    assert summary["evaluated"] == ["ck-step300"]  # the earlier checkpoints' cells come from the ledger
    assert series_run["summary"]["computed"] == 2 and series_run["summary"]["cached"] == 4
    assert summary["leaderboard"][-1]["model"] == "ck-step300"
    changes = summary["changes"]  # against the first night's summary
    assert changes["new_encoders"] == ["ck-step300"] and changes["new_cells"] == []
    assert {r["cell"] for r in changes["regressions"]} == CELLS


@pytest.mark.slow
def test_report_shows_the_series_with_its_best_checkpoint_and_the_flag(series_run):
    text = series_run["report"].read_text(encoding="utf-8")
    page = parse_strict(text)
    order = [text.index(f'<section id="{s}">') for s in ("summary", "series", "accuracy")]
    assert order == sorted(order)
    series = text[text.index('<section id="series">'):]
    series = series[:series.index("</section>")]
    assert "Series r10t-run7: 3 checkpoint(s)" in series
    assert ("the newest checkpoint ck-step300 (step 300) is significantly worse than the best so far on "
            "2 cell(s)") in series
    assert series.count('class="violation"') == 2 and series.count('title="best so far"') == 2
    assert "reference" in series  # the sidecars' reference scores, a line beside the datasets
    summary = text[text.index('<section id="summary">'):text.index('<section id="overview">')]
    assert "Series r10t-run7: the newest checkpoint ck-step300 (step 300) is significantly worse than the best " \
        "so far on 2 of 2 cell(s)" in summary
    assert "new encoders (1): ck-step300" in summary and "new regressions (2)" in summary
    assert sum(src.startswith("data:image/png;base64,") for src in page.img_sources) >= len(SETTINGS)


@pytest.mark.slow
def test_each_run_emits_evaluated_and_the_regressed_run_also_regressed_carrying_the_summary(series_run):
    report = str(series_run["report"])
    events = _events(report_resource(report)["prefect.resource.id"], {EVALUATED_EVENT: 2, REGRESSED_EVENT: 1})
    assert {n: len(e) for n, e in events.items()} == {EVALUATED_EVENT: 2, REGRESSED_EVENT: 1}
    first, second = events[EVALUATED_EVENT]
    assert first.payload["evaluated"] == ["ck-step100", "ck-step200"] and first.payload["regressions"] == []
    summary = read_summary(summary_path(report))
    for event in (second, *events[REGRESSED_EVENT]):
        payload = event.payload
        assert payload["summary_path"] == summary_path(report) and payload["report"] == report
        assert payload["evaluated"] == ["ck-step300"] and payload["changes"]["new_encoders"] == ["ck-step300"]
        assert payload["regressions"] == json.loads(json.dumps(summary["regressions"]))
        assert payload["series"] == [{"series": "r10t-run7", "newest": {"encoder": "ck-step300", "step": 300},
                                      "flagged": True, "unreliable": []}]
        # the collapsed checkpoint scores at chance because its features are one vector: a true
        # regression, said as such (not an untrusted fit)
        assert {(w["encoder"], w["cell"], tuple(w["codes"]), w["unreliable"]) for w in payload["warnings"]} == {
            ("ck-step300", cell, ("collapsed_features",), False) for cell in CELLS}
        assert payload["truncated"] is False
    # the documented automation fires on the regression event and its message names the regressions
    [event] = events[REGRESSED_EVENT]
    automation = _documented_automation()
    assert automation.trigger.expect == {REGRESSED_EVENT}
    assert automation.trigger.match.includes([event.resource])
    [action] = automation.actions
    assert _render(action.subject, event) == "repeval: 2 regression(s)"
    body = _render(action.body, event)
    for r in summary["regressions"]:
        assert f"ck-step300 (step 300) is worse than {r['against']} (step {r['best_step']}) on {r['cell']}: " in body
    assert body.endswith(f"report: {report}")


@pytest.mark.slow
def test_each_night_logs_its_new_checkpoints_to_tensorboard_and_mlflow(series_run):
    """The first night logs steps 100 and 200, the second only 300: read back with
    TensorBoard's and MLflow's own readers, each step once, the ledger's scores; the
    results table carries each checkpoint's step, file and weights fingerprint."""
    pytest.importorskip("tensorboard", reason="the trackers extra: pip install -e '.[trackers]'")
    pytest.importorskip("mlflow", reason="the trackers extra: pip install -e '.[trackers]'")
    import os

    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from jobs.report.results import results_frame

    out = series_run["tmp"] / "out"
    assert [(t["kind"], t["logged"], t["error"]) for t in series_run["first"]["trackers"]] == [
        ("tensorboard", 4, None), ("mlflow", 4, None)]  # 2 checkpoints x 2 settings
    assert [t["logged"] for t in series_run["summary"]["trackers"]] == [2, 2]  # the new checkpoint only
    frame = results_frame(series_run["tmp"] / "config.yaml")
    scores = {(s, int(step)): score
              for s, step, score in frame[["setting", "step", "metric.score"]].itertuples(index=False, name=None)}
    assert frame["weights_fingerprint"].notna().all() and frame["checkpoint"].str.endswith(".safetensors").all()
    assert sorted(frame["step"].unique()) == [100, 200, 300]

    events = EventAccumulator(str(out / "tensorboard" / "r10t-run7"))
    events.Reload()
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.7 reads a file: store only so
    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("repeval").experiment_id])
    for setting in SETTINGS:
        key = f"{setting}/tex/pre_logits"
        expected = {step: score for (s, step), score in scores.items() if s == setting}
        tb = {e.step: e.value for e in events.Scalars(key)}
        ml = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        assert len(events.Scalars(key)) == 3 and tb == pytest.approx(expected, abs=1e-6)
        assert len(client.get_metric_history(run.info.run_id, key)) == 3 and ml == pytest.approx(expected)


def test_the_documented_automation_is_one_prefect_accepts_and_renders_the_regressions():
    from prefect.events.schemas.events import Resource

    automation = _documented_automation()
    assert automation.trigger.expect == {REGRESSED_EVENT} and automation.trigger.posture == "Reactive"
    resource = Resource.model_validate(report_resource("/data/nightly/report.html"))
    assert automation.trigger.match.includes([resource])  # the resource every run's events carry
    [action] = automation.actions
    assert action.type == "send-notification"
    regression = {"series": "vit-run7", "encoder": "ck-step300", "step": 300, "cell": "knn/tex/pre_logits",
                  "against": "ck-step200", "best_step": 200, "difference": -0.0312, "p_adjusted": 0.004,
                  "metric": "top1"}
    payload = event_payload({"report": "/data/nightly/report.html", "regressions": [regression]},
                            "/data/nightly/report.summary.json")
    event = {"event": REGRESSED_EVENT, "payload": payload}
    assert _render(action.subject, event) == "repeval: 1 regression(s)"
    assert _render(action.body, event) == (
        "ck-step300 (step 300) is worse than ck-step200 (step 200) on knn/tex/pre_logits: -3.12 points, "
        "adjusted p = 0.004\nreport: /data/nightly/report.html")
