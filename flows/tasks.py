"""Prefect tasks: thin wrappers that rebuild their inputs from plain values and call a job,
and their submission, where each cell's registry entry decides how it runs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.cluster_memory import memory_request
from jobs.config.run import ExtractConfig
from jobs.config.typed import from_plain
from jobs.evaluation.cell import Cell
from jobs.evaluation.cell_memory import task_bytes
from jobs.evaluation.evaluate import evaluate_cells
from jobs.evaluation.weights import grid_finish, grid_point, weights_cell
from jobs.run.failures import cell_failure, extraction_failure, is_transient, one_line
from jobs.run.plan import ExtractUnit, run_extract_unit
from jobs.report.inputs import correlate_and_report
from pipeline.plain import to_plain
from storage_schema import FeatureStore

__all__ = ["Submitted", "collect_cells", "correlate_and_report_task", "diagnostic_task", "evaluate_task",
           "extract_task", "finetune_finish_task", "finetune_point_task", "io_errors_only", "open_store",
           "submit_cells", "worker_address"]


def io_errors_only(task, task_run, state) -> bool:
    """Retry transient I/O failures (network, object store, full queue), never bad input."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001  the state's own exception, judged below
        return is_transient(exc)
    return False


def open_store(store: Mapping[str, Any]):
    """The FeatureStore of ``store``'s plain values (``url``, ``storage_options``)."""
    return FeatureStore(store["url"], storage_options=store.get("storage_options") or None)


def worker_address() -> str | None:
    """The Dask worker this task ran on (which one held the GPU resource), if any."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


def _inputs(cell: dict[str, Any], extract: dict[str, Any]):
    return from_plain(Cell, cell, "cell"), from_plain(ExtractConfig, extract, "config.extract")


def _failed(cell, exc: BaseException) -> dict[str, Any]:
    return cell_failure(cell, one_line(exc), type(exc).__name__)


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def extract_task(store: dict[str, Any], unit: dict[str, Any], extract: dict[str, Any]) -> dict[str, Any]:
    """Extract one (encoder, dataset split); its failure is an outcome, not an exception."""
    u = from_plain(ExtractUnit, unit, "unit")
    try:
        report = run_extract_unit(open_store(store), u, from_plain(ExtractConfig, extract, "config.extract"))
    except Exception as exc:  # noqa: BLE001  one unit's failure must not stop the others
        if is_transient(exc):
            raise
        return extraction_failure(u.encoder.name, u.dataset.name, u.split, u.encoder.weights, exc, u.encoder.arch)
    out = to_plain(report)
    out.update(label=u.label(), weights=u.encoder.weights, worker=worker_address())
    return out


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def evaluate_task(store: dict[str, Any], cells: list[dict[str, Any]],
                  extractions: list[Any] = ()) -> list[dict[str, Any]]:
    """Evaluate some feature cells of one (encoder, dataset); a retry skips those already recorded."""
    # ``extractions`` are the outcomes of the extractions these cells read (futures, resolved
    # by Prefect before the task runs): when one failed, the cells fail with its reason.

    todo = [from_plain(Cell, c, f"cells[{i}]") for i, c in enumerate(cells)]
    unavailable = {(ext["model"], ext["dataset"]): f"extraction {ext['label']} failed: {ext['reason']}"
                   for ext in extractions if ext.get("status") == "failed"}
    return evaluate_cells(open_store(store), todo, unavailable=unavailable)


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def finetune_point_task(store: dict[str, Any], cell: dict[str, Any], index: int,
                        extract: dict[str, Any]) -> dict[str, Any]:
    """Train and score one grid point (resumed from its saved state); a failure is an outcome."""
    c, ext = _inputs(cell, extract)
    try:
        return {**grid_point(open_store(store), c, index, ext), "worker": worker_address()}
    except Exception as exc:  # noqa: BLE001  one point's failure is reported by the finishing task
        if is_transient(exc):
            raise
        return {**_failed(c, exc), "index": index}


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def finetune_finish_task(store: dict[str, Any], cell: dict[str, Any], points: list[Any],
                         extract: dict[str, Any]) -> dict[str, Any]:
    """Select, refit, test and record a cell from its grid points' outcomes."""
    c, ext = _inputs(cell, extract)
    try:
        out = grid_finish(open_store(store), c, points, ext)
        return {**out, "worker": worker_address(), "point_workers": [p.get("worker") for p in points]}
    except Exception as exc:  # noqa: BLE001  one cell's failure must not stop the others
        if is_transient(exc):
            raise
        return _failed(c, exc)


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def diagnostic_task(store: dict[str, Any], cell: dict[str, Any], extract: dict[str, Any]) -> dict[str, Any]:
    """Run and record one cell whose protocol reads the encoder's weights in one task
    (saliency, colour detail)."""
    c, ext = _inputs(cell, extract)
    try:
        return {**weights_cell(open_store(store), c, ext), "worker": worker_address()}
    except Exception as exc:  # noqa: BLE001  one cell's failure must not stop the others
        if is_transient(exc):
            raise
        return _failed(c, exc)


@task(cache_policy=NO_CACHE)
def correlate_and_report_task(config: Any, cells: list[dict[str, Any]], waiting: list[str] = (),
                              trackers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Read this run's records from the ledger, correlate, and write the report; ``config``
    is the plan's config (``jobs.run.plan_store``), not loaded again; ``trackers``: what each
    experiment tracker logged (``jobs.report.trackers.log_to_trackers``), for the summary and report."""
    return correlate_and_report(config.open_store(), config, cells, waiting=waiting, trackers=trackers)


@dataclass
class Submitted:
    """One submitted task and the cells its outcome answers (a group of feature cells, or one)."""
    future: Any
    cells: list[Any]


def submit_cells(cells: list[Any], store: dict[str, Any], extract: dict[str, Any], *,
                 extractions: Mapping[tuple[str, str], list[Any]], gpu_resources: bool, cells_per_task: int,
                 cell_memory: Mapping[str, int | None] | None = None) -> list[Submitted]:
    """Submit every cell's tasks, as its protocol's registry entry says (see the module doc)."""
    features = [c for c in cells if c.entry.reads_features]
    out = []
    for group, part, label in _cell_batches(features, cells_per_task):
        need = task_bytes([c.label() for c in part], cell_memory) if cell_memory else None
        with memory_request(need):
            out.append(Submitted(evaluate_task.with_options(task_run_name=f"evaluate {label}").submit(
                store, [to_plain(c) for c in part], extractions.get(group, [])), part))
    gpu = _gpu(gpu_resources)
    with gpu:  # weights + images: no extraction to wait for
        for cell in (c for c in cells if not c.entry.reads_features):
            out.append(Submitted(_submit_weights_cell(cell, store, extract), [cell]))
    return out


def _gpu(gpu_resources: bool):
    import dask

    return dask.annotate(resources={"GPU": 1}) if gpu_resources else contextlib.nullcontext()


def _submit_weights_cell(cell: Any, store: dict[str, Any], extract: dict[str, Any]) -> Any:
    """The future of a weights cell's outcome: its grid points' tasks then the finishing task,
    or its one task."""
    plain, grid = to_plain(cell), cell.entry.grid
    if grid is None:
        return diagnostic_task.with_options(task_run_name=f"{cell.setting} {cell.label()}").submit(
            store, plain, extract)
    n_points = grid.points(cell.entry.resolve(cell.settings))
    points = [finetune_point_task.with_options(task_run_name=f"{cell.protocol} point {i} {cell.label()}")
              .submit(store, plain, i, extract) for i in range(n_points)]
    return finetune_finish_task.with_options(task_run_name=f"{cell.protocol} {cell.label()}").submit(
        store, plain, points, extract)


def _cell_batches(cells: list[Any], per_task: int):
    """(encoder, dataset) groups of cells, split into near-equal tasks of at most ``per_task``
    cells: one task reads the group's features, and never waits on others'."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for cell in cells:
        groups.setdefault((cell.model, cell.dataset), []).append(cell)
    for group, members in groups.items():
        n_tasks = -(-len(members) // per_task)
        for k in range(n_tasks):
            part = members[k::n_tasks]
            settings = sorted({c.setting for c in part})
            yield group, part, f"{group[0]}/{group[1]}:{','.join(settings)[:80]}"


def collect_cells(submitted: list[Submitted], failed_units: Mapping[tuple[str, str], Mapping[str, Any]],
                  progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """The outcome of every submitted cell as its task completes; a task that raised after
    its retries gives failed outcomes naming the error (or the failed extraction its cells
    read)."""
    from prefect.futures import as_completed

    cells_of = {id(s.future): s.cells for s in submitted}
    outcomes: list[dict[str, Any]] = []
    for fut in as_completed([s.future for s in submitted]) if submitted else []:
        cells = cells_of[id(fut)]
        try:
            result = fut.result()
            outcomes.extend(result if isinstance(result, list) else [result])
        except Exception as exc:  # noqa: BLE001  I/O failures after retries (here or upstream): these cells failed
            unit = failed_units.get((cells[0].model, cells[0].dataset)) if cells[0].entry.reads_features else None
            if unit is not None:
                reason = f"not evaluated: extraction {unit.get('label')} failed: {unit.get('reason')}"
                outcomes.extend(cell_failure(c, reason, "ExtractionFailed") for c in cells)
            else:
                outcomes.extend(cell_failure(c, one_line(exc), type(exc).__name__) for c in cells)
        if progress is not None:
            progress(len(outcomes))
    return outcomes
