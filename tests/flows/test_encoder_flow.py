"""Encoder protocols through the real flow: Prefect (the session's test API), a real Dask
cluster, a real Zarr store and a random-init tiny timm model on CPU.

- On a cluster whose worker declares a ``GPU`` resource, every fine-tuning grid point, the
  selection/refit task and the saliency task ask for it (seen by the scheduler), the run
  records and reports them, and a second run takes them from the ledger.
- A real ``repeval run`` SIGKILLed while a grid point trains resumes from the point's last
  saved state on the next run, and records bitwise what an uninterrupted run records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flows.benchmark import run_benchmark
from jobs.config import load_config
from storage_schema import FeatureStore, keys
from storage_schema.ledger import Ledger
from tests.helpers.cli import REPO, cli_env, one_math_thread
from tests.helpers.html import parse_strict

TINY = {"arch": "test_resnet", "input_size": 32}


def _raw(tmp: Path, steps: int = 3, save_every: int = 2) -> dict:
    return {
        "store": str(tmp / "store"),
        "dask": {"n_workers": 1, "processes": False, "gpu": "never"},
        "extract": {"device": "cpu"},
        "encoders": [{"name": "a", **TINY}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 10, "test": 5}}}],
        "protocols": [
            {"name": "ft", "protocol": "finetune",
             "settings": {"steps": steps, "batch_size": 8, "lrs": [0.01, 0.05], "weight_decays": [0.0],
                          "augmentations": ["random_resized_crop_flip"], "save_every": save_every,
                          "num_workers": 0}},
            {"name": "sal", "protocol": "saliency", "settings": {"n_images": 4, "n_examples": 2}},
        ],
        "report": {"path": str(tmp / "report.html")},
    }


def _write(raw: dict, tmp: Path) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def gpu_cluster():
    """An in-process LocalCluster whose one worker declares ``GPU=1``, and the resource
    restrictions the scheduler saw per task key."""
    from distributed import LocalCluster
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Restrictions(SchedulerPlugin):
        def __init__(self, scheduler):
            self.scheduler, self.seen = scheduler, {}

        def transition(self, key, start, finish, *args, **kwargs):
            ts = self.scheduler.tasks.get(key)
            if ts is not None and finish == "processing":
                self.seen[str(key)] = dict(ts.resource_restrictions or {})

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, resources={"GPU": 1},
                      dashboard_address=":0") as cluster:
        plugin = Restrictions(cluster.scheduler)
        cluster.scheduler.add_plugin(plugin, name="restrictions")
        yield cluster.scheduler_address, plugin.seen


@pytest.mark.slow
def test_grid_points_ask_for_the_gpu_are_recorded_reported_and_cached(tmp_path, gpu_cluster, prefect_harness):
    address, seen = gpu_cluster
    raw = _raw(tmp_path)
    raw["dask"]["gpu"] = "always"
    cfg = load_config(_write(raw, tmp_path))
    summary = run_benchmark(cfg, dask_address=address)
    assert summary["units"] == 0 and summary["extracted"] == 0  # tex is read by encoder protocols only
    assert summary["cells"] == 2 and summary["computed"] == 2 and not summary["failures"]
    encoder_keys = {k: r for k, r in seen.items() if k.startswith(("finetune_point_task", "finetune_finish_task",
                                                                   "diagnostic_task"))}
    assert sum(k.startswith("finetune_point_task") for k in encoder_keys) == 2  # one task per grid point
    assert sum(k.startswith("finetune_finish_task") for k in encoder_keys) == 1
    assert encoder_keys and all(r == {"GPU": 1} for r in encoder_keys.values()), seen
    assert all(r == {} for k, r in seen.items() if k.startswith("correlate_and_report_task"))
    ft = next(o for o in summary["outcomes"] if o["setting"] == "ft")
    assert ft["point_workers"] and all(w == ft["worker"] for w in ft["point_workers"])

    store = FeatureStore(cfg.store, read_only=True)
    records = {r["setting"]: r for r in Ledger(store)}
    assert set(records) == {"ft", "sal"} and records["ft"]["gpu"]["device"] == "cpu"
    text = Path(summary["report"]).read_text()
    parse_strict(text)
    assert "validation scores per grid point: a on tex (ft)" in text and "saliency maps: a on tex (sal)" in text
    assert not any(store.backend.list(keys.SCRATCH + "/finetune"))  # states deleted once recorded

    again = run_benchmark(cfg, dask_address=address)
    assert again["computed"] == 0 and again["cached"] == 2


def _env() -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {**cli_env(), "PREFECT_API_URL": PREFECT_API_URL.value()}  # the session's API


def _run(config: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(config), "--json"], env=_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _finished(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def _comparable(rec: dict) -> dict:
    """A record without what may differ between two runs of the same cell: when and where it
    ran, how long it took, and from which step each training run started."""
    out = {k: v for k, v in rec.items() if k not in ("recorded", "timings", "gpu", "provenance")}
    out["diagnostics"] = {k: v for k, v in rec["diagnostics"].items() if k != "runs"}
    return out


@pytest.mark.slow
def test_a_run_killed_while_a_grid_point_trains_resumes_it_and_records_bitwise_the_same(
        tmp_path, prefect_harness):
    steps = 60
    victim_dir = tmp_path / "victim"
    victim = _write(_raw(victim_dir, steps=steps, save_every=5), victim_dir)
    run = _run(victim, start_new_session=True)
    scratch = victim_dir / "store" / keys.SCRATCH / "finetune"
    deadline = time.monotonic() + 300
    while run.poll() is None and time.monotonic() < deadline and not list(scratch.glob("*/select-*/state.pt")):
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)  # the run and everything it started, in the middle of training
    run.communicate(timeout=60)
    assert run.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    states = list(scratch.glob("*/select-*/state.pt"))
    assert states, "no training state was saved before the kill"
    victim_store = FeatureStore(str(victim_dir / "store"), read_only=True)
    assert not [r for r in Ledger(victim_store) if r["setting"] == "ft"]

    resume = _run(victim)
    try:
        # the uninterrupted run of the same config, in this process while the resuming one
        # starts up (the claim is about the resuming run; this one only has to be whole)
        reference = _write(_raw(tmp_path / "ref", steps=steps, save_every=5), tmp_path / "ref")
        with one_math_thread():  # as the CLI runs (OMP_NUM_THREADS=1)
            ref_summary = run_benchmark(load_config(reference))
        assert ref_summary["computed"] == 2 and not ref_summary["failures"]
        summary = _finished(resume)
    finally:
        if resume.poll() is None:
            resume.kill()
            resume.communicate()
    assert summary["cells"] == 2 and not summary["failures"]
    ref = {r["setting"]: r for r in Ledger(FeatureStore(str(tmp_path / "ref" / "store"), read_only=True))}
    got = {r["setting"]: r for r in Ledger(victim_store)}
    resumed = [r["resumed_from_step"] for r in got["ft"]["diagnostics"]["runs"]]
    assert any(step is not None and 0 < step < steps for step in resumed), resumed  # it did resume mid-run
    assert all(r["resumed_from_step"] is None for r in ref["ft"]["diagnostics"]["runs"])
    for setting in ("ft", "sal"):
        assert _comparable(got[setting]) == _comparable(ref[setting]), setting  # bitwise: floats compared exactly
    print(f"\nrepeval run SIGKILLed while fine-tuning ({len(states)} saved state(s)); the rerun resumed from steps "
          f"{resumed} and recorded the same cell {got['ft']['cell_id']} as an uninterrupted run")
