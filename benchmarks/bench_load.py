"""Orchestration overhead per cell of the real benchmark flow on many tiny evaluation cells.

A config of N cheap cells: 2 random-init resnet18 encoders (input 32) x 1 tiny textures
dataset (4 classes, 10 train / 5 test images per class) x 5 layers (pre_logits, block1..4)
x N/10 k-NN settings (n_neighbors x temperature). The features are extracted in this
process *before* the run, so the flow's extraction tasks only find them complete and the
run is (almost) all evaluation. The run goes through ``flows.benchmark.run_benchmark``:
embedded Prefect API (or the test harness's), a Dask LocalCluster with 2 worker processes.

Figures:
* ``run wall``: the call of run_benchmark (API start if none, cluster start, flow, teardown);
* ``flow wall``: the flow's own ``seconds`` (from submitting tasks to the report written);
* ``cell compute``: the sum over the run's ledger records of ``timings.read_s + fit_s``
  (the cells' own work, measured inside the task);
* ``overhead per cell`` = (flow wall - cell compute) / cells: what Prefect + Dask + the
  task wrapper (store open, cell identity) cost per cell. The two workers
  run cells in parallel, so this is a wall-clock figure, not CPU time.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_load.py [--cells 1000] [--profile]``.
``--profile`` also times the task wrapper's pieces (load_config, evaluation_cells,
open_store, cell_identity) in this process for the same config.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYERS = ["pre_logits", "block1", "block2", "block3", "block4"]
N_ENCODERS = 2
TEMPERATURES = [0.03, 0.05, 0.07, 0.1, 0.2]


def load_config_dict(root: Path, cells: int) -> dict:
    """A config with exactly ``cells`` cells (a multiple of 10: encoders x layers)."""
    per_layer = N_ENCODERS * len(LAYERS)
    if cells % per_layer:
        raise ValueError(f"cells must be a multiple of {per_layer}, got {cells}")
    settings = [{"n_neighbors": k, "temperature": t} for k in range(1, 41) for t in TEMPERATURES]
    n_settings = cells // per_layer
    if n_settings > len(settings):
        raise ValueError(f"at most {len(settings) * per_layer} cells")
    return {
        "store": str(root / "store"),
        "dask": {"n_workers": 2, "threads_per_worker": 1, "processes": True},
        "extract": {"batch_size": 40, "chunk_batches": 1},
        "encoders": [{"name": f"r18s{s}", "arch": "resnet18", "input_size": 32, "seed": s, "layers": LAYERS}
                     for s in range(N_ENCODERS)],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 10, "test": 5}}}],
        "protocols": [{"name": f"knn{i:03d}", "protocol": "knn", "settings": s, "layers": LAYERS}
                      for i, s in enumerate(settings[:n_settings])],
        "report": {"path": str(root / "report" / "report.html")},
    }


def prepare_features(cfg) -> float:
    """Extract every unit in this process (no Prefect); seconds taken."""
    from jobs.plan import extraction_units, run_extract_unit

    started = time.perf_counter()
    store = cfg.open_store()
    for unit in extraction_units(cfg):
        run_extract_unit(store, unit, cfg)
    return time.perf_counter() - started


def measure(cfg) -> dict:
    """Run the flow once on a store holding the features; the overhead figures."""
    from flows.benchmark import run_benchmark
    from storage_schema.ledger import Ledger

    started = time.perf_counter()
    summary = run_benchmark(cfg)
    run_wall = time.perf_counter() - started
    ids = {o["cell_id"] for o in summary["outcomes"] if o["status"] == "computed"}
    records = [r for r in Ledger(cfg.open_store(read_only=True)) if r["cell_id"] in ids]
    compute = sum(r["timings"]["read_s"] + r["timings"]["fit_s"] for r in records)
    cells = summary["cells"]
    return {
        "cells": cells, "computed": summary["computed"], "failed": len(summary["failed"]),
        "extracted": summary["extracted"], "run_wall_s": run_wall, "flow_wall_s": summary["seconds"],
        "cell_compute_s": compute, "overhead_per_cell_s": (summary["seconds"] - compute) / max(cells, 1),
    }


def profile_task_wrapper(cfg, repeats: int = 20) -> dict:
    """Per-call cost of what evaluate_task does besides the cell's own work."""
    from jobs.config import load_config
    from jobs.evaluate import cell_identity
    from jobs.plan import evaluation_cells

    config = cfg.to_dict()
    out = {}
    for name, fn in (
        ("load_config", lambda: load_config(config)),
        ("evaluation_cells", lambda: evaluation_cells(cfg)),
        ("open_store", lambda: cfg.open_store()),
        ("cell_identity", lambda: cell_identity(store, cells[0])),
    ):
        store, cells = cfg.open_store(), evaluation_cells(cfg)
        started = time.perf_counter()
        for _ in range(repeats):
            fn()
        out[name] = (time.perf_counter() - started) / repeats
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    from benchmarks._common import machine_line
    from jobs.config import load_config

    with tempfile.TemporaryDirectory(prefix="repeval-bench-load-") as tmp:
        cfg = load_config(load_config_dict(Path(tmp), args.cells))
        prep = prepare_features(cfg)
        if args.profile:
            for name, seconds in profile_task_wrapper(cfg).items():
                print(f"task wrapper: {name}: {1000 * seconds:.1f} ms per call")
        fig = measure(cfg)
    print(machine_line())
    print(f"features extracted beforehand in {prep:.1f} s (the flow found them complete: "
          f"{fig['extracted']} extracted)")
    print(f"cells {fig['cells']} (computed {fig['computed']}, failed {fig['failed']}); "
          f"run wall {fig['run_wall_s']:.1f} s, flow wall {fig['flow_wall_s']:.1f} s, "
          f"cell compute {fig['cell_compute_s']:.1f} s; "
          f"overhead per cell {1000 * fig['overhead_per_cell_s']:.0f} ms")


if __name__ == "__main__":
    main()
