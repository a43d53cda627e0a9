"""The flow on an existing Dask cluster: `dask scheduler` + two `dask worker` processes on
127.0.0.1, one declaring a GPU resource. Same ledger as the embedded run; extraction
tasks land on the GPU-resource worker."""

from __future__ import annotations

import os

import pytest
import yaml
from distributed import Client

from flows.benchmark import run_benchmark
from jobs.config import load_config
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.configs import tiny_config
from tests.helpers.dask_cli import cli_cluster


@pytest.fixture
def cluster(tmp_path):
    """Two `dask worker` processes, one declaring a GPU; (scheduler address, the GPU worker's address)."""
    workers = {"gpu-worker": ["--resources", "GPU=1"], "cpu-worker": []}
    with cli_cluster(tmp_path, workers, dict(os.environ)) as (address, _):
        with Client(address, timeout=60) as client:
            infos = client.scheduler_info()["workers"]
        yield address, next(a for a, w in infos.items() if w.get("resources", {}).get("GPU"))


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
