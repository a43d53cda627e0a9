"""Deployments that `repeval serve` runs: a nightly scan of checkpoint folders and a
watcher that reruns the benchmark when the config's protocol settings change.

Both only start the benchmark flow; what it computes is decided by the store and the
ledger, so a scheduled run evaluates exactly the new encoders or the changed settings.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.events import emit_event

from flows.benchmark import benchmark_flow
from flows.runtime import gpu_count, task_runner
from jobs.checkpoint_scan import with_scanned_checkpoints
from jobs.config import load_config
from jobs.plan import check_plan
from jobs.watch import detect_changes, save_state, watch_key
from storage_schema.provenance import stable_hash

CHANGED_EVENT = "repeval.config.protocols-changed"


def run_config_file(config_path: str, reason: str) -> dict[str, Any]:
    """The benchmark of a config file as it reads now (with scanned checkpoints), as a subflow."""
    cfg = with_scanned_checkpoints(load_config(config_path))
    check_plan(cfg)
    gpu = cfg.dask.gpu == "always" or (cfg.dask.gpu == "auto" and gpu_count() > 0)
    runner = task_runner(cfg.dask.address, cfg.dask.n_workers, cfg.dask.threads_per_worker, cfg.dask.processes,
                         gpu)
    summary = benchmark_flow.with_options(task_runner=runner)(cfg.to_dict(), gpu_resources=gpu)
    save_state(cfg.open_store(), cfg, watch_key(config_path))
    get_run_logger().info("%s: computed %d cells, %d from the ledger; report %s", reason,
                          summary["computed"], summary["cached"], summary["report"])
    return {k: v for k, v in summary.items() if k not in ("extractions", "outcomes")}


def config_resource_id(config_path: str) -> str:
    """The event resource of one config file: deployment triggers match on it."""
    return f"repeval.config.{stable_hash(str(config_path), 16)}"


def _changes(config_path: str):
    cfg = load_config(config_path)
    return cfg, detect_changes(cfg.open_store(), cfg, watch_key(config_path))


@flow(name="repeval-scan-checkpoints")
def scan_checkpoints_flow(config_path: str) -> dict[str, Any]:
    """Scheduled (cron): evaluate every checkpoint that appeared since the last run."""
    _, changes = _changes(config_path)
    if not changes.any:
        get_run_logger().info("no new checkpoints and no protocol change")
        return {"ran": False, "new_encoders": []}
    return {"ran": True, "new_encoders": changes.new_encoders, **run_config_file(config_path, "scan")}


@flow(name="repeval-watch-protocols")
def watch_protocols_flow(config_path: str) -> dict[str, Any]:
    """Polled: when the protocol settings' hash changed, emit an event and rerun."""
    cfg, changes = _changes(config_path)
    if not changes.protocols_changed:
        return {"ran": False}
    emit_event(event=CHANGED_EVENT, resource={"prefect.resource.id": config_resource_id(config_path)},
               payload={"config": config_path, "protocol_hash": cfg.protocol_hash()})
    return {"ran": True, **run_config_file(config_path, "protocol settings changed")}


def serve_schedules(config_path: str, cron: str | None = "0 2 * * *", interval: float | None = None,
                    watch_interval: float = 60.0) -> None:
    """Serve both deployments until interrupted (embedded: on this run's local API)."""
    from prefect import serve

    # concurrency_limit=1: a slow run is never overlapped by the next scheduled one
    scan = scan_checkpoints_flow.to_deployment(
        name="nightly-scan", parameters={"config_path": config_path}, concurrency_limit=1,
        **({"interval": interval} if interval else {"cron": cron}),
    )
    watch = watch_protocols_flow.to_deployment(
        name="protocol-watch", parameters={"config_path": config_path}, interval=watch_interval,
        concurrency_limit=1,
    )
    serve(scan, watch)
