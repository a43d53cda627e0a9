"""Deployments that `repeval serve` runs: a nightly scan of checkpoint folders and a
watcher that reruns the benchmark when the config's protocol settings change.

Both only start the benchmark flow (`repeval serve` serves them: flows.serving); what it
computes is decided by the store and the ledger, so a scheduled run evaluates exactly the
new encoders or the changed settings. Each holds a lease of its own while its code runs
(:func:`this_run`), by which a killed serve's runs are told from live ones (flows.reclaim).
One scheduled run at a time evaluates a store (the lease ``jobs.watch.SCHEDULE_LEASE``):
the scan waits for a watcher's run, the watcher leaves its work to a scan in progress and
runs only when the settings differ from those of a recorded run.
Prefect runs each scheduled flow run in a process of its own, so the serving process
does not accumulate the memory of the runs (torch, the Dask cluster, features).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prefect import flow, get_run_logger
from prefect.events import emit_event
from prefect.states import Failed

from flows.reclaim import hold_run_lease
from jobs.config import load_config
from jobs.plan import make_plan
from jobs.report.run_summary import failure_message
from jobs.rerun import ledger_answer
from jobs.watch import SCHEDULE_LEASE, detect_changes, save_state, watch_key
from pipeline.errors import RepevalError
from pipeline.terminal import say
from storage_schema.provenance import stable_hash

CHANGED_EVENT = "repeval.config.protocols-changed"
DEFAULT_CRON = "0 2 * * *"  # the nightly checkpoint scan: 02:00


def run_config_file(config_path: str, reason: str, new_encoders: list[str] | None = None,
                    retry_failed: bool = False, early: bool | None = None):
    """The benchmark of a config file as it reads now (with the checkpoints ready in its
    folders), as a subflow; records what it completed for the schedules. Returns the
    summary, or a Failed state carrying it when something failed. ``early``: the early
    pass first (default: the config's ``early.enabled``)."""
    # deferred: Dask and the benchmark flow load in a flow run's own process, never in the long-lived `repeval
    # serve`
    from flows.benchmark import run_plan

    cfg = load_config(config_path)
    plan = make_plan(cfg, retry_failed=retry_failed, strict_folders=False)  # a bad folder: its files fail alone
    planned = {e.name for e in plan.config.encoders}  # a refused checkpoint is not a new encoder
    summary = run_plan(plan, reason=reason, new_encoders=[n for n in new_encoders or [] if n in planned],
                       early=early)
    failed_units = {f.get("model") for f in summary["failed_extractions"]}
    completed = [e.name for e in plan.config.encoders if e.name not in failed_units]
    save_state(plan.config.open_store(), plan.config, watch_key(config_path), completed,
               plan.scan.signatures())
    # the gist in this (parent) run's log too: its history says what each scheduled run did
    get_run_logger().info("%s: computed %d cells, %d from the ledger, %d failed; report %s", reason,
                          summary["computed"], summary["cached"], len(summary["failed"]), summary["report"])
    brief = {k: v for k, v in summary.items() if k not in ("extractions", "outcomes")}
    if summary["failures"]:
        return Failed(message=f"{reason}: {failure_message(summary)}", data=brief)
    return brief


def config_resource_id(config_path: str) -> str:
    """The event resource of one config file: deployment triggers match on it."""
    return f"repeval.config.{stable_hash(str(config_path), 16)}"


def _changes(config_path: str):
    cfg = load_config(config_path)
    return cfg, detect_changes(cfg.open_store(), cfg, watch_key(config_path))


def run_or_fail(config_path: str, reason: str, new_encoders: list[str] | None = None, early: bool | None = None):
    """``run_config_file``, with a mistake in the (edited) config as one line and a Failed state."""
    try:
        return run_config_file(config_path, reason, new_encoders, early=early)
    except RepevalError as exc:
        say(reason, f"error: {exc}")
        get_run_logger().error("%s: %s", reason, exc)
        return Failed(message=f"{reason}: {exc}")


def schedule_lease(config_path: str):
    """The lease that lets one scheduled run at a time evaluate the config's store (not acquired)."""
    return load_config(config_path).open_store().lease(SCHEDULE_LEASE)


def _note(reason: str, line: str) -> None:
    say(reason, line)
    get_run_logger().info(line)


@contextlib.contextmanager
def this_run(config_path: str) -> Iterator[None]:
    """Hold this scheduled run's own lease while its code runs: the liveness of its process,
    by which the next serve tells a killed run from a live one (``flows.reclaim``)."""
    lease = hold_run_lease(load_config(config_path).open_store())
    try:
        yield
    finally:
        if lease is not None:
            lease.release()


def _ledger_has_everything(config_path: str, cfg) -> bool:
    """No scheduled run recorded yet, but a `repeval run` left every cell in the ledger and
    the store (its no-op answer holds): recorded as the schedules' state, nothing to run."""
    answer = ledger_answer(cfg)
    if answer is None:
        return False
    plan = make_plan(cfg, record=False, check=False)
    save_state(cfg.open_store(), plan.config, watch_key(config_path), files=plan.scan.signatures())
    _note("scan", f"no new checkpoints: all {answer.cells} cells are in the ledger (run of {answer.recorded})")
    return True


@flow(name="repeval-scan-checkpoints")
def scan_checkpoints_flow(config_path: str, early: bool | None = None) -> dict[str, Any]:
    """Scheduled (cron): evaluate every checkpoint that appeared since the last run. A
    watcher's run in progress is waited for, then the changes are read again (it may have
    done the work). ``early``: new checkpoints are first judged by the early pass (default:
    the config's ``early.enabled``)."""
    with this_run(config_path):
        lease = schedule_lease(config_path)
        lease.acquire(wait=True)
        try:
            cfg, changes = _changes(config_path)
            if not changes.recorded and _ledger_has_everything(config_path, cfg):
                return {"ran": False, "new_encoders": []}
            if not changes.any:
                _note("scan", "no new checkpoints and no protocol change")
                return {"ran": False, "new_encoders": []}
            why = "scan: new checkpoints" if changes.new_encoders else "scan: protocol settings changed"
            return run_or_fail(config_path, why, changes.new_encoders, early=early)
        finally:
            lease.release()


@flow(name="repeval-watch-protocols")
def watch_protocols_flow(config_path: str) -> dict[str, Any]:
    """Polled: when the protocol settings differ from those of the runs recorded, emit an
    event and rerun. Before any run is recorded the scan evaluates the config; while a
    scan runs, the watcher leaves its work to it (the scan records the settings it used,
    so an edit made during the scan is seen at the next poll)."""
    with this_run(config_path):
        return _watch(config_path)


def _watch(config_path: str) -> dict[str, Any]:
    cfg, changes = _changes(config_path)
    if not changes.settings_edited:
        return {"ran": False, "reason": "unchanged" if changes.recorded else "no run recorded yet (the scan evaluates first)"}
    lease = schedule_lease(config_path)
    if not lease.acquire(wait=False):
        _note("watch", "protocol settings changed; a scheduled run in progress holds the store: left to it "
                       "and the next poll")
        return {"ran": False, "reason": "busy"}
    try:
        cfg, changes = _changes(config_path)  # again, holding the store: a scan may just have run them
        if not changes.settings_edited:
            return {"ran": False, "reason": "unchanged"}
        emit_event(event=CHANGED_EVENT, resource={"prefect.resource.id": config_resource_id(config_path)},
                   payload={"config": config_path, "protocol_hash": cfg.protocol_hash()})
        return run_or_fail(config_path, "watch: protocol settings changed", changes.new_encoders)
    finally:
        lease.release()

