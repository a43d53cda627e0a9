"""What a killed `repeval serve` leaves behind, found and taken back by the next one."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobs.config import load_config
from storage_schema import keys

log = logging.getLogger(__name__)

SERVED_FLOWS = ("repeval-scan-checkpoints", "repeval-watch-protocols")
RUN_LEASES = "schedules/flow-runs"  # one lease per scheduled flow run: its process's liveness
RECLAIM_INTERVAL = 30.0  # seconds between two looks for dead runs in a serving process
RELEASED_GRACE = 30.0  # the flow code ended this long ago and no final state came: the process died
START_GRACE = 180.0  # a run this long in PENDING/RUNNING without a lease: its process never got to run it
_KEEP_RELEASED = 3600.0  # released run leases older than this are removed (one folder per run otherwise)


def run_lease_key(flow_run_id: str) -> str:
    """The store lease held by the process of one scheduled flow run."""
    return f"{RUN_LEASES}/{flow_run_id}"


def hold_run_lease(store):
    """In a scheduled flow run: hold this run's lease (released by the caller) and note the
    process in the run's ``infrastructure_pid``; None outside a flow run."""
    from prefect.runtime import flow_run

    run_id = flow_run.id
    if not run_id:
        return None
    # The serve's pid is noted before the lease is taken: a lease seen held then always has
    # its run's note, so the line of a serve killed at any moment after can name it.
    record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "serve_pid": os.getppid()})
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            client.update_flow_run(run_id, infrastructure_pid=record)  # for the reclaim line (and the UI)
    except Exception as exc:  # noqa: BLE001  only the line's detail: the lease is what is judged
        log.debug("infrastructure_pid not set: %s", exc)
    lease = store.lease(run_lease_key(str(run_id)))
    lease.acquire(wait=False)  # the run's own key: no one else takes it
    return lease


@dataclass(frozen=True)
class DeadRun:
    """A PENDING/RUNNING scheduled run whose process is gone, and why that is known."""

    id: str
    name: str
    deployment_id: str | None
    host: str
    serve_pid: str
    why: str

    def line(self) -> str:
        """The one line printed when it is reclaimed."""
        whose = f"dead serve pid {self.serve_pid} on host {self.host}" if self.serve_pid != "?" else "a dead serve"
        return f"reclaimed flow run {self.name} ({self.id}) of {whose} ({self.why}): marked Crashed, slot released"


def _holder(flow_run) -> tuple[str, str]:
    try:
        rec = json.loads(flow_run.infrastructure_pid or "")
        return str(rec.get("host", "?")), str(rec.get("serve_pid", "?"))
    except (ValueError, AttributeError):
        return "?", "?"


def judge(flow_run, lease_info, now: float | None = None) -> str | None:
    """Why ``flow_run``'s process is known dead, from its run lease (None: alive or not known yet)."""
    now = now or time.time()
    if lease_info is None:
        entered = flow_run.state.timestamp.timestamp() if flow_run.state and flow_run.state.timestamp else now
        waited = now - entered
        return f"no process ran it for {waited:.0f} s" if waited > START_GRACE else None
    if lease_info.released:
        ago = now - lease_info.heartbeat
        return f"its flow ended {ago:.0f} s ago without a final state" if ago > RELEASED_GRACE else None
    if lease_info.holder_gone():
        return f"process {lease_info.process.get('pid')} is gone"
    if lease_info.expired(now):
        return f"no heartbeat for {now - lease_info.heartbeat:.0f} s"
    return None


def _unfinished():
    """The states in which a run holds its deployment's concurrency slot."""
    from prefect.client.schemas.filters import FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    return FlowRunFilterState(type=FlowRunFilterStateType(
        any_=[StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]))


def dead_runs(client, store, config_path: str) -> list[DeadRun]:
    """This config's scheduled runs in PENDING/RUNNING/CANCELLING whose process is known dead."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter

    live = FlowRunFilter(state=_unfinished())
    runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=list(SERVED_FLOWS))),
                                 flow_run_filter=live, limit=200)
    found = []
    for run in runs:
        if (run.parameters or {}).get("config_path") != config_path:
            continue
        why = judge(run, store.lease(run_lease_key(str(run.id))).current())
        if why:
            host, serve_pid = _holder(run)
            found.append(DeadRun(str(run.id), run.name, str(run.deployment_id) if run.deployment_id else None,
                                 host, serve_pid, why))
    return found


def _release_unheld_slots(client, deployment_id: str) -> int:
    """Slots the deployment's limit counts beyond its runs alive (a killed run's, when the
    server that leased it was restarted): released; how many."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter
    from prefect.exceptions import ObjectNotFound

    name = f"deployment:{deployment_id}"  # Prefect's own limit of a deployment's concurrency_limit
    try:
        limit = client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        return 0
    holding = client.count_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=FlowRunFilter(state=_unfinished()))
    excess = limit.active_slots - holding
    if excess > 0:
        client.release_concurrency_slots(names=[name], slots=excess, occupancy_seconds=0)
    return max(excess, 0)


def _crash_subflows(client, run: DeadRun) -> None:
    """The benchmark subflow a dead scan was running died with it: Crashed too (it holds no slot)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.states import Crashed

    children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id]), state=_unfinished()))
    for child in children:
        client.set_flow_run_state(child.id, Crashed(message=f"repeval: its parent run {run.id} died"), force=True)


def _forget_old_leases(store) -> None:
    """Each scheduled run leaves its released lease (a watcher's every minute): removed after
    :data:`_KEEP_RELEASED` s, long after its run reached its final state."""
    now = time.time()
    for run_id in store.backend.list(keys.lease_dir(RUN_LEASES), dirs_only=True):
        info = store.lease(run_lease_key(run_id)).current()
        if info is not None and info.released and now - info.heartbeat > _KEEP_RELEASED:
            store.backend.delete(keys.lease_dir(run_lease_key(run_id)), recursive=True)


def reclaim(config_path: str, say: Callable[[str], None] = print) -> list[DeadRun]:
    """Mark this config's dead scheduled runs Crashed and release the concurrency slots
    they held, one line each through ``say``; the runs reclaimed. Needs PREFECT_API_URL."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.states import Crashed

    store = load_config(config_path).open_store()
    with get_client(sync_client=True) as client:
        found = dead_runs(client, store, config_path)
        for run in found:
            client.set_flow_run_state(run.id, Crashed(message=f"repeval: {run.line()}"), force=True)
            _crash_subflows(client, run)
            store.backend.delete(keys.lease_dir(run_lease_key(run.id)), recursive=True)  # its holder is dead
        deployments = client.read_deployments(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=["nightly-scan", "protocol-watch"])))
        for dep in deployments:
            if (dep.parameters or {}).get("config_path") != config_path:
                continue
            released = _release_unheld_slots(client, str(dep.id))
            if released and not any(r.deployment_id == str(dep.id) for r in found):
                say(f"released {released} concurrency slot(s) of deployment {dep.name} held by no live run")
    for run in found:
        say(run.line())
    try:
        _forget_old_leases(store)
    except OSError as exc:
        log.debug("old run leases not removed: %s", exc)
    return found


def reclaim_quietly(config_path: str, say: Callable[[str], None]) -> list[DeadRun]:
    """:func:`reclaim` where it must never fail its caller (`repeval run`, which needs no
    slot; serve's look every :data:`RECLAIM_INTERVAL` s): what goes wrong is logged."""
    try:
        return reclaim(config_path, say)
    except Exception as exc:  # noqa: BLE001  the next serve reclaims them as well
        log.warning("looking for runs a killed serve left behind failed: %s", exc)
        return []


def reclaim_periodically(config_path: str, say: Callable[[str], None], stop: threading.Event,
                         interval: float = RECLAIM_INTERVAL) -> threading.Thread:
    """A daemon thread of the serving process: :func:`reclaim` every ``interval`` s until
    ``stop`` (another serve's dead runs, while this one keeps serving). It runs in a copy of
    the caller's context, so it talks to the caller's Prefect API."""
    import contextvars

    def loop() -> None:
        while not stop.wait(interval):
            if not stop.is_set():
                reclaim_quietly(config_path, say)  # a failed look is tried again at the next

    ctx = contextvars.copy_context()
    thread = threading.Thread(target=ctx.run, args=(loop,), name="repeval-reclaim", daemon=True)
    thread.start()
    return thread

