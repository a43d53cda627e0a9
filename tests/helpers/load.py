"""The many-cells load: a config of N cheap cells, its features made beforehand, one
measured run. Shared by tests/load and benchmarks/bench_load.py (which prints the figures)."""

from __future__ import annotations

import time
from pathlib import Path

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
    from jobs.run.plan import extraction_units, run_extract_unit

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
