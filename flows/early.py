"""The early pass inside the benchmark flow: before any full extraction, each new encoder
is judged from a part of each dataset (``jobs.early``), and what that says is published
at once; after the run, each estimate is checked against the exact figure that followed."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.alerts import emit_early_event
from flows.tasks import io_errors_only, open_store, worker_address
from jobs.config import BenchmarkConfig
from jobs.analysis.correlate import current_records
from jobs.config.typed import from_plain
from jobs.early.checks import check_estimates
from jobs.early.coverage import coverage_by_setting
from jobs.early.lines import early_ranks, early_summary, estimate_line, rank_line
from jobs.early.run import EarlyPlan, early_estimates, early_plan, early_unit
from jobs.evaluation.cell import Cell
from jobs.run.failures import is_transient, one_line
from jobs.run.plan import Plan
from pipeline.plain import to_plain
from pipeline.terminal import say
from storage_schema.early import EarlyRecords
from storage_schema.ledger import Ledger

__all__ = ["EarlyPhase", "early_estimates_task", "early_unit_task", "finish_early", "run_early"]

log = logging.getLogger("repeval")


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def early_unit_task(store: dict[str, Any], config: dict[str, Any], encoder: str, dataset: str,
                    cells: list[dict[str, Any]], signature: list[int] | None) -> dict[str, Any]:
    """The early rows of one (encoder, dataset) extracted and its early cells fitted; a
    failure is an outcome naming its reason."""
    cfg = from_plain(BenchmarkConfig, config, "config")
    enc = next(e for e in cfg.encoders if e.name == encoder)
    data = next(d for d in cfg.datasets if d.name == dataset)
    try:
        out = early_unit(open_store(store), enc, data, [from_plain(Cell, c, "cell") for c in cells], cfg.early,
                         cfg.extract, signature)
    except Exception as exc:  # noqa: BLE001  one unit's failure must not stop the others, nor the full run
        if is_transient(exc):
            raise
        return {"model": encoder, "dataset": dataset, "error": one_line(exc)}
    return {**out, "worker": worker_address()}


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def early_estimates_task(store: dict[str, Any], config: dict[str, Any], cells: list[dict[str, Any]],
                         units: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The estimates and early verdicts of one new encoder."""
    cfg = from_plain(BenchmarkConfig, config, "config")
    return early_estimates(open_store(store), cfg, [from_plain(Cell, c, "cell") for c in cells], units)


class EarlyPhase:
    """What the early pass of a run did: its plan, its estimates, how long it took, the
    images it passed through the encoders and what failed."""

    def __init__(self, plan: EarlyPlan, estimates: list[dict[str, Any]], seconds: float,
                 failed: list[dict[str, Any]], images: int = 0):
        self.plan, self.estimates, self.seconds, self.failed, self.images = plan, estimates, seconds, failed, images


def run_early(store: dict[str, Any], run: Plan, signatures: dict[str, list[int] | None], reason: str,
              gpu_resources: bool) -> EarlyPhase:
    """The early pass of ``run``'s new encoders, published before the full run starts."""
    import dask

    started = time.perf_counter()
    st = run.config.open_store()
    plan = early_plan(st, run)
    if not plan.units:
        say(reason, "early pass: no new encoder (every encoder's features are in the store)")
        return EarlyPhase(plan, [], 0.0, [])
    config = to_plain(run.config)
    say(reason, f"early pass: {len(plan.encoders)} new encoder(s), {run.config.early.fraction:.0%} of each split")
    gpu = dask.annotate(resources={"GPU": 1}) if gpu_resources else contextlib.nullcontext()
    futures: dict[str, list] = {}
    with gpu:
        for (encoder, dataset), cells in plan.units.items():
            futures.setdefault(encoder, []).append(early_unit_task.with_options(
                task_run_name=f"early {encoder}/{dataset}").submit(
                store, config, encoder, dataset, [to_plain(c) for c in cells], signatures.get(encoder)))
    estimates_futures = []
    for encoder, unit_futures in futures.items():
        cells = [c for (e, _), cs in plan.units.items() if e == encoder for c in cs]
        estimates_futures.append(early_estimates_task.with_options(task_run_name=f"early estimates {encoder}").submit(
            store, config, [to_plain(c) for c in cells], unit_futures))
    estimates, failed, images = [], [], 0
    for fut in estimates_futures:
        try:
            estimates.extend(fut.result())
        except Exception as exc:  # noqa: BLE001  the early pass never stops the full run
            failed.append({"error": one_line(exc)})
            say(reason, f"early pass failed: {one_line(exc)}")
    for fut in (f for fs in futures.values() for f in fs):
        try:
            unit = fut.result()  # done: its estimates task waited for it
        except Exception as exc:  # noqa: BLE001  an I/O failure after its retries: said, the full run goes on
            unit = {"model": "?", "dataset": "?", "error": one_line(exc)}
        if unit.get("error"):
            failed.append({"unit": f"{unit['model']}/{unit['dataset']}", "error": unit["error"]})
            say(reason, f"early pass of {unit['model']}/{unit['dataset']} failed: {unit['error']}")
        else:
            images += int(unit["extraction"]["images"])
    seconds = time.perf_counter() - started
    in_use, _ = current_records(list(Ledger(st)), run.config)
    publish_early(estimates, plan, reason, seconds, images, early_ranks(estimates, in_use))
    if estimates:  # for automations: the early verdicts within minutes, before the full extraction
        emit_early_event(estimates, run.config.report.path)
    return EarlyPhase(plan, estimates, seconds, failed, images)


def publish_early(estimates: list[dict[str, Any]], plan: EarlyPlan, reason: str, seconds: float,
                  images: int, ranks: list[dict[str, Any]] = ()) -> None:
    """The early lines in the terminal and the run's log, and a table artifact."""
    from prefect.artifacts import create_table_artifact

    lines = [estimate_line(rec) for rec in estimates]
    lines += [f"early {item['cell']}: {item['reason']}" for item in plan.left_out]
    lines += [rank_line(r) for r in ranks]
    lines.append(f"early pass done in {seconds:.0f} s ({images} images through the encoders): estimates, not exact "
                 "figures; the exact ones follow in this run")
    logger = get_run_logger()
    for line in lines:
        say(reason, line)
        logger.info(line)
    rows = [{"encoder": r["model"], "cell": f"{r['setting']}/{r['dataset']}/{r['layer']}",
             "early estimate": r["estimate"]["value"] if r.get("status") == "estimated" else None,
             "low": r["estimate"]["low"] if r.get("status") == "estimated" else None,
             "high": r["estimate"]["high"] if r.get("status") == "estimated" else None,
             "method": r["estimate"]["method"] if r.get("status") == "estimated" else r.get("status"),
             "verdicts": "; ".join(f"{v['kind']} {v['against']}: {v['verdict']}" for v in r.get("verdicts") or []),
             "note": r.get("how") or r.get("reason")} for r in estimates]
    if rows:
        create_table_artifact(table=rows, key="repeval-early-estimates",
                              description="Early estimates (not exact figures) of this run's new encoders")


def finish_early(run: Plan, phase: EarlyPhase | None) -> dict[str, Any] | None:
    """After the full run: this run's estimates checked against their exact figures, the
    coverage of every protocol setting, and the run summary's ``early`` part."""
    if phase is None:
        return None
    st = run.config.open_store()
    records = list(Ledger(st))
    checks = check_estimates(st, records, [r for r in phase.estimates if r.get("status") == "estimated"])
    coverage = coverage_by_setting(EarlyRecords(st).iter("checks"))
    in_use, _ = current_records(records, run.config)
    out = early_summary(phase.estimates, checks, coverage, phase.plan.left_out, in_use)
    out.update(seconds=phase.seconds, images=phase.images, failed=phase.failed, encoders=phase.plan.encoders)
    return out
