"""Orchestration overhead of the benchmark flow on a run that only evaluates.

A config of 9 cheap cells (3 encoders x 1 tiny textures dataset x 3 protocol settings:
k-NN, ridge, few-shot) whose features are already in the store, run three ways:

(a) embedded: ``flows.benchmark.run_benchmark``, the default of ``repeval run``: one
    temporary local Prefect API, exported to the Dask workers via PREFECT_API_URL, and a
    Dask LocalCluster (2 worker processes, 1 thread each: the config's defaults);
(b) naive: the same flow with prefect-dask's ``DaskTaskRunner`` on the same LocalCluster
    settings, but without ``flows.runtime.prefect_api()`` and with PREFECT_API_URL unset,
    so the flow's process and every Dask worker process each start a temporary Prefect
    server of their own;
(c) direct: the same jobs called in a loop in one process, no Prefect, no Dask: every
    extraction unit (finds its arrays complete, as in the flow), every evaluation cell,
    then the correlation and report, i.e. exactly the work of the flow's tasks.

Why it is fair: the work is identical (same config, same store contents, same jobs; the
extraction units load each encoder and find the features complete in all three), and
every evaluation really recomputes: each run gets its own copy of a store that holds the
features but no ``_repeval/ledger``; the run is checked to report 9 computed cells. Each
run is a fresh subprocess with its own fresh PREFECT_HOME,
PREFECT_SERVER_ANALYTICS_ENABLED=false, PREFECT_LOGGING_LEVEL=WARNING and no
PREFECT_API_URL, so no state or server carries over between runs. The variants are
interleaved (a, b, c, b, c, a, ...) and the medians reported.

Two times per run: end to end (the subprocess, from exec to exit: interpreter start,
imports, server start and shutdown, cluster start and shutdown, the work), and in-call
(just the call that runs the flow, or the direct loop, measured inside the subprocess).
Overhead per cell = (time of the variant - time of (c)) / cells; most of it is a fixed
cost (API and cluster start, teardown), so a phase table splits the end-to-end time at
the flow's progress lines (first extraction task done, last cell done) and gives the
marginal per-cell overhead of the task phase separately. For (a) the start of the
temporary API is timed around ``flows.runtime.temporary_server`` (the same server the run uses).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_orchestration.py [--quick] [--markdown]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine_line, median, print_tables  # noqa: E402

VARIANTS = {
    "embedded": "(a) embedded: run_benchmark, one local API exported to the workers",
    "naive": "(b) naive: DaskTaskRunner, no PREFECT_API_URL, a temporary server per process",
    "direct": "(c) direct: jobs in a loop, no Prefect, no Dask",
}
ENCODERS = [
    {"name": "r18a", "arch": "resnet18", "input_size": 32, "seed": 0},
    {"name": "r18b", "arch": "resnet18", "input_size": 32, "seed": 1},
    {"name": "mnv3", "arch": "mobilenetv3_small_050", "input_size": 32, "seed": 0},
]


def make_config(root: Path, store: Path, n_encoders: int, n_workers: int = 2) -> dict:
    return {
        "store": str(store),
        "dask": {"n_workers": n_workers, "threads_per_worker": 1, "processes": True},
        "extract": {"batch_size": 32, "chunk_batches": 2},
        "encoders": ENCODERS[:n_encoders],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 40, "test": 20}}}],
        "protocols": [
            {"name": "knn20", "protocol": "knn"},
            {"name": "ridge", "protocol": "ridge"},
            {"name": "few", "protocol": "fewshot", "settings": {"n_way": 4, "n_shot": 5, "n_episodes": 50}},
        ],
        "reference": {"scores": {"r18a": 0.3, "r18b": 0.5, "mnv3": 0.7}},
        "correlation": {"settings": [{"name": "knn", "protocol": "knn20", "datasets": ["tex"]}],
                        "bootstrap": 200},
        "report": {"path": str(root / "report" / "report.html"), "baseline": "r18a"},
    }


# -- child: one run in a fresh process -----------------------------------------------------
def child(variant: str, config_path: str) -> None:
    started = time.perf_counter()
    server: dict[str, float] = {}
    if variant == "embedded":
        import flows.runtime

        flows.runtime.prepare_environment()  # before Prefect is imported
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.benchmark import run_benchmark
        from jobs.config import load_config

        # time the start and stop of the one temporary API; run_benchmark then reports to it
        cfg = load_config(config_path)
        t0 = time.perf_counter()
        t = time.perf_counter()
        with flows.runtime.temporary_server() as url, temporary_settings(updates={PREFECT_API_URL: url}):
            server["start"] = time.perf_counter() - t
            summary = run_benchmark(cfg)
            t = time.perf_counter()
        server["stop"] = time.perf_counter() - t
        computed, cells = summary["computed"], summary["cells"]
    elif variant == "naive":
        from prefect_dask import DaskTaskRunner

        from flows.benchmark import benchmark_flow
        from jobs.config import load_config
        from jobs.run.plan import make_plan
        from jobs.run.plan_store import write_plan

        cfg = load_config(config_path)
        t0 = time.perf_counter()
        runner = DaskTaskRunner(cluster_class="distributed.LocalCluster",
                                cluster_kwargs={"n_workers": cfg.dask.n_workers,
                                                "threads_per_worker": cfg.dask.threads_per_worker,
                                                "processes": cfg.dask.processes, "dashboard_address": ":0"})
        key = write_plan(cfg.open_store(), make_plan(cfg))
        summary = benchmark_flow.with_options(task_runner=runner)(
            {"url": cfg.store, "storage_options": cfg.storage_options}, key, gpu_resources=False)
        computed, cells = summary["computed"], summary["cells"]
    else:
        from jobs.config import load_config
        from jobs.evaluation.evaluate import evaluate_cell
        from jobs.run.plan import evaluation_cells, extraction_units, run_extract_unit
        from jobs.report.inputs import correlate_and_report
        from storage_schema import FeatureStore

        cfg = load_config(config_path)
        t0 = time.perf_counter()
        store = FeatureStore(cfg.store)
        units, cells_ = extraction_units(cfg), evaluation_cells(cfg)
        for i, unit in enumerate(units, 1):
            report = run_extract_unit(store, unit, cfg)
            assert report.status == "cached", report.status
            print(f"extract: {i}/{len(units)} done", file=sys.stderr, flush=True)  # the flow's progress lines
        outcomes = []
        for i, cell in enumerate(cells_, 1):
            outcomes.append((evaluate_cell(store, cell), cell))
            print(f"evaluate: {i}/{len(cells_)} done", file=sys.stderr, flush=True)
        correlate_and_report(store, cfg, [{"cell_id": o.cell_id, "model": c.model, "dataset": c.dataset,
                                           "layer": c.layer, "setting": c.setting} for o, c in outcomes])
        computed, cells = sum(o.status == "computed" for o, _ in outcomes), len(outcomes)
    t1 = time.perf_counter()
    print(json.dumps({"variant": variant, "in_call": t1 - t0, "before_call": t0 - started,
                      "computed": computed, "cells": cells, "server_start": server.get("start"),
                      "server_stop": server.get("stop")}))


# -- parent ------------------------------------------------------------------------------------
def build_base_store(root: Path, n_encoders: int) -> Path:
    """Extract every unit of the config once, directly (not timed)."""
    from jobs.config import load_config
    from jobs.run.plan import extraction_units, run_extract_unit
    from storage_schema import FeatureStore

    base = root / "base-store"
    cfg = load_config(make_config(root, base, n_encoders))
    store = FeatureStore(cfg.store)
    for unit in extraction_units(cfg):
        run_extract_unit(store, unit, cfg)
    return base


def run_variant(variant: str, root: Path, base: Path, n_encoders: int, index: int, n_workers: int) -> dict:
    import yaml

    from storage_schema.keys import LEDGER

    run_dir = root / f"run-{index:02d}-{variant}"
    run_dir.mkdir()
    store = run_dir / "store"
    # features and labels, but no results ledger: every cell recomputes
    ledger = base / LEDGER
    shutil.copytree(base, store, ignore=lambda d, names: [ledger.name] if Path(d) == ledger.parent else [])
    assert not (store / LEDGER).exists()
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(run_dir, store, n_encoders, n_workers)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(run_dir / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="WARNING", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]))
    # stderr is read line by line as it arrives, to time the phases from the progress
    # lines ("extract: 1/6 done" ... "evaluate: 9/9 done") that the flow (and the direct
    # loop) print
    marks: dict[str, float] = {}
    tail: collections.deque[str] = collections.deque(maxlen=80)
    kills = 0
    stdout_path = run_dir / "stdout.txt"
    started = time.perf_counter()
    with open(stdout_path, "w") as stdout:
        proc = subprocess.Popen([sys.executable, __file__, "--child", variant, "--config", str(config_path)],
                                stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, cwd=run_dir)
        for line in proc.stderr:
            now = time.perf_counter() - started
            if line.startswith("extract: 1/"):
                marks.setdefault("first_task", now)
            done = re.match(r"evaluate: (\d+)/(\d+) done", line)
            if done and done.group(1) == done.group(2):
                marks["all_evaluated"] = now
            kills += "still alive after" in line
            tail.append(line)
        returncode = proc.wait()
    wall = time.perf_counter() - started
    if returncode != 0:
        raise RuntimeError(f"{variant} run failed (exit {returncode}):\n{''.join(tail)[-4000:]}")
    out = json.loads(stdout_path.read_text().strip().splitlines()[-1])
    if out["computed"] != out["cells"]:
        raise RuntimeError(f"{variant}: only {out['computed']} of {out['cells']} cells recomputed")
    out.update(wall=wall, killed_workers=kills, to_first_task=marks.get("first_task", float("nan")),
               tasks=marks.get("all_evaluated", float("nan")) - marks.get("first_task", float("nan")),
               after_last_cell=wall - marks.get("all_evaluated", float("nan")))
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke test: one encoder (3 cells), one Dask worker, one run of (a) and (c)")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    p.add_argument("--repeats", type=int, default=None, help="runs per variant (default 3; quick 1)")
    p.add_argument("--variants", nargs="+", choices=("embedded", "naive", "direct"), default=None,
                   help="default all three; quick: embedded and direct (naive alone takes about a minute)")
    p.add_argument("--child", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.config)
        return
    repeats = args.repeats or (1 if args.quick else 3)
    n_encoders = 1 if args.quick else 3
    n_workers = 1 if args.quick else 2
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="repeval-bench-orch-"))
    try:
        base = build_base_store(root, n_encoders)
        n_cells = 3 * n_encoders
        print(f"bench_orchestration ({'quick' if args.quick else 'full'}): {n_encoders} encoder(s) x 1 textures "
              f"dataset (160 train / 80 test images) x 3 protocol settings = {n_cells} cells, {n_workers} Dask "
              f"worker process(es) x 1 thread, features "
              f"pre-extracted, fresh ledger, fresh PREFECT_HOME, fresh subprocess per run; {repeats} "
              f"interleaved run(s) per variant; medians")
        print(f"machine: {machine_line()}")
        order = [v for v in ("embedded", "naive", "direct")
                 if v in (args.variants or (("embedded", "direct") if args.quick else VARIANTS))]
        if "direct" not in order:
            order.append("direct")  # the baseline of the overhead columns
        times: dict[str, list[dict]] = {v: [] for v in order}
        index = 0
        for r in range(repeats):
            for variant in order[r % len(order):] + order[:r % len(order)]:  # rotate the order each round
                index += 1
                out = run_variant(variant, root, base, n_encoders, index, n_workers)
                times[variant].append(out)
                print(f"  run {index}: {variant}: end to end {out['wall']:.1f} s, in-call {out['in_call']:.1f} s, "
                      f"{out['computed']}/{out['cells']} cells computed", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    wall = {v: median([o["wall"] for o in times[v]]) for v in order}
    call = {v: median([o["in_call"] for o in times[v]]) for v in order}
    rows = []
    for v in order:
        rows.append([VARIANTS[v], wall[v], call[v], f"{wall[v] / wall['direct']:.2f}x",
                     (wall[v] - wall["direct"]) / n_cells, (call[v] - call["direct"]) / n_cells])
    print_tables(f"Orchestration, {n_cells} evaluate cells (median of {repeats} run(s) each; seconds)",
                 ["variant", "end to end s", "in-call s", "end to end vs (c)",
                  "overhead per cell vs (c), end to end s", "overhead per cell vs (c), in-call s"],
                 rows, args.markdown)
    tasks = {v: median([o["tasks"] for o in times[v]]) for v in order}
    phase_rows = []
    for v in order:
        starts = [o["server_start"] for o in times[v] if o.get("server_start") is not None]
        phase_rows.append([
            VARIANTS[v].split(":")[0], median([o["before_call"] for o in times[v]]),
            median([o["to_first_task"] for o in times[v]]),
            median(starts) if starts else "-", tasks[v], (tasks[v] - tasks["direct"]) / n_cells,
            median([o["after_last_cell"] for o in times[v]]), sum(o["killed_workers"] for o in times[v])])
    print_tables("Where the end-to-end time goes (medians; seconds)",
                 ["variant", "process start -> call (imports, config)", "process start -> 1st extract task done",
                  "of which: temporary API start", "1st extract task -> last cell done",
                  "marginal overhead per cell vs (c)", "last cell -> exit (report, teardown)",
                  "Dask workers killed at close (all runs)"],
                 phase_rows, args.markdown)
    if "naive" in wall and "embedded" in wall:
        print(f"\nnaive / embedded, end to end: {wall['naive'] / wall['embedded']:.2f}x; "
              f"in-call: {call['naive'] / call['embedded']:.2f}x")
    print(f"total wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
