"""The flow on an existing Dask cluster: `dask scheduler` + two `dask worker` processes on
127.0.0.1, one declaring a GPU resource. Same ledger as the embedded run; extraction
tasks land on the GPU-resource worker."""

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
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.configs import tiny_config

BIN = Path(sys.executable).parent


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, DASK_DISTRIBUTED__WORKER__DAEMON="False")
    return subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.fixture
def cluster(tmp_path):
    sched_log = tmp_path / "scheduler.log"
    sched_file = tmp_path / "scheduler.json"  # the scheduler writes its address here
    procs = [_start([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--dashboard-address", ":0", "--scheduler-file", str(sched_file)], sched_log)]
    try:
        deadline = time.monotonic() + 90
        address = None
        while address is None and time.monotonic() < deadline:
            if sched_file.exists():
                try:
                    address = json.loads(sched_file.read_text())["address"]
                except (json.JSONDecodeError, KeyError):
                    pass  # still being written
            time.sleep(0.2)
        assert address, sched_log.read_text()
        common = ["--nthreads", "1", "--host", "127.0.0.1", "--dashboard-address", ":0", "--no-nanny"]
        procs.append(_start([str(BIN / "dask"), "worker", address, *common, "--name", "gpu-worker",
                             "--resources", "GPU=1"], tmp_path / "gpu-worker.log"))
        procs.append(_start([str(BIN / "dask"), "worker", address, *common, "--name", "cpu-worker"],
                            tmp_path / "cpu-worker.log"))
        from distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            workers = client.scheduler_info()["workers"]
            gpu = next(a for a, w in workers.items() if w.get("resources", {}).get("GPU"))
        yield address, gpu
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.mark.slow
def test_existing_cluster_gives_the_embedded_ledger_and_extracts_on_the_gpu_worker(
        tmp_path, cluster, prefect_harness):
    address, gpu_worker = cluster
    results = {}
    for mode in ("embedded", "cluster"):
        raw = tiny_config(tmp_path / mode)
        raw["encoders"] = raw["encoders"][:2]
        raw["protocols"] = raw["protocols"][:1]
        raw["dask"] = {"gpu": "always", "n_workers": 1, "processes": False}
        path = tmp_path / f"{mode}.yaml"
        path.write_text(yaml.safe_dump(raw))
        summary = run_benchmark(load_config(path), dask_address=address if mode == "cluster" else None)
        records = Ledger(FeatureStore(raw["store"], read_only=True)).to_frame()
        results[mode] = (summary, records)
    summary, records = results["cluster"]
    assert {r["worker"] for r in summary["extractions"]} == {gpu_worker}
    embedded = results["embedded"][1]
    columns = ["model", "dataset", "layer", "setting", "cell_id", "metric.score"]
    assert records[columns].equals(embedded[columns])  # same cells, same ids, same numbers
