"""Memory of `repeval serve` run over run: does the serving process grow?

Starts `repeval serve` (its own local Prefect server) on a folder-only config scanned every
``--interval`` seconds: one checkpoint at first, and a new one every ``--every`` runs, so
some scheduled runs extract and evaluate (a flow run in a process of its own, with its
Dask cluster) while most find nothing new, as a night of one-minute scans would. After each
finished scan it samples the resident memory of the serve process, of the Prefect server
it started, and of the whole process tree. Prints one row per run and the growth between
the first and the last quarter of the runs, in MiB and per run.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_serve_memory.py [--runs 60] [--interval 5]``
(60 runs of 5 s stand in for an hour of one-minute runs: memory depends on the number of
runs, not on the time between them).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine_line  # noqa: E402


def _checkpoint(folder: Path, name: str, seed: int) -> None:
    import timm
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = timm.create_model("resnet18", pretrained=False, num_classes=0)
    tmp = folder / f".{name}.partial"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    os.replace(tmp, folder / f"{name}.safetensors")  # complete when it appears (the documented convention)


def _config(root: Path) -> Path:
    import yaml

    raw = {"store": str(root / "store"), "dask": {"n_workers": 1, "processes": False},
           "extract": {"batch_size": 32},
           "checkpoints": [{"path": str(root / "ck"), "arch": "resnet18", "input_size": 32, "settle_seconds": 0}],
           "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 20, "test": 10}}}],
           "protocols": [{"name": "knn20", "protocol": "knn"}],
           "report": {"path": str(root / "report.html")}}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _finished_scans(api: str) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    final = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
        any_=[StateType.COMPLETED, StateType.FAILED, StateType.CRASHED])))
    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        return client.count_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["repeval-scan-checkpoints"])),
                                      flow_run_filter=final)


def main() -> int:
    import psutil

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--every", type=int, default=10, help="a new checkpoint every so many runs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="repeval-bench-serve-"))
    _checkpoint(root / "ck", "ep000", 0)
    env = dict(os.environ, REPEVAL_HOME=str(root / "home"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="1", PREFECT_RUNNER_POLL_FREQUENCY="1")
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_HOME", None)
    log = root / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", str(_config(root)), "--interval",
                             str(args.interval), "--watch-interval", "3600"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log, "wb"), start_new_session=True)
    print(machine_line())
    try:
        deadline = time.monotonic() + 300
        while not (m := re.search(r"run history: (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        api = m.group(1) + "/api"
        serve = psutil.Process(proc.pid)
        print("| run | serve MiB | server MiB | tree MiB | new checkpoint |")
        print("|---|---|---|---|---|")
        rows, seen, added = [], 0, 0
        while len(rows) < args.runs:
            done = _finished_scans(api)
            if done <= seen:
                time.sleep(0.5)
                continue
            seen = done
            children = serve.children(recursive=True)
            server = [c for c in children if "server" in " ".join(c.cmdline())]
            rss = serve.memory_info().rss / 2**20
            srv = sum(c.memory_info().rss for c in server) / 2**20
            tree = rss + sum(c.memory_info().rss for c in children) / 2**20
            new = ""
            if seen % args.every == 0:
                added += 1
                _checkpoint(root / "ck", f"ep{added:03d}", added)
                new = f"ep{added:03d}"
            rows.append((rss, srv, tree))
            print(f"| {seen} | {rss:.0f} | {srv:.0f} | {tree:.0f} | {new} |", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    q = max(1, len(rows) // 4)
    for i, name in enumerate(("serve process", "Prefect server")):
        first, last = statistics.median(r[i] for r in rows[:q]), statistics.median(r[i] for r in rows[-q:])
        print(f"{name}: median {first:.0f} MiB over the first {q} runs, {last:.0f} MiB over the last {q}: "
              f"{last - first:+.0f} MiB ({(last - first) / max(len(rows) - q, 1):+.2f} MiB per run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
