"""Two labs' configs over ONE store at the same time, on S3 and on a local folder: full
`repeval run` subprocesses (one shared Prefect API, Dask, an HTML report each), `repeval
results` reading the S3 ledger back, then a search for the planted credentials in
everything that was written or logged."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import s3fs
import yaml

from flows.cli.main import main as cli_main
from jobs.config import load_config
from jobs.evaluation.identity import cell_identity
from jobs.run.plan import evaluation_cells
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.cli import REPO, cli_env
from tests.helpers.s3 import BUCKET, PLANTED_KEY_ID, PLANTED_SECRET

pytestmark = pytest.mark.slow  # every test here starts servers or runs several flows

SEEDS = {"r18a": 0, "r18b": 1, "r18c": 2}
# textures has 4 classes: 64 train and 32 test images, batches of 16 -> 6 batches per encoder
BATCHES_PER_ENCODER = 4 + 2


def _config(store: str, encoders: list[str], protocols: list[dict], report: Path) -> dict:
    return {
        "store": store,
        # one worker thread: tasks of one run go one at a time; the two runs overlap
        "dask": {"n_workers": 1, "threads_per_worker": 1, "processes": False},
        "extract": {"batch_size": 16, "chunk_batches": 1, "lease_ttl": 5},
        "encoders": [{"name": e, "arch": "resnet18", "input_size": 32, "seed": SEEDS[e]} for e in encoders],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 16, "test": 8}}}],
        "protocols": protocols,
        "report": {"path": str(report)},
    }


KNN = {"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}}
RIDGE = {"name": "ridge", "protocol": "ridge"}


def _write_configs(store: str, tmp: Path) -> list[Path]:
    """Both configs start with the shared encoder r18b, so they contend for it at once."""
    raws = {"a": _config(store, ["r18b", "r18a"], [KNN], tmp / "a" / "report.html"),
            "b": _config(store, ["r18b", "r18c"], [KNN, RIDGE], tmp / "b" / "report.html")}
    paths = []
    for name, raw in raws.items():
        (tmp / name).mkdir(parents=True)
        path = tmp / name / "config.yaml"
        path.write_text(yaml.safe_dump(raw))
        paths.append(path)
    return paths


def _env(prefect_api, home: Path) -> dict[str, str]:
    """The CLI's environment: the S3 endpoint and credentials come from os.environ (conftest)."""
    return {**cli_env(), "PREFECT_API_URL": prefect_api[0], "PREFECT_HOME": str(home),
            "PREFECT_LOGGING_LEVEL": "INFO"}


def _cli(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    out = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "flows.cli", "-v", *args], env=env, cwd=REPO,
                            stdout=out, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, log: Path) -> str:
    proc.wait(timeout=400)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


def _start_runs(configs: list[Path], prefect_api, tmp: Path) -> list[tuple[subprocess.Popen, Path]]:
    """Start `repeval run` on every config at once."""
    runs = []
    for c in configs:
        name = f"{c.parent.parent.name}-{c.parent.name}"
        log = tmp / f"run-{name}.log"
        runs.append((_cli(["run", str(c), "--json"], _env(prefect_api, tmp / f"home-{name}"), log), log))
    return runs


def _summaries(runs: list[tuple[subprocess.Popen, Path]]) -> list[dict]:
    """Wait for the runs; their JSON summaries."""
    out = []
    for proc, log in runs:
        text = _finish(proc, log)
        out.append(json.loads(next(line for line in reversed(text.splitlines()) if line.startswith("{"))))
    return out


def _check_shared(configs: list[Path], summaries: list[dict]) -> None:
    """Every shared array extracted once; every cell of either config recorded exactly once."""
    cfgs = [load_config(c) for c in configs]
    store = FeatureStore(cfgs[0].store, read_only=True)
    for s in summaries:
        print(f"run: extracted {s['extracted']} of {s['units']} units ({s['forward_batches']} batches), "
              f"computed {s['computed']} and found {s['cached']} of {s['cells']} cells in {s['seconds']:.1f} s")
        # an evaluation that met a partial array would have failed (IncompleteArrayError)
        assert s["failed"] == [] and s["computed"] + s["cached"] == s["cells"]
    assert sum(s["extracted"] for s in summaries) == 3 * 2  # r18a, r18b, r18c on train and test, once each
    assert sum(s["forward_batches"] for s in summaries) == 3 * BATCHES_PER_ENCODER
    assert all(st.complete for st in store.list_arrays()) and len(store.list_arrays()) == 2 + 3 * 2
    wanted = {cell_identity(store, cell)[0] for cfg in cfgs for cell in evaluation_cells(cfg)}
    records = list(Ledger(store))
    assert len(wanted) == 5  # a: r18b+r18a knn5; b: r18b+r18c knn5 and ridge; r18b knn5 is shared
    assert sorted(r["cell_id"] for r in records) == sorted(wanted)  # none lost, none twice


@pytest.fixture(scope="module")
def runs(s3_endpoint, prefect_api, tmp_path_factory):
    """Both configs on one S3 store and both on one local store: four `repeval run`s at once
    (the two stores are independent; starting all four keeps the cores busy). Then
    `repeval results` reads the S3 ledger back."""
    tmp = tmp_path_factory.mktemp("shared")
    on_s3 = _write_configs(f"s3://{BUCKET}/shared", tmp / "s3")
    local = _write_configs(str(tmp / "local" / "store"), tmp / "local")
    t0 = time.perf_counter()
    started = _start_runs(on_s3 + local, prefect_api, tmp)
    summaries = _summaries(started)
    t1 = time.perf_counter()
    # the runs wrote their reports; `repeval results` reads each config's records back from
    # the bucket (in this process: a CLI subprocess would spend its time importing torch)
    with open(tmp / "results.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        for i, config in enumerate(on_s3):
            assert cli_main(["results", "--config", str(config), "--format", "json",
                             "--output", str(tmp / f"results-{i}.json")]) == 0
    print(f"four concurrent runs (two per store): {t1 - t0:.1f} s; repeval results: {time.perf_counter() - t1:.1f} s")
    return tmp, {"s3": (on_s3, summaries[:2]), "local": (local, summaries[2:])}


def test_two_configs_share_one_s3_store(runs):
    _check_shared(*runs[1]["s3"])


def test_two_configs_share_one_local_store(runs):
    _check_shared(*runs[1]["local"])


def test_results_and_report_read_the_s3_ledger(runs):
    tmp = runs[0]
    a, b = (json.loads((tmp / f"results-{i}.json").read_text()) for i in (0, 1))
    assert sorted((r["model"], r["setting"]) for r in a) == [("r18a", "knn5"), ("r18b", "knn5")]  # config a's cells
    assert len(b) == 4 and {r["model"] for r in b} == {"r18b", "r18c"}
    assert len({r["cell_id"] for r in a + b}) == 5  # r18b's knn5 record is shared by both configs
    html = (tmp / "s3" / "b" / "report.html").read_text()
    assert "r18c" in html and "ridge" in html and f"s3://{BUCKET}/shared" in html


def test_planted_credentials_are_never_persisted_or_logged(runs, prefect_api):
    """The planted key id and secret reached every process (they read the bucket with them);
    they must appear in no object of the bucket, no log, no Prefect state and no report."""
    tmp = runs[0]
    env = _env(prefect_api, tmp)
    assert env["AWS_ACCESS_KEY_ID"] == PLANTED_KEY_ID and env["AWS_SECRET_ACCESS_KEY"] == PLANTED_SECRET
    planted = (PLANTED_KEY_ID.encode(), PLANTED_SECRET.encode())
    fs = s3fs.S3FileSystem(use_listings_cache=False)
    objects = fs.find(BUCKET)
    leaks = [o for o in objects if any(p in fs.cat_file(o) for p in planted)]
    files = [p for root in (tmp, prefect_api[1], Path(os.environ["PREFECT_HOME"]))
             for p in Path(root).rglob("*") if p.is_file()]
    leaks += [str(p) for p in files if any(s in p.read_bytes() for s in planted)]
    logs = [p for p in files if p.suffix == ".log"]
    print(f"searched {len(objects)} bucket objects and {len(files)} files ({len(logs)} logs, "
          f"{sum(p.stat().st_size for p in files) / 1e6:.1f} MB): {len(leaks)} hold a planted credential")
    assert len(objects) > 50 and len(logs) >= 3
    # Prefect keeps each run's parameters (the config) in its database: a credential in a
    # config would be found there
    databases = list(Path(prefect_api[1]).rglob("*.db*"))
    assert databases and any(f"s3://{BUCKET}/shared".encode() in p.read_bytes() for p in databases)
    assert any(p.name == "report.html" for p in files)
    assert leaks == []
