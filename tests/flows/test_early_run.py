"""``repeval run --early`` end to end, two nights of a checkpoint series (real timm
checkpoints, a real Dask cluster and Prefect API): each new checkpoint is first judged from
a tenth of each split, said in ``early`` lines before the full extraction, then its exact
figures replace the estimates in the same run; no image passes through an encoder twice;
the early figures stay in their own part of the summary, the report and `repeval results
--early`, never among the exact records; a rerun with nothing new has no early pass."""

from __future__ import annotations

import contextlib
import html
import io
import json
from pathlib import Path

import pytest
import yaml

from flows.cli.main import main
from jobs.report.events import read_summary, summary_path
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords
from storage_schema.ledger import Ledger
from tests.helpers.configs import write_checkpoint

ARCH = "resnet10t"
ROWS = {"train": 4 * 50, "test": 4 * 60}  # four texture classes


def _config(tmp: Path) -> Path:
    raw = {
        "store": str(tmp / "store"),
        "dask": {"n_workers": 1, "processes": False},
        "extract": {"batch_size": 40, "chunk_batches": 2},
        "checkpoints": [{"path": str(tmp / "run7"), "arch": ARCH, "input_size": 32, "settle_seconds": 0,
                         "series": "run7", "step_pattern": "ck-step{step}"}],
        "datasets": [{"name": "tex", "adapter": "textures",
                      "params": {"n_per_class": {"train": 50, "test": 60}}}],
        "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 5}},
                      {"name": "few", "protocol": "fewshot", "settings": {"n_way": 4, "n_shot": 5, "n_episodes": 20}}],
        "report": {"path": str(tmp / "out" / "report.html")},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(*args: str) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, json.loads(out.getvalue().strip().splitlines()[-1]), err.getvalue()


@pytest.fixture(scope="module")
def nights(tmp_path_factory, prefect_harness):
    tmp = tmp_path_factory.mktemp("early-run")
    folder, config = tmp / "run7", _config(tmp)
    write_checkpoint(folder, "ck-step100", seed=0, arch=ARCH)
    write_checkpoint(folder, "ck-step200", seed=1, arch=ARCH)
    first = _run("run", str(config), "--early", "--json")
    write_checkpoint(folder, "ck-step300", seed=2, arch=ARCH)
    second = _run("run", str(config), "--early", "--json")
    again = _run("run", str(config), "--early", "--json")
    return {"tmp": tmp, "config": config, "first": first, "second": second, "again": again}


@pytest.mark.slow
def test_the_first_night_is_estimated_then_exact_and_no_image_is_extracted_twice(nights):
    code, summary, _ = nights["first"]
    assert code == 0 and not summary["failures"]
    early = summary["early"]
    assert early["encoders"] == ["ck-step100", "ck-step200"]
    early_rows = round(0.1 * ROWS["train"]) + round(0.1 * ROWS["test"])
    assert early["images"] == 2 * early_rows
    assert summary["images"] == 2 * (ROWS["train"] + ROWS["test"]) - early["images"]  # the rest, only the rest
    knn = [e for e in early["estimates"] if e["setting"] == "knn"]
    assert {e["model"] for e in knn} == {"ck-step100", "ck-step200"}
    for e in knn:  # no history yet: sampling theory, of the readout fitted on the early rows
        assert e["status"] == "estimated" and e["estimate"]["method"] == "sampling"
        assert e["estimate"]["low"] <= e["estimate"]["value"] <= e["estimate"]["high"]
    # 5-shot 4-way episodes need more test images per class than a tenth holds: said, not estimated
    few = [e for e in early["estimates"] if e["setting"] == "few"]
    assert few and all(e["status"] == "failed" and e["reason"] for e in few)
    # each estimate met its exact figure in the same run
    assert {(c["model"], c["setting"]) for c in early["checks"]} == {(e["model"], "knn") for e in knn}


@pytest.mark.slow
def test_the_second_night_judges_the_new_checkpoint_early_against_the_previous(nights):
    code, summary, err = nights["second"]
    assert code == 0
    early = summary["early"]
    assert early["encoders"] == ["ck-step300"]
    [knn] = [e for e in early["estimates"] if e["setting"] == "knn"]
    [previous] = [v for v in knn["verdicts"] if v["kind"] == "previous"]
    assert previous["against"] == "ck-step200"
    # too little history for a line: ck-step200's exact figure plus the early rows' own change
    assert knn["estimate"]["method"] == "change" and previous["against_what"] == "exact"
    if knn["unreliable"] or previous["unreliable"]:  # an early fit at chance, say: no verdict, as an exact cell
        assert previous["verdict"] == "unreliable" and previous["reason"] == previous["unreliable"]
    else:
        assert previous["verdict"] in ("better", "worse", "indistinguishable") and previous["p_value"] is not None
    # said before the full run started, each as an early line
    lines = err.splitlines()
    first_early = next(i for i, line in enumerate(lines) if "early ck-step300 knn/tex/pre_logits:" in line)
    first_extract = next(i for i, line in enumerate(lines) if "extract:" in line)
    assert first_early < first_extract
    assert any("early estimates replaced by the exact figures" in line for line in lines)


@pytest.mark.slow
def test_early_figures_never_join_the_exact_records(nights):
    store = FeatureStore(str(nights["tmp"] / "store"), read_only=True)
    ledger = list(Ledger(store))
    assert len(ledger) == 3 * 2  # three checkpoints, two settings: exact records only
    assert all("estimate" not in rec and rec.get("status") is None for rec in ledger)
    estimates = list(EarlyRecords(store).iter("estimates"))
    assert {e["model"] for e in estimates} == {"ck-step100", "ck-step200", "ck-step300"}
    report = nights["tmp"] / "out" / "report.html"
    beside = read_summary(summary_path(str(report)))
    assert {e["encoder"] for e in beside["early"]["estimates"]} == {"ck-step100", "ck-step200", "ck-step300"}
    verdicts = [v for e in beside["early"]["estimates"] for v in e["verdicts"]]
    assert verdicts and all(v["reason"] for v in verdicts)  # what drew each early verdict goes with it
    assert all("early" not in cell for enc in beside["encoders"].values() for cell in enc["cells"].values())
    text = report.read_text(encoding="utf-8")
    section = text[text.index('<section id="early">'):]
    assert "Early estimates" in section[:200] and "\u2248" in section[:section.index("</section>")]
    assert f'title="{html.escape(verdicts[0]["reason"])}"' in section  # the reason where the pointer rests
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["results", "--config", str(nights["config"]), "--early"]) == 0
    table = out.getvalue()
    assert table.startswith("early estimates (not exact figures") and "ck-step300" in table


@pytest.mark.slow
def test_a_rerun_with_nothing_new_has_no_early_pass(nights):
    code, summary, _ = nights["again"]
    assert code == 0 and "early" not in summary  # answered from the ledger, without a run


def _early_events(report: str, timeout: float = 60.0) -> list:
    """The benchmark's early events as the Prefect API stored them (persisted asynchronously)."""
    import time

    from prefect import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    from flows.alerts import EARLY_EVENT, report_resource

    flt = EventFilter(event=EventNameFilter(name=[EARLY_EVENT]),
                      resource=EventResourceFilter(id=[report_resource(report)["prefect.resource.id"]]))
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            events = sorted(client.read_events(filter=flt, limit=10).events, key=lambda e: e.occurred)
        if len(events) >= 2 or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


@pytest.mark.slow
def test_each_early_pass_emits_its_event_and_the_documented_automation_renders_it(nights):
    import re

    from prefect.events.schemas.automations import AutomationCore
    from prefect.server.utilities.user_templates import render_user_template_sync, validate_user_template

    from tests.helpers.cli import REPO

    first, second = _early_events(str(nights["tmp"] / "out" / "report.html"))
    assert first.payload["early"] is True and first.payload["encoders"] == ["ck-step100", "ck-step200"]
    assert second.payload["encoders"] == ["ck-step300"] and second.payload["estimates"] >= 1
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "early.md").read_text(), re.S)
               if "repeval.checkpoint.early-regressed" in b]
    automation = AutomationCore.model_validate(yaml.safe_load(block))
    body = automation.actions[0].body
    validate_user_template(body)
    worse = {"encoder": "ck-step300", "cell": "knn/tex/pre_logits", "kind": "previous", "against": "ck-step200",
             "estimate": 0.42, "low": 0.38, "high": 0.46, "against_value": 0.5}
    event = second.model_copy(update={"payload": {**second.payload, "worse": [worse]}})
    text = render_user_template_sync(body, {"event": event})
    assert "ck-step300 on knn/tex/pre_logits: early estimate 42.0 % [38.0, 46.0] against ck-step200" in text
