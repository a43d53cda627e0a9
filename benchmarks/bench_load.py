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

from tests.helpers.load import load_config_dict, measure, prepare_features  # noqa: E402


def profile_task_wrapper(cfg, repeats: int = 20) -> dict:
    """Per-call cost of what evaluate_task does besides the cell's own work."""
    from jobs.config import load_config
    from jobs.evaluation.identity import cell_identity
    from jobs.run.plan import evaluation_cells
    from pipeline.plain import to_plain

    config = to_plain(cfg)
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
