"""Prefect tasks of the encoder protocols and their place in the benchmark flow.

Fine-tuning is one task per grid point, then one task that selects, refits, tests and
records; a diagnostic (saliency, colour detail) is one task per cell. They read weights and
images, not features, so they never wait on an extraction, and they ask for the ``GPU``
worker resource exactly as extraction does: a cluster spreads a grid over its GPUs. Like
the other tasks, a failure is an outcome (the run goes on) and retries are for I/O only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.tasks import io_errors_only, worker_address
from jobs.failures import is_transient

__all__ = ["collect_encoder_cells", "diagnostic_task", "finetune_finish_task", "finetune_point_task",
           "submit_encoder_cells"]


def _open(store: dict[str, Any]):
    from storage_schema import FeatureStore

    return FeatureStore(store["url"], storage_options=store.get("storage_options") or None)


def _inputs(cell: dict[str, Any], extract: dict[str, Any]):
    from jobs.config import ExtractConfig
    from jobs.evaluation.encoder_cells import EncoderCell
    from jobs.config.typed import from_plain

    return EncoderCell.from_dict(cell), from_plain(ExtractConfig, extract, "config.extract")


def _failed(cell, exc: BaseException) -> dict[str, Any]:
    from jobs.failures import cell_failure, one_line

    return cell_failure(cell, one_line(exc), type(exc).__name__)


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def finetune_point_task(store: dict[str, Any], cell: dict[str, Any], index: int,
                        extract: dict[str, Any]) -> dict[str, Any]:
    """Train and score one grid point (resumed from its saved state); a failure is an outcome."""
    from jobs.evaluation.encoder_jobs import finetune_point

    c, ext = _inputs(cell, extract)
    try:
        return {**finetune_point(_open(store), c, index, ext), "worker": worker_address()}
    except Exception as exc:  # noqa: BLE001  one point's failure is reported by the finishing task
        if is_transient(exc):
            raise
        return {**_failed(c, exc), "index": index}


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def finetune_finish_task(store: dict[str, Any], cell: dict[str, Any], points: list[Any],
                         extract: dict[str, Any]) -> dict[str, Any]:
    """Select, refit, test and record a fine-tuning cell from its grid points' outcomes."""
    from jobs.evaluation.encoder_jobs import finetune_finish

    c, ext = _inputs(cell, extract)
    try:
        out = finetune_finish(_open(store), c, points, ext)
        return {**out, "worker": worker_address(), "point_workers": [p.get("worker") for p in points]}
    except Exception as exc:  # noqa: BLE001  one cell's failure must not stop the others
        if is_transient(exc):
            raise
        return _failed(c, exc)


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def diagnostic_task(store: dict[str, Any], cell: dict[str, Any], extract: dict[str, Any]) -> dict[str, Any]:
    """Run and record one saliency or colour-detail cell."""
    from jobs.evaluation.encoder_jobs import diagnostic_cell

    c, ext = _inputs(cell, extract)
    try:
        return {**diagnostic_cell(_open(store), c, ext), "worker": worker_address()}
    except Exception as exc:  # noqa: BLE001  one cell's failure must not stop the others
        if is_transient(exc):
            raise
        return _failed(c, exc)


def submit_encoder_cells(cells: list[Any], store: dict[str, Any], extract: dict[str, Any],
                         gpu_resources: bool) -> list[tuple[Any, Any]]:
    """Submit every cell's tasks; ``(cell, future of its outcome)`` per cell.

    Parameters
    ----------
    cells : the plan's encoder cells.
    store : the store as plain values (``url``, ``storage_options``).
    extract : the config's ``extract`` section as plain values.
    gpu_resources : ask every task for one unit of the workers' ``GPU`` resource.

    Returns
    -------
    list of (EncoderCell, PrefectFuture)
    """
    import dask

    from pipeline.encoder_protocols import FINETUNE
    from pipeline.protocols.finetune import FinetuneSettings, grid_points

    pending = []
    gpu = dask.annotate(resources={"GPU": 1}) if gpu_resources else contextlib.nullcontext()
    with gpu:
        for cell in cells:
            plain = cell.to_dict()
            if cell.protocol != FINETUNE:
                pending.append((cell, diagnostic_task.with_options(task_run_name=f"{cell.setting} {cell.label()}")
                                .submit(store, plain, extract)))
                continue
            n_points = len(grid_points(FinetuneSettings.from_dict(cell.settings)))
            points = [finetune_point_task.with_options(task_run_name=f"finetune point {i} {cell.label()}")
                      .submit(store, plain, i, extract) for i in range(n_points)]
            pending.append((cell, finetune_finish_task.with_options(task_run_name=f"finetune {cell.label()}")
                            .submit(store, plain, points, extract)))
    return pending


def collect_encoder_cells(pending: list[tuple[Any, Any]],
                          progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """The outcome of every submitted cell as it completes (a task that raised after its
    retries: a failed outcome naming the error).

    Parameters
    ----------
    pending : what :func:`submit_encoder_cells` returned.
    progress : called as ``progress(done, total)`` after each cell.

    Returns
    -------
    list of dict
    """
    from prefect.futures import as_completed

    cell_of = {id(fut): cell for cell, fut in pending}
    outcomes = []
    for fut in as_completed([fut for _, fut in pending]) if pending else []:
        try:
            outcomes.append(fut.result())
        except Exception as exc:  # noqa: BLE001  I/O failures after retries: this cell failed
            outcomes.append(_failed(cell_of[id(fut)], exc))
        if progress is not None:
            progress(len(outcomes), len(pending))
    return outcomes
