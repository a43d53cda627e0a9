"""Killing processes of a benchmark run: a Dask worker during evaluation, and the whole run.

The runs that are killed, or lose a worker, are real `repeval run` processes reporting to
the session's Prefect API; the rerun after a kill is the same run in this process (what it
computes is the claim, not how it starts; one interpreter and torch import fewer). The
ledger is judged from the store afterwards: one record per cell, every cell present, no
record torn (each parses, with its metrics), no cell twice.
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

from jobs.config import load_config
from jobs.evaluation.identity import cell_identity
from jobs.run.plan import evaluation_cells
from storage_schema import FeatureStore
from storage_schema.ledger import LEDGER, Ledger
from tests.helpers.cli import REPO, cli_env
from tests.helpers.dask_cli import cli_cluster


def _config(tmp: Path, episodes: int) -> Path:
    """2 encoders x 3 few-shot settings: 6 cells, each long enough to be caught running."""
    raw = {
        "store": str(tmp / "store"),
        "dask": {"n_workers": 2, "processes": False, "gpu": "never"},
        "extract": {"batch_size": 32, "chunk_batches": 2},
        "encoders": [{"name": f"r18{s}", "arch": "resnet18", "input_size": 32, "seed": s} for s in (0, 1)],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 40, "test": 20}}}],
        "protocols": [{"name": f"few{seed}", "protocol": "fewshot",
                       "settings": {"n_way": 4, "n_shot": 5, "n_episodes": episodes, "seed": seed}}
                      for seed in range(3)],
        "reference": {"scores": {"r18_0": 0.3, "r18_1": 0.5}},
        "report": {"path": str(tmp / "report.html")},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _run_command(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "run", str(config), "--json", *extra]


def _env() -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {**cli_env(), "PREFECT_API_URL": PREFECT_API_URL.value()}  # the session's API


def _summary(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _record_files(store: str) -> list[Path]:
    return sorted((Path(store) / LEDGER).glob("*/*.json"))


def _check_ledger(config: Path) -> int:
    """Every cell exactly once, every record whole; the number of records."""
    cfg = load_config(config)
    store = FeatureStore(cfg.store, read_only=True)
    expected = {cell_identity(store, cell)[0] for cell in evaluation_cells(cfg)}
    records = list(Ledger(store))
    ids = [r["cell_id"] for r in records]
    assert len(ids) == len(set(ids)), "a cell recorded twice"
    assert set(ids) == expected, "cells missing from the ledger, or records of cells not asked for"
    labels = [(r["model"], r["dataset"], r["layer"], r["setting"]) for r in records]
    assert len(labels) == len(set(labels)), "one cell under two ids"
    assert all(isinstance(r["metrics"]["score"], float) for r in records)
    assert len(_record_files(cfg.store)) == len(records)
    return len(records)


@pytest.fixture
def cluster(tmp_path):
    """`dask scheduler` + two `dask worker` processes on 127.0.0.1; yields (address, {name: Popen})."""
    with cli_cluster(tmp_path, {"w1": [], "w2": []}, cli_env()) as (address, procs):
        yield address, procs


def _executing(dask_worker) -> tuple[str, list[str]]:
    """(worker name, keys it runs now): the name from the worker itself, since the client's
    cached scheduler_info may not list a worker yet."""
    return str(dask_worker.name), [str(ts.key) for ts in dask_worker.state.executing]


@pytest.mark.slow
def test_sigkill_of_a_dask_worker_during_evaluation(tmp_path, cluster, prefect_harness):
    address, procs = cluster
    config = _config(tmp_path, episodes=3000)
    run = subprocess.Popen(_run_command(config, "--dask-address", address), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
    from distributed import Client

    victim, task = None, None
    with Client(address, timeout=60) as client:
        deadline = time.monotonic() + 240
        while victim is None and run.poll() is None and time.monotonic() < deadline:
            for name, keys in client.run(_executing).values():
                running = [k for k in keys if k.startswith("evaluate_task")]
                if running:
                    victim, task = name, running[0]
                    os.kill(procs[victim].pid, signal.SIGKILL)
                    break
            time.sleep(0.05)
    recorded_at_kill = len(_record_files(load_config(config).store))
    out, err = run.communicate(timeout=300)
    assert victim is not None, f"no evaluation task was caught running:\n{err[-3000:]}"
    assert procs[victim].wait(timeout=10) == -signal.SIGKILL
    summary = _summary(subprocess.CompletedProcess(run.args, run.returncode, out, err))
    records = _check_ledger(config)
    assert summary["cells"] == records == 6 and summary["computed"] + summary["cached"] == 6
    print(f"\nDask worker {victim} SIGKILLed while it ran {task.split('-')[0]} ({recorded_at_kill} of 6 cells "
          f"recorded then): the run completed ({summary['computed']} computed, {summary['cached']} cached); "
          f"the ledger holds {records} records for 6 cells, none twice, none torn")


@pytest.mark.slow
def test_sigkill_of_the_whole_run_then_rerun_computes_only_missing_cells(tmp_path, prefect_harness):
    config = _config(tmp_path, episodes=2000)
    store = load_config(config).store
    run = subprocess.Popen(_run_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=_env(), cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 240
    while run.poll() is None and time.monotonic() < deadline and not _record_files(store):
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)  # the run and every process it started
    assert run.wait(timeout=30) == -signal.SIGKILL, "the run finished before it could be killed"
    done = len(_record_files(store))
    assert 0 < done < 6
    from flows.benchmark import run_benchmark  # here: the Dask workers of the test above import this module

    rerun = run_benchmark(load_config(config))  # the rerun: `repeval run`'s planning and flow
    assert not rerun["failures"]  # what makes `repeval run` exit 0
    assert rerun["cells"] == 6 and rerun["computed"] == 6 - done and rerun["cached"] == done
    assert _check_ledger(config) == 6
    print(f"\nrepeval run SIGKILLed (process group) with {done} of 6 cells recorded: the rerun computed "
          f"{rerun['computed']} (the missing ones) and took {rerun['cached']} from the ledger; 6 records, "
          "none twice, none torn")


def _session_processes(sid: int) -> list:
    import psutil

    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    return found


def _running_helpers(sid: int) -> bool:
    """The run's Prefect server and both Dask worker processes are up."""
    import psutil

    lines = []
    for p in _session_processes(sid):
        try:
            lines.append(" ".join(p.cmdline()))
        except psutil.Error:  # ended meanwhile
            continue
    return any("uvicorn" in line for line in lines) and sum("spawn_main" in line for line in lines) >= 2


@pytest.mark.slow
def test_sigterm_of_a_run_stops_its_dask_workers_and_prefect_server(tmp_path):
    from flows.cli.main import EXIT_INTERRUPTED

    config = _config(tmp_path, episodes=3000)
    raw = yaml.safe_load(config.read_text())
    raw["dask"]["processes"] = True  # worker processes, and the run's own Prefect server
    config.write_text(yaml.safe_dump(raw))
    env = {**cli_env(), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    run = subprocess.Popen(_run_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while run.poll() is None and time.monotonic() < deadline and not _running_helpers(run.pid):
            time.sleep(0.1)
        assert run.poll() is None and _running_helpers(run.pid), "no worker processes and server caught running"
        run.send_signal(signal.SIGTERM)  # the run's process only, as a scheduler's timeout would
        _, err = run.communicate(timeout=120)
        assert run.returncode == EXIT_INTERRUPTED, err[-3000:]
        assert "repeval: interrupted" in err
        deadline = time.monotonic() + 30  # the workers' nannies may take a moment to go
        while _session_processes(run.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [" ".join(p.cmdline()[:4]) for p in _session_processes(run.pid)]
        assert not left, f"processes outlived the run: {left}"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for p in _session_processes(run.pid):
            p.kill()
