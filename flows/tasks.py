"""Prefect tasks: thin wrappers that rebuild their inputs from plain values and call a job.

Each task is handed exactly what it runs (a unit, or a list of cells, as plain dicts:
cheap to ship to Dask workers); nothing is re-planned in a task. Prefect's caching is
off: whether work is needed is decided by the store's completeness and the ledger's
content keys, which never go stale when data changes. Retries are for I/O only; any other
failure of a unit or a cell is returned as a "failed" outcome, so the rest of the run goes on.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from jobs.failures import is_transient


def io_errors_only(task, task_run, state) -> bool:
    """Retry transient I/O failures (network, object store, full queue), never bad input."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001  the state's own exception, judged below
        return is_transient(exc)
    return False


def _open_store(store: dict[str, Any]):
    from storage_schema import FeatureStore

    return FeatureStore(store["url"], storage_options=store.get("storage_options") or None)


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def extract_task(store: dict[str, Any], unit: dict[str, Any], extract: dict[str, Any]) -> dict[str, Any]:
    """Extract one (encoder, dataset split); its failure is an outcome, not an exception."""
    from jobs.config import ExtractConfig
    from jobs.failures import extraction_failure
    from jobs.plan import ExtractUnit, run_extract_unit
    from jobs.config.typed import from_plain

    u = ExtractUnit.from_dict(unit)
    try:
        report = run_extract_unit(_open_store(store), u, from_plain(ExtractConfig, extract, "config.extract"))
    except Exception as exc:  # noqa: BLE001  one unit's failure must not stop the others
        if is_transient(exc):
            raise
        return extraction_failure(u.encoder.name, u.dataset.name, u.split, u.encoder.weights, exc, u.encoder.arch)
    out = report.to_dict()
    out.update(label=u.label(), weights=u.encoder.weights, worker=worker_address())
    return out


def worker_address() -> str | None:
    """The Dask worker this task ran on (which one held the GPU resource), if any."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def evaluate_task(store: dict[str, Any], cells: list[dict[str, Any]],
                  extractions: list[Any] = ()) -> list[dict[str, Any]]:
    """Evaluate some cells of one (encoder, dataset); a retry skips those already recorded.

    ``extractions`` are the outcomes of the extractions these cells read (futures, resolved
    by Prefect before the task runs): when one failed, the cells fail with its reason.
    """
    from jobs.evaluation.evaluate import Cell, evaluate_cells

    todo = [Cell(**c) for c in cells]
    unavailable = {(ext["model"], ext["dataset"]): f"extraction {ext['label']} failed: {ext['reason']}"
                   for ext in extractions if ext.get("status") == "failed"}
    return evaluate_cells(_open_store(store), todo, unavailable=unavailable)


@task(cache_policy=NO_CACHE)
def correlate_and_report_task(config: dict[str, Any], cells: list[dict[str, Any]],
                              waiting: list[str] = ()) -> dict[str, Any]:
    """Read this run's records from the ledger, correlate, and write the report."""
    from jobs.config import load_config
    from jobs.report.inputs import correlate_and_report

    cfg = load_config(config)
    return correlate_and_report(cfg.open_store(), cfg, cells, waiting=waiting)
