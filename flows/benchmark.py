"""The benchmark flow: extract what is missing, evaluate what is missing, correlate, report."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import dask
from prefect import flow, get_run_logger
from prefect.states import Failed

from flows.alerts import emit_run_events, run_payload
from flows.cluster_memory import cluster_memory, local_memory, local_worker_limit
from flows.early import finish_early, run_early
from flows.reclaim import reclaim_quietly
from flows.runtime import (
    flush_run_logs, gpu_count, local_workers, math_threads, prefect_api, task_runner, worker_math_threads,
)
from flows.tasks import collect_cells, correlate_and_report_task, extract_task, open_store, submit_cells
from jobs.early.lines import check_lines
from jobs.evaluation.cell_memory import check_cells_fit
from jobs.run.failures import correlation_failure, extraction_failure, sync_failures
from jobs.run.plan import Plan, make_plan
from jobs.run.plan_store import read_plan, write_plan
from jobs.report.run_summary import build_summary, failure_message, summary_lines, summary_table
from jobs.report.trackers import log_to_trackers
from pipeline.plain import to_plain
from pipeline.terminal import say

log = logging.getLogger("repeval")


def _progress(reason: str, kind: str, done: int, total: int, started: float, extra: str = "") -> None:
    rate = done / max(time.perf_counter() - started, 1e-9)
    say(reason, f"{kind}: {done}/{total} done ({rate:.1f}/s){extra}")


@flow(name="repeval-benchmark", log_prints=False, validate_parameters=False)
def benchmark_flow(store: dict[str, Any], plan: str, gpu_resources: bool = False, reason: str = "run",
                   declare_memory: bool = False, early: bool = False):
    """``store``: the run's store as plain values (``url``, ``storage_options``); ``plan``:
    the key of the run's plan in it (``jobs.run.plan_store.write_plan``); ``declare_memory``:
    the workers declare a ``MEMORY`` resource (each evaluation task asks for its largest
    cell's); ``early``: the new encoders' early pass first (``flows.early``). Returns the
    summary, in a Failed state if anything failed."""
    run = read_plan(open_store(store), plan)
    cfg, units, cells, notes = run.config, run.units, run.cells, run.notes
    extract = to_plain(cfg.extract)
    started = time.perf_counter()
    # estimates first, published before the full extraction starts (which copies the early rows)
    phase = run_early(store, run, {u.encoder.name: u.weights_signature for u in units}, reason,
                      gpu_resources) if early else None

    gpu = dask.annotate(resources={"GPU": 1}) if gpu_resources else contextlib.nullcontext()
    extract_futures: dict[tuple[str, str], list] = {}
    unit_of = {}
    with gpu:
        for unit in units:
            fut = extract_task.with_options(task_run_name=f"extract {unit.label()}").submit(
                store, to_plain(unit), extract)
            extract_futures.setdefault((unit.encoder.name, unit.dataset.name), []).append(fut)
            unit_of[id(fut)] = unit
    submitted = submit_cells(cells, store, extract, extractions=extract_futures, gpu_resources=gpu_resources,
                             cells_per_task=cfg.dask.cells_per_task,
                             cell_memory=run.cell_memory if declare_memory else None)

    extractions = []
    all_extract = [f for fs in extract_futures.values() for f in fs]
    for n, fut in enumerate(_as_completed(all_extract), 1):
        extractions.append(_extraction_outcome(fut, unit_of[id(fut)]))
        images = sum(int(r.get("images") or 0) for r in extractions)
        rate = images / max(time.perf_counter() - started, 1e-9)
        _progress(reason, "extract", n, len(all_extract), started, f", {images} images, {rate:.0f} images/s")
    failed_units = {(r.get("model"), r.get("dataset")): r for r in extractions if r.get("status") == "failed"}
    outcomes = collect_cells(submitted, failed_units,
                             lambda done: _progress(reason, "evaluate", done, len(cells), started))

    st = cfg.open_store()
    scanned = {name: tuple(sig) for name, sig in (notes.get("scanned") or {}).items()}
    failures = list(notes.get("checkpoint_failures") or [])
    failures += sync_failures(st, extractions=extractions, cells=outcomes, scanned=scanned)
    early_out = finish_early(run, phase)  # each estimate against its exact figure, before the report reads them
    for line in check_lines(early_out):
        say(reason, line)
    # the records are in the ledger: a tracker that cannot log is one warning (logged where it
    # happens), never a lost record; before the report, so the report and its summary say so
    tracked = log_to_trackers(st, cfg, outcomes)
    for t in tracked:
        if not t["error"]:
            say(reason, f"{t['kind']} tracker {t['where']}: {t['logged']} new score(s) logged")
    report, correlation, final = None, None, None
    try:
        final = correlate_and_report_task(cfg, [o for o in outcomes if o.get("cell_id")],
                                          list(notes.get("waiting") or []), trackers=tracked)
        report, correlation = final["report"], final["correlation"]
        sync_failures(st, report_path=cfg.report.path)
        failures += list(final.get("correlation_failures") or [])  # settings that could not be computed
    except Exception as exc:  # noqa: BLE001  the run's results stay in the ledger; say what failed
        failures += sync_failures(st, correlation=correlation_failure(cfg.report.path, exc))
    # always `evaluated`, and `regressed` when a series' newest checkpoint got worse: for automations
    emitted = emit_run_events(run_payload(final, outcomes, failures, cfg.report.path), cfg.report.path)
    summary = build_summary(
        reason=reason, units=len(units), cells=len(cells), extractions=extractions, outcomes=outcomes,
        failures=failures, report=report, correlation=correlation, started=started,
        new_encoders=notes.get("new_encoders") or (), waiting=notes.get("waiting") or (),
        skipped_checkpoints=notes.get("skipped") or (), data_notes=notes.get("data_notes") or (),
        scan_notes=notes.get("scan_notes") or ())
    summary["events"] = emitted
    summary["trackers"] = tracked
    summary["flow_run_id"] = _flow_run_id()  # which Prefect run this summary is the summary of
    summary["regressions"] = list((final or {}).get("summary", {}).get("regressions") or [])
    summary["improvements"] = list((final or {}).get("summary", {}).get("improvements") or [])
    summary["warnings"] = list((final or {}).get("summary", {}).get("warnings") or [])  # records with fit warnings
    summary["summary_path"] = (final or {}).get("summary_path")
    if early_out is not None:
        summary["early"] = early_out
    publish_summary(summary)
    message = failure_message(summary)
    return Failed(message=message, data=summary) if message else summary


def publish_summary(summary: dict[str, Any]) -> None:
    """The summary in the terminal, in Prefect's run log and as a table artifact."""
    from prefect.artifacts import create_table_artifact

    lines = summary_lines(summary)
    for line in lines:
        say(summary["reason"], line)
    if logging.getLogger("prefect.flow_runs").getEffectiveLevel() > logging.INFO:
        # Prefect was set up before prepare_environment (a notebook, a test): the summary is
        # still kept with the run (what the console prints is decided by its handler's level)
        logging.getLogger("prefect.flow_runs").setLevel(logging.INFO)
    logger = get_run_logger()
    for line in lines:
        logger.info(line)
    create_table_artifact(table=summary_table(summary), key="repeval-run-summary",
                          description=f"repeval run ({summary['reason']}): " + lines[0])


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return str(run_id) if run_id else None


def _extraction_outcome(fut, unit) -> dict[str, Any]:
    try:
        return fut.result()
    except Exception as exc:  # noqa: BLE001  an I/O failure after its retries: this unit failed
        return extraction_failure(unit.encoder.name, unit.dataset.name, unit.split, unit.encoder.weights, exc,
                                  unit.encoder.arch)


def _as_completed(futures):
    from prefect.futures import as_completed

    return as_completed(futures) if futures else []


def run_plan(plan: Plan, *, dask_address: str | None = None, reason: str = "run",
             new_encoders: list[str] | None = None, early: bool | None = None) -> dict[str, Any]:
    """Run a plan's flow (on this process's Prefect API and a Dask cluster); its summary.
    ``early``: run the early pass (default: the config's ``early.enabled``)."""
    cfg = plan.config
    early = cfg.early.enabled if early is None else bool(early)
    address = dask_address or cfg.dask.address
    gpu = cfg.dask.gpu == "always" or (cfg.dask.gpu == "auto" and (gpu_count() > 0))
    workers = local_workers(cfg.dask.n_workers)
    memory = cluster_memory(address) if address else local_memory(cfg.dask, workers)
    check_cells_fit(plan.cell_memory, memory.capacities, memory.where)  # before anything runs
    limit = None if address else local_worker_limit(cfg.dask, workers)
    runner = task_runner(address, cfg.dask.n_workers, cfg.dask.threads_per_worker, cfg.dask.processes, gpu, limit)
    # the embedded cluster starts with the flow: its worker processes inherit these threads
    threads = math_threads(cfg.dask.math_threads, workers, cfg.dask.threads_per_worker)
    key = write_plan(cfg.open_store(), plan, new_encoders)  # made once: the flow reads it back by its key
    try:
        with worker_math_threads(threads):
            state = benchmark_flow.with_options(task_runner=runner)(
                {"url": cfg.store, "storage_options": cfg.storage_options}, key, gpu_resources=gpu, reason=reason,
                declare_memory=memory.declared, early=early, return_state=True)
    finally:
        flush_run_logs()  # the summary lines are stored with the run before anyone reads them
    result = state.result(raise_on_failure=False)
    if isinstance(result, BaseException):  # the flow itself crashed: not a summary
        raise result
    return result


def run_here(plan: Plan, *, config_path: str | None = None, **kwargs) -> dict[str, Any]:
    """``run_plan`` on this process's Prefect API (a temporary local one unless one is
    configured); the scheduled runs of ``config_path`` a killed `repeval serve` left behind
    are reclaimed on the way (``flows.reclaim``)."""
    with prefect_api():
        if config_path:
            reclaim_quietly(config_path, lambda line: say("run", line))
        return run_plan(plan, **kwargs)


def run_benchmark(cfg, dask_address: str | None = None, *, retry_failed: bool = False,
                  plan: Plan | None = None, config_path: str | None = None, early: bool | None = None) -> dict[str, Any]:
    """Plan (scan, check: before anything starts), then run the flow with embedded defaults
    and return its summary (``jobs.run.spine.Run.go`` also answers an unchanged rerun from
    the ledger and notes what the run covered). ``early``: the early pass (default: the
    config's ``early.enabled``)."""
    plan = plan or make_plan(cfg, retry_failed=retry_failed)
    return run_here(plan, config_path=config_path, dask_address=dask_address, early=early)
