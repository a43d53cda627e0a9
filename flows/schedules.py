"""Deployments that `repeval serve` runs: a nightly scan of checkpoint folders and a
watcher that reruns the benchmark when the config's protocol settings change."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prefect import flow, get_run_logger
from prefect.events import emit_event
from prefect.states import Failed

from flows.reclaim import hold_run_lease
from jobs.report.run_summary import failure_message
from jobs.run.changes import SCHEDULE_LEASE, load_state
from jobs.run.spine import Run
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
    return run_scheduled(Run(config_path, retry_failed=retry_failed, scheduled=True), reason, new_encoders, early)


def run_scheduled(run: Run, reason: str, new_encoders: list[str] | None = None, early: bool | None = None):
    """A scheduled run of ``run``'s config (no answer from the ledger: the schedules decided
    there is work): its summary as a dict, or a Failed state carrying it."""
    # deferred: Dask and the benchmark flow load in a flow run's own process, never in the long-lived `repeval
    # serve`
    from flows.benchmark import run_plan

    summary = run.go(run_plan, reason=reason, new_encoders=new_encoders, early=early, answer=False)
    details = summary.details
    # the gist in this (parent) run's log too: its history says what each scheduled run did
    get_run_logger().info("%s: computed %d cells, %d from the ledger, %d failed; report %s", reason,
                          summary.computed, summary.cached, len(details.get("failed") or []), summary.report)
    brief = {k: v for k, v in details.items() if k not in ("extractions", "outcomes")}
    if summary.failures:
        return Failed(message=f"{reason}: {failure_message(details)}", data=brief)
    return brief


def config_resource_id(config_path: str) -> str:
    """The event resource of one config file: deployment triggers match on it."""
    return f"repeval.config.{stable_hash(str(config_path), 16)}"


def run_or_fail(config_path: str | Run, reason: str, new_encoders: list[str] | None = None,
                early: bool | None = None):
    """A scheduled run of a config file (or of a ``Run`` already made), with a mistake in the
    (edited) config as one line and a Failed state."""
    try:
        run = config_path if isinstance(config_path, Run) else Run(config_path, scheduled=True)
        return run_scheduled(run, reason, new_encoders, early=early)
    except RepevalError as exc:
        say(reason, f"error: {exc}")
        get_run_logger().error("%s: %s", reason, exc)
        return Failed(message=f"{reason}: {exc}")


def schedule_lease(config_path: str):
    """The lease that lets one scheduled run at a time evaluate the config's store (not acquired)."""
    return Run(config_path).store(writable=True).lease(SCHEDULE_LEASE)


def _note(reason: str, line: str) -> None:
    say(reason, line)
    get_run_logger().info(line)


@contextlib.contextmanager
def this_run(run: Run) -> Iterator[None]:
    """Hold this scheduled run's own lease while its code runs: the liveness of its process,
    by which the next serve tells a killed run from a live one (``flows.reclaim``)."""
    lease = hold_run_lease(run.store(writable=True))
    try:
        yield
    finally:
        if lease is not None:
            lease.release()


@flow(name="repeval-scan-checkpoints")
def scan_checkpoints_flow(config_path: str, early: bool | None = None) -> dict[str, Any]:
    """Scheduled (cron): evaluate every checkpoint that appeared since the last run. A
    watcher's run in progress is waited for before the folders are scanned (it may have
    done the work). ``early``: new checkpoints are first judged by the early pass (default:
    the config's ``early.enabled``)."""
    run = Run(config_path, scheduled=True, say=lambda line: say("scan", line))
    with this_run(run):
        lease = run.store(writable=True).lease(SCHEDULE_LEASE)
        lease.acquire(wait=True)
        try:
            changes = run.changes()  # the folders scanned once, holding the store
            answer = None if changes.recorded else run.ledger_answer()
            if answer is not None:  # no scheduled run recorded yet, but a `repeval run` did the work
                run.note_ledger_state()
                _note("scan", f"no new checkpoints: all {answer.cells} cells are in the ledger (run of {answer.recorded})")
                return {"ran": False, "new_encoders": []}
            if not changes.any:
                _note("scan", "no new checkpoints and no protocol change")
                return {"ran": False, "new_encoders": []}
            why = "scan: new checkpoints" if changes.new_encoders else "scan: protocol settings changed"
            return run_or_fail(run, why, changes.new_encoders, early=early)
        finally:
            lease.release()


@flow(name="repeval-watch-protocols")
def watch_protocols_flow(config_path: str) -> dict[str, Any]:
    """Polled: when the protocol settings differ from those of the runs recorded, emit an
    event and rerun. Before any run is recorded the scan evaluates the config; while a
    scan runs, the watcher leaves its work to it (the scan records the settings it used,
    so an edit made during the scan is seen at the next poll)."""
    run = Run(config_path, scheduled=True, say=lambda line: say("watch", line))
    with this_run(run):
        return _watch(run)


def _watch(run: Run) -> dict[str, Any]:
    if not run.settings_edited():  # the store's note alone: no folder is scanned on an idle poll
        recorded = load_state(run.store(writable=True), run.watch_key) is not None
        return {"ran": False, "reason": "unchanged" if recorded else "no run recorded yet (the scan evaluates first)"}
    lease = run.store(writable=True).lease(SCHEDULE_LEASE)
    if not lease.acquire(wait=False):
        _note("watch", "protocol settings changed; a scheduled run in progress holds the store: left to it "
                       "and the next poll")
        return {"ran": False, "reason": "busy"}
    try:
        if not run.settings_edited():  # again, holding the store: a scan may just have run them
            return {"ran": False, "reason": "unchanged"}
        emit_event(event=CHANGED_EVENT, resource={"prefect.resource.id": config_resource_id(run.path)},
                   payload={"config": run.path, "protocol_hash": run.config.protocol_hash()})
        return run_or_fail(run, "watch: protocol settings changed", run.changes().new_encoders)
    finally:
        lease.release()
