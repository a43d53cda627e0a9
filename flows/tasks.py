"""Prefect tasks: thin wrappers that rebuild their inputs from plain values and call a job.

Task inputs are plain dicts and indices (cheap to ship to Dask workers). Prefect's
caching is off: whether work is needed is decided by the store's completeness and the
ledger's content keys, which never go stale when data changes. Retries are for I/O only.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline.errors import ConfigError, DataValidationError, RepevalError


def io_errors_only(task, task_run, state) -> bool:
    """Retry transient I/O failures (network, object store, full queue), never bad input."""
    try:
        state.result()
    except RepevalError:
        return False
    except (OSError, TimeoutError, ConnectionError):
        return True
    except BaseException:
        return False
    return False


def _store(config: dict):
    from jobs.config import load_config

    cfg = load_config(config)
    return cfg, cfg.open_store()


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def extract_task(config: dict, unit_index: int) -> dict[str, Any]:
    from jobs.plan import extraction_units, run_extract_unit

    cfg, store = _store(config)
    report = run_extract_unit(store, extraction_units(cfg)[unit_index], cfg).to_dict()
    report["worker"] = _worker_address()
    return report


def _worker_address() -> str | None:
    """The Dask worker this task ran on (which one held the GPU resource), if any."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=io_errors_only)
def evaluate_task(config: dict, cell_indices: list[int]) -> list[dict[str, Any]]:
    """Evaluate some cells of one (encoder, dataset); a retry skips those already recorded."""
    from jobs.evaluate import evaluate_cell
    from jobs.plan import evaluation_cells

    cfg, store = _store(config)
    cells = evaluation_cells(cfg)
    outcomes = []
    for i in cell_indices:
        cell = cells[i]
        try:
            outcome = evaluate_cell(store, cell)
        except (DataValidationError, ConfigError) as exc:
            # This cell's data cannot be evaluated this way (e.g. too few images per class
            # for its few-shot setting): report it; the other cells of the run go on.
            # Nothing is written to the ledger, so a fixed setting is evaluated next time.
            outcomes.append({"cell_id": None, "status": "failed", "setting": cell.setting, "cell": cell.label(),
                             "error": f"{type(exc).__name__}: {exc}"})
            continue
        outcomes.append({"cell_id": outcome.cell_id, "status": outcome.status, "setting": cell.setting})
    return outcomes


@task(cache_policy=NO_CACHE)
def correlate_and_report_task(config: dict, cells: list[dict[str, str]]) -> dict[str, Any]:
    """Read this run's records from the ledger, correlate, and write the report."""
    from jobs.report_inputs import correlate_and_report

    cfg, store = _store(config)
    failed = [c for c in cells if c["status"] == "failed"]
    return correlate_and_report(store, cfg, [(c["cell_id"], c["setting"]) for c in cells if c["cell_id"]],
                                failed=failed)
