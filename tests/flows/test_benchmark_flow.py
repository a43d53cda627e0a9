"""The benchmark flow end to end: Prefect (test harness API) + a real Dask LocalCluster +
a real Zarr store + real timm models. Counts forward passes and fits per run to show
that only what changed is computed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from flows.benchmark import run_benchmark
from jobs.config import load_config
from pipeline.errors import ConfigError
from storage_schema import FeatureStore
from storage_schema.ledger import FailureLog, Ledger
from tests.helpers.configs import tiny_config
from tests.helpers.html import parse_strict
from prefect.client.schemas.filters import (
    ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId,
)


def _run(raw: dict, tmp: Path) -> dict:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return run_benchmark(load_config(path))


def _in_threads(raw: dict) -> dict:
    """``raw`` evaluated by one in-process Dask worker: what a later run computes is decided by
    the store and the ledger, never by the kind of worker (the first run and the unchanged
    rerun use worker processes); a worker process costs a torch import per run."""
    out = copy.deepcopy(raw)
    out["dask"] = {"n_workers": 1, "processes": False}
    return out


class _FirstRun(tuple):
    """(tmp, raw config, summary), and ``after``: the store and report as the first run left
    them, read at once (the module's other tests run more, in whatever order)."""

    after: dict


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, prefect_harness):
    tmp = tmp_path_factory.mktemp("flow")
    raw = tiny_config(tmp)
    # one worker process on both cores (Dask alone would start it with one math thread)
    raw["dask"].update(n_workers=1, math_threads=2)
    summary = _run(raw, tmp)
    out = _FirstRun((tmp, raw, summary))
    store = FeatureStore(raw["store"], read_only=True)
    out.after = {"records": list(Ledger(store)), "failures": FailureLog(store).records(),
                 "report": Path(summary["report"]).read_text()}
    return out


@pytest.mark.slow
def test_first_run_extracts_evaluates_and_reports(first_run):
    tmp, raw, summary = first_run
    after_first_run = first_run.after
    assert summary["units"] == 6 and summary["extracted"] == 6
    assert summary["forward_batches"] == 3 * (5 + 3)  # 160 train + 80 test images, batches of 32
    assert summary["cells"] == 12 and summary["computed"] == 9 and summary["cached"] == 0
    assert len(summary["failed"]) == 3 and all("n_way=5 needs at least 5 classes" in f["reason"]
                                               for f in summary["failed"])
    records = after_first_run["records"]
    assert len(records) == 9  # failures are not results ...
    failures = after_first_run["failures"]  # ... they are recorded apart, one per failed cell
    assert sorted(f["label"] for f in failures) == sorted(f"{m}/tex/pre_logits:few5" for m in ("r18a", "r18b", "mnv3"))
    assert all(f["kind"] == "cell" and "n_way=5" in f["reason"] and f["attempts"] == 1 for f in failures)
    assert {r["setting"] for r in records} == {"knn20", "ridge", "few"}
    assert {r["model"] for r in records} == {"r18a", "r18b", "mnv3"}
    assert {rec["timings"]["threads"] for rec in records} == {2}  # the worker processes' torch threads
    corr = summary["correlation"]["settings"][0]
    assert corr["n"] == 3
    text = after_first_run["report"]
    page = parse_strict(text)  # every element closed, in order
    assert page.tags["html"] == page.tags["body"] == page.tags["h1"] == 1 and page.tags["table"] >= 1
    assert page.img_sources and all(src.startswith("data:image/png;base64,") for src in page.img_sources)
    assert "r18b" in text and "knn20" in text
    # the failures come first in the report, each with its reason
    failed = text[text.index('<section id="failed" class="failing">'):text.index('<section id="overview">')]
    assert "3 failure(s)" in failed and "r18a/tex/pre_logits:few5" in failed and "n_way=5 needs" in failed


def test_flow_run_of_a_run_with_failures_ends_failed_with_the_reason(first_run):
    from prefect import get_client

    _, _, summary = first_run
    # this run's own flow run, named by its summary: the session's API holds other files' runs too
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(summary["flow_run_id"])
        assert run.flow_id == client.read_flow_by_name("repeval-benchmark").id
        assert run.state.is_failed(), run.state
        assert "3 cells failed" in run.state.message and "few5" in run.state.message
        # the run's end waits for its log lines to be stored: read once, no polling
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        assert any("evaluated 9 of 12 cells" in log.message for log in logs)  # the summary, kept with the run
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["repeval-run-summary"])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
        assert [a.type for a in artifacts] == ["table"]


def test_the_flow_is_handed_the_key_of_the_plan_written_once_into_the_store(first_run):
    from prefect import get_client

    from jobs.run.plan_store import read_plan

    _, raw, summary = first_run
    with get_client(sync_client=True) as client:
        params = client.read_flow_run(summary["flow_run_id"]).parameters
    assert set(params) >= {"store", "plan"} and params["store"]["url"] == raw["store"]
    assert len(str(params)) < 1000  # a key, never the plan itself, however many cells it lists
    run = read_plan(FeatureStore(raw["store"], read_only=True), params["plan"])
    assert len(run.cells) == summary["cells"] == 12 and len(run.units) == summary["units"] == 6
    assert {c.label() for c in run.cells} == {o["label"] for o in summary["outcomes"]}  # what the flow ran


@pytest.mark.slow
def test_rerun_of_unchanged_config_does_no_forward_pass_and_no_fit(first_run):
    tmp, raw, _ = first_run
    ours = {e["name"] for e in raw["encoders"]}  # (another test of the module may add an encoder)

    def attempts() -> dict[str, int]:
        return {f["id"]: f["attempts"] for f in FailureLog(FeatureStore(raw["store"], read_only=True)).records()
                if f.get("model") in ours}

    before = attempts()
    again = _run(raw, tmp)
    assert again["forward_batches"] == 0 and again["extracted"] == 0
    assert again["computed"] == 0 and again["cached"] == 9 and len(again["failed"]) == 3
    after = attempts()
    assert len(after) == 3 and after == {fid: n + 1 for fid, n in before.items()}  # tried once more each


@pytest.mark.slow
def test_a_later_successful_run_clears_the_failures(first_run, tmp_path):
    tmp, raw, _ = first_run
    fixed = _in_threads(raw)
    fixed["protocols"][3]["settings"]["n_way"] = 3  # few5 now fits the 4 classes
    fixed["report"]["path"] = str(tmp_path / "report.html")
    summary = _run(fixed, tmp)
    assert summary["failed"] == [] and summary["failures"] == [] and summary["computed"] == 3
    ours = {e["name"] for e in raw["encoders"]}  # (another test of the module may add an encoder)
    assert [f for f in FailureLog(FeatureStore(raw["store"], read_only=True)).records() if f.get("model") in ours] == []
    assert "Nothing failed" in Path(summary["report"]).read_text()
    _run(_in_threads(raw), tmp)  # the module's other tests expect the original failures on record


@pytest.mark.slow
def test_changed_protocol_settings_recompute_only_that_protocol(first_run):
    tmp, raw, _ = first_run
    changed = _in_threads(raw)
    changed["protocols"][0]["settings"] = {"n_neighbors": 7}
    summary = _run(changed, tmp)
    assert summary["forward_batches"] == 0  # features are never re-extracted for a protocol change
    assert summary["computed"] == 3 and summary["cached"] == 6
    computed = {o["setting"] for o in summary["outcomes"] if o["status"] == "computed"}
    assert computed == {"knn20"}


@pytest.mark.slow
def test_added_encoder_extracts_and_evaluates_only_its_cells(first_run):
    tmp, raw, _ = first_run
    more = _in_threads(raw)
    more["encoders"].append({"name": "r18c", "arch": "resnet18", "input_size": 32, "seed": 2})
    summary = _run(more, tmp)
    assert summary["extracted"] == 2 and summary["forward_batches"] == 5 + 3
    assert {r["model"] for r in summary["extractions"] if r["status"] == "extracted"} == {"r18c"}
    assert summary["computed"] == 3 and summary["cached"] == 9
    assert summary["correlation"]["settings"][0]["n"] == 4


@pytest.mark.slow
def test_a_correlation_that_cannot_be_computed_fails_the_run(first_run, tmp_path, capsys):
    from flows.cli.main import main
    from jobs.report.results import failed_rows

    tmp, raw, _ = first_run
    bad = _in_threads(raw)
    bad["protocols"][3]["settings"]["n_way"] = 3  # every cell succeeds: only the correlation fails
    bad["report"]["path"] = str(tmp_path / "report.html")
    # ridge records map11 on multi-label data only: the check passes, these cells have none
    bad["correlation"]["settings"].append({"name": "ridge-map", "protocol": "ridge", "datasets": ["tex"],
                                           "metric": "map11"})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["run", str(path)]) == 3
    err = capsys.readouterr().err
    assert "correlation ridge-map: not correlated: record" in err and "1 failure(s); exit code 3" in err
    store = FeatureStore(raw["store"])
    [failure] = failed_rows(store, load_config(path))
    assert failure["kind"] == "correlation" and "has no metric 'map11'" in failure["reason"]
    text = Path(bad["report"]["path"]).read_text()
    assert "correlation ridge-map" in text[text.index('<section id="failed" class="failing">'):text.index(
        '<section id="summary">')]
    FailureLog(store).clear("correlation", failure["id"])  # the module's other tests count the failures


@pytest.mark.parametrize("mutate, path", [
    (lambda c: c["encoders"][1].update(archh="resnet18"), "config.encoders[1].archh"),
    (lambda c: c["encoders"][0].update(seed="zero"), "config.encoders[0].seed"),
    (lambda c: c["datasets"][0].pop("adapter"), "config.datasets[0].adapter"),
    (lambda c: c["protocols"][0].update(settings={"n_neighbours": 3}), "config.protocols[0]: settings.n_neighbours"),
    (lambda c: c["correlation"]["settings"][0].update(protocol="nope"), "config.correlation.settings[0].protocol"),
    (lambda c: c["reference"]["scores"].update(r18a=76.5), "config.reference.scores.r18a"),
])
def test_broken_config_is_rejected_with_the_field_path(tmp_path, mutate, path):
    raw = tiny_config(tmp_path)
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    assert str(info.value).startswith(path)
    assert not (tmp_path / "store").exists()
