"""The encoder protocols' units of work on a real store, with a random-init tiny timm model
(test_resnet at 32 px) on CPU: the records (keyed by weights, images and settings; equal to
the pipeline's own results), identical weights under another name, the scratch folder, the
listing without torch, raw correlation of an unbounded metric, the report sections, and a
failed unit in the failure machinery."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from flows.tasks import finetune_finish_task, finetune_point_task
from jobs.config import load_config
from jobs.analysis.correlate import correlate_results
from jobs.config.protocols import settings_hash
from jobs.evaluation.identity import recorded_cells, weights_identity
from jobs.evaluation.scratch import scratch_folder
from jobs.evaluation.weights import grid_finish, grid_point, weights_cell
from jobs.run.failures import sync_failures
from jobs.run.plan import make_adapter, make_plan
from jobs.report import write_report
from jobs.report.inputs import config_failures, run_records
from pipeline.protocols.diagnostics import SaliencySettings, saliency_study
from pipeline.protocols import get_protocol
from pipeline.encoders import load_encoder
from pipeline.protocols.finetune import DatasetSplits, run_finetune
from pipeline.plain import to_plain
from storage_schema import FeatureStore, keys, record_keys
from storage_schema.ledger import FailureLog, Ledger, cell_id
from tests.helpers.html import parse_strict

FT = {"steps": 3, "batch_size": 8, "lrs": [0.01, 0.05], "weight_decays": [0.0], "augmentations": ["center_crop"],
      "save_every": 2, "num_workers": 0, "eval_batch_size": 64}


def _raw(tmp) -> dict:
    tiny = {"arch": "test_resnet", "input_size": 32}
    return {
        "store": str(tmp / "store"),
        "encoders": [{"name": "a", **tiny}, {"name": "twin", **tiny}, {"name": "b", **tiny, "seed": 1},
                     {"name": "c", **tiny, "seed": 2}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 10, "test": 5}}}],
        "protocols": [{"name": "ft", "protocol": "finetune", "settings": FT},
                      {"name": "sal", "protocol": "saliency", "settings": {"n_images": 4, "n_examples": 2}},
                      {"name": "col", "protocol": "colour_detail", "settings": {"steps": 3, "n_images": 2,
                                                                                "n_examples": 1}},
                      {"name": "bad", "protocol": "finetune", "settings": {**FT, "val_fraction": 0.05}}],
        "extract": {"device": "cpu"},
        "reference": {"scores": {"a": 0.3, "twin": 0.3, "b": 0.5, "c": 0.7}},
        "correlation": {"settings": [{"name": "diffusion", "protocol": "sal", "datasets": ["tex"],
                                      "metric": "attentive_diffusion", "bounded": False}]},
        "report": {"path": str(tmp / "report.html")},
    }


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("encoder-jobs")
    cfg = load_config(_raw(tmp))
    plan = make_plan(cfg)
    store = FeatureStore(cfg.store)
    cells = {(c.model, c.setting): c for c in plan.cells}
    ft = cells[("a", "ft")]
    points = [grid_point(store, ft, i, cfg.extract) for i in range(2)]
    scratch = scratch_folder(store, cfg.extract, "finetune", points[0]["cell_id"])
    saved = sorted(p.name for p in scratch.iterdir())
    out = {"cfg": cfg, "plan": plan, "store": store, "cells": cells, "points": points, "saved": saved,
           "scratch": scratch, "ft": grid_finish(store, ft, points, cfg.extract)}
    out["twin_point"] = grid_point(store, cells[("twin", "ft")], 0, cfg.extract)
    out["twin"] = grid_finish(store, cells[("twin", "ft")], [out["twin_point"]], cfg.extract)
    out["again"] = grid_point(store, ft, 1, cfg.extract)
    out["sal"] = {m: weights_cell(store, cells[(m, "sal")], cfg.extract) for m in ("a", "b", "c")}
    out["col"] = weights_cell(store, cells[("a", "col")], cfg.extract)
    bad = cells[("a", "bad")]
    out["bad_points"] = [finetune_point_task.fn({"url": cfg.store}, to_plain(bad), i, to_plain(cfg.extract))
                         for i in range(2)]
    out["bad"] = finetune_finish_task.fn({"url": cfg.store}, to_plain(bad), out["bad_points"],
                                         to_plain(cfg.extract))
    yield out
    torch.set_num_threads(threads)


def _record(ran, model: str, setting: str) -> dict:
    found, _ = recorded_cells(ran["store"], [ran["cells"][(model, setting)]])
    return run_records(ran["store"], found)[0]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def test_grid_points_then_the_finish_record_the_pipelines_own_result(ran, tmp_path):
    assert [p["status"] for p in ran["points"]] == ["done", "done"] and ran["ft"]["status"] == "computed"
    rec = _record(ran, "a", "ft")
    cell = ran["cells"][("a", "ft")]
    splits = DatasetSplits(make_adapter(cell.dataset_config))
    direct = run_finetune(cell.encoder.spec(), splits, FT, tmp_path / "direct", "cpu")
    assert rec["metrics"].keys() == direct["metrics"].keys()
    assert all(_same(rec["metrics"][k], float(v)) for k, v in direct["metrics"].items())  # bitwise, on CPU
    assert {"score", "top1", "mean_per_class", "ece", "ece_temperature_scaled"} <= rec["metrics"].keys()
    diag = rec["diagnostics"]
    assert diag["selected"] == direct["diagnostics"]["selected"] and len(diag["val_scores"]) == 2
    assert [r["stage"] for r in diag["runs"]] == ["select", "select", "refit"]
    gpu = rec["gpu"]
    assert gpu["device"] == "cpu" and gpu["steps_trained"] == 3 * 3 and gpu["steps_per_second"] > 0
    assert gpu["peak_memory_bytes"] is None  # measured on CUDA only
    assert rec["layer"] == "pre_logits" and rec["n_test"] == 20 and rec["converged"] is True


def test_the_record_is_keyed_by_weights_images_and_full_settings(ran):
    rec = _record(ran, "a", "ft")
    cell = ran["cells"][("a", "ft")]
    adapter = make_adapter(cell.dataset_config)
    weights = load_encoder(cell.encoder.spec(), device="cpu").weights_fingerprint
    fps = rec["fingerprints"]
    assert fps["weights"] == weights and rec["provenance"]["weights_fingerprint"] == weights
    assert {k: v for k, v in fps.items() if k.endswith(".images")} == {
        "train.images": adapter.fingerprint("train"), "test.images": adapter.fingerprint("test")}
    entry = get_protocol("finetune")
    assert rec["settings"] == entry.resolve(FT) and rec["settings"]["num_workers"] == 0
    assert rec["cell_id"] == cell_id(fps, "finetune", entry.result_settings(rec["settings"]), entry.version)
    assert rec["config_hash"] == settings_hash("finetune", FT)


def test_scratch_state_is_kept_per_point_until_the_record_is_written(ran):
    assert ran["saved"] == ["select-000", "select-001"]
    assert str(ran["scratch"].parent.parent) == ran["store"].backend.path(keys.SCRATCH)  # under a local store
    assert not ran["scratch"].exists()


def test_identical_weights_under_another_name_share_the_record(ran):
    assert ran["twin_point"]["status"] == "cached" and ran["twin"]["status"] == "cached"
    assert ran["twin"]["cell_id"] == ran["ft"]["cell_id"]
    twin = _record(ran, "twin", "ft")
    assert twin["model"] == "twin" and twin["recorded_as"] == "a"
    assert sum(r["protocol"] == "finetune" for r in Ledger(ran["store"])) == 1


def test_a_recorded_cell_is_answered_without_training_and_a_changed_setting_is_not(ran):
    assert ran["again"]["status"] == "cached" and "result" not in ran["again"]
    cell = ran["cells"][("a", "ft")]
    changed = dataclasses.replace(cell, settings={**cell.settings, "steps": 4})
    found, missing = recorded_cells(ran["store"], [cell, changed])
    assert [f["cell_id"] for f in found] == [ran["ft"]["cell_id"]] and missing == [changed]


def test_diagnostic_records_match_the_study_and_keep_their_pictures(ran):
    rec = _record(ran, "a", "sal")
    cell = ran["cells"][("a", "sal")]
    direct = saliency_study(cell.encoder.spec(), make_adapter(cell.dataset_config), "test",
                            SaliencySettings(n_images=4, n_examples=2), "cpu")
    assert rec["metrics"]["attentive_diffusion"] == direct["metrics"]["attentive_diffusion"]
    assert sorted(rec["fingerprints"]) == ["input", "test.images", "weights"] and rec["splits"] == ["test"]
    for r in (rec, _record(ran, "a", "col")):
        png = ran["store"].backend.read(record_keys.examples_key(r["cell_id"]))
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and r["diagnostics"]["examples"] is True
        assert r["gpu"]["device"] == "cpu" and r["gpu"]["images_per_second"] > 0
    col = _record(ran, "a", "col")["metrics"]
    assert col["perceptual_distance"] is None
    assert np.isclose(col["colour_mse_mean"], np.mean([col[f"colour_mse_{c}"] for c in ("red", "green", "blue")]))


def test_correlation_reads_attentive_diffusion_raw(ran):
    records = [_record(ran, m, "sal") for m in ("a", "b", "c")]
    report = correlate_results(records, ran["cfg"], ran["cfg"].reference_scores())
    setting = report.setting("diffusion")
    assert setting.status == "ok" and setting.n == 3
    for r in records:  # no logit transform: a percentage above 1 is taken as it is
        assert setting.setting_scores[r["model"]] == pytest.approx(r["metrics"]["attentive_diffusion"])


def test_report_shows_the_grid_the_selection_and_the_pictures(ran):
    records = [_record(ran, "a", "ft"), _record(ran, "twin", "ft"), _record(ran, "a", "col")] + [
        _record(ran, m, "sal") for m in ("a", "b", "c")]
    path = write_report(records, None, ran["cfg"], ran["cfg"].report.path)
    text = open(path).read()
    page = parse_strict(text)
    finetune = text[text.index('<section id="finetune">'):text.index('<section id="diagnostics">')]
    assert finetune.count("<tr>") == 1 + 2 + 2 * (1 + 2)  # summary header + 2 rows; two grids of 2 points
    selected = records[0]["diagnostics"]["selected"]
    assert f"lr {selected['lr']:g}, wd 0, center_crop" in finetune
    assert finetune.count("\u2605") == 1 + 2  # the note, then the selected point of each grid
    calibration = text[text.index('<section id="calibration">'):text.index('<section id="finetune">')]
    assert "ft" in calibration  # ECE before and after scaling, as any protocol that reports it
    diagnostics = text[text.index('<section id="diagnostics">'):text.index('<section id="warnings">')]
    assert diagnostics.count("<img") == 4  # three saliency pictures, one of reconstructions
    assert all(src.startswith("data:image/png;base64,") for src in page.img_sources)
    assert "attentive diffusion (%)" in diagnostics and "red MSE" in diagnostics


def test_a_failed_grid_point_fails_its_cell_in_the_failure_machinery(ran):
    points, bad = ran["bad_points"], ran["bad"]
    assert [p["status"] for p in points] == ["failed", "failed"] and points[0]["index"] == 0
    assert "Cannot hold out a stratified 0.05 validation split" in points[0]["reason"]
    assert bad["status"] == "failed" and bad["label"] == "a/tex/pre_logits:bad"
    assert bad["reason"].startswith("DataValidationError: 2 of 2 grid points failed, e.g. point 0: ")
    store = ran["store"]
    sync_failures(store, cells=[bad])
    plan = ran["plan"]
    listed = config_failures(store, plan.config, plan.cells, plan.units)
    assert [f["label"] for f in listed] == ["a/tex/pre_logits:bad"]
    sync_failures(store, cells=[{**bad, "status": "computed"}])  # a later success clears it
    assert FailureLog(store).records("cell") == []



_POINT_SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from flows.tasks import finetune_point_task
store, cell, index, extract = json.loads(sys.argv[1])
out = finetune_point_task.fn({"url": store}, cell, index, extract)
print(json.dumps([out.get("status"), (out.get("result") or {}).get("resumed_from_step"), out.get("reason")]))
"""


@pytest.mark.slow
def test_two_runs_at_once_train_a_grid_point_once(ran):
    """Another run holds a fine-tuning grid point's lease: this one waits on it (said in its
    log); once both go, one trains the point and the other resumes its saved final state."""
    import json
    import subprocess
    import sys

    from tests.helpers.cli import REPO, cli_env

    cell = ran["cells"][("c", "ft")]
    store = ran["store"]
    cid = weights_identity(cell, make_adapter(cell.dataset_config)).cell_id
    held = store.lease(record_keys.grid_point_work_key(cid, 0))
    assert held.acquire(wait=False)
    args = json.dumps([ran["cfg"].store, to_plain(cell), 0, to_plain(ran["cfg"].extract)])
    child = subprocess.Popen([sys.executable, "-c", _POINT_SCRIPT, args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO)
    try:
        seen = []
        for line in child.stderr:  # until the child says it waits on the lease (it blocks there)
            seen.append(line)
            if "is training in another run: waiting for it" in line:
                break
        else:
            raise AssertionError("the child never waited on the point's lease:\n" + "".join(seen[-30:]))
        held.release()
        here = grid_point(store, cell, 0, ran["cfg"].extract)
        out, err = child.communicate(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
    status, resumed, reason = json.loads(out.strip().splitlines()[-1])
    assert status == "done" and reason is None, err[-3000:]
    assert sorted([resumed, here["result"]["resumed_from_step"]], key=lambda r: r is not None) == [None, FT["steps"]]
