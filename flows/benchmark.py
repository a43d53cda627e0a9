"""The benchmark flow: extract what is missing, evaluate what is missing, correlate, report.

Extraction is one task per (encoder, dataset split); evaluation one task per group of
at most ``dask.cells_per_task`` cells of one (encoder, dataset), each waiting only for
the extractions it reads (grouping amortises the per-task cost of Prefect and Dask);
the correlation and report come last. Everything runs on Dask through prefect-dask.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any

import dask
from prefect import flow
from prefect.futures import wait

from flows.tasks import correlate_and_report_task, evaluate_task, extract_task
from jobs.config import BenchmarkConfig, load_config
from jobs.plan import check_plan, evaluation_cells, extraction_units

log = logging.getLogger("repeval")


def _progress(kind: str, done: int, total: int, started: float, extra: str = "") -> None:
    rate = done / max(time.perf_counter() - started, 1e-9)
    line = f"{kind}: {done}/{total} done ({rate:.1f}/s){extra}"
    if sys.stderr.isatty():  # one updating line on a terminal, one line per step in logs
        print(f"\r{line}   ", end="\n" if done == total else "", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


@flow(name="repeval-benchmark", log_prints=False, validate_parameters=False)
def benchmark_flow(config: dict[str, Any], gpu_resources: bool = False) -> dict[str, Any]:
    cfg = load_config(config)
    check_plan(cfg)
    units = extraction_units(cfg)
    cells = evaluation_cells(cfg)
    started = time.perf_counter()

    gpu = dask.annotate(resources={"GPU": 1}) if gpu_resources else contextlib.nullcontext()
    extract_futures = {}
    with gpu:
        for i, unit in enumerate(units):
            extract_futures[(unit.encoder.name, unit.dataset.name)] = extract_futures.get(
                (unit.encoder.name, unit.dataset.name), []) + [
                extract_task.with_options(task_run_name=f"extract {unit.label()}").submit(config, i)]
    eval_futures = [
        evaluate_task.with_options(task_run_name=f"evaluate {label}").submit(
            config, indices, wait_for=extract_futures[group])
        for group, indices, label in _cell_batches(cells, cfg.dask.cells_per_task)
    ]

    extractions = []
    all_extract = [f for fs in extract_futures.values() for f in fs]
    for n, fut in enumerate(_as_completed(all_extract), 1):
        extractions.append(fut.result())
        images = sum(r["images"] for r in extractions)
        rate = images / max(time.perf_counter() - started, 1e-9)
        _progress("extract", n, len(all_extract), started, f", {images} images, {rate:.0f} images/s")
    outcomes = []
    for fut in _as_completed(eval_futures):
        outcomes.extend(fut.result())
        _progress("evaluate", len(outcomes), len(cells), started)
    wait(eval_futures)
    final = correlate_and_report_task(config, outcomes)
    return {
        "units": len(units), "cells": len(cells),
        "extracted": sum(r["status"] in ("extracted", "resumed") for r in extractions),
        "forward_batches": sum(r["forward_batches"] for r in extractions),
        "images": sum(r["images"] for r in extractions),
        "computed": sum(o["status"] == "computed" for o in outcomes),
        "cached": sum(o["status"] == "cached" for o in outcomes),
        "failed": [o for o in outcomes if o["status"] == "failed"],
        "extractions": extractions, "outcomes": outcomes,
        "report": final["report"], "correlation": final["correlation"],
        "seconds": time.perf_counter() - started,
    }


def _cell_batches(cells, per_task: int):
    """(encoder, dataset) groups of cell indices, split into near-equal tasks of at most
    ``per_task`` cells: one task reads the group's features, and never waits on others'."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, cell in enumerate(cells):
        groups.setdefault((cell.model, cell.dataset), []).append(i)
    for group, indices in groups.items():
        n_tasks = -(-len(indices) // per_task)
        for k in range(n_tasks):
            part = indices[k::n_tasks]
            settings = sorted({cells[i].setting for i in part})
            label = f"{group[0]}/{group[1]}:{','.join(settings)[:80]}"
            yield group, part, label


def _as_completed(futures):
    from prefect.futures import as_completed

    return as_completed(futures) if futures else []


def run_benchmark(cfg: BenchmarkConfig, dask_address: str | None = None) -> dict[str, Any]:
    """Run the flow with embedded defaults (or the given scheduler) and return its summary."""
    from flows.runtime import gpu_count, prefect_api, task_runner
    from jobs.checkpoint_scan import with_scanned_checkpoints

    cfg = with_scanned_checkpoints(cfg)  # new checkpoints in scanned folders become encoders
    check_plan(cfg)
    config = cfg.to_dict()  # paths already resolved: means the same on every worker
    address = dask_address or cfg.dask.address
    gpu = cfg.dask.gpu == "always" or (cfg.dask.gpu == "auto" and (gpu_count() > 0))
    with prefect_api():
        runner = task_runner(address, cfg.dask.n_workers, cfg.dask.threads_per_worker, cfg.dask.processes, gpu)
        return benchmark_flow.with_options(task_runner=runner)(config, gpu_resources=gpu)
