"""`repeval serve` killed as a machine dies, and stopped by a signal, as a lab's servers are:
real `repeval serve` process groups on one REPEVAL_HOME (one Prefect database), a scan
caught RUNNING (held on the store's schedule lease by the test).

- ``kill -9`` of the whole group: the next serve (or `repeval run` of the config) reclaims
  the dead scan (one line naming it and the dead serve's pid), its concurrency slot is free
  and the next scans complete;
- SIGTERM to the whole group and its Prefect server at once, with a scan in progress:
  serve stops within seconds with one line, no traceback, exit 143, and leaves no process
  behind; SIGINT to serve alone: 130; its Prefect server killed under it: one line, exit 1.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from jobs.config import load_config
from jobs.run.changes import SCHEDULE_LEASE, save_state, watch_key
from flows.reclaim import RUN_LEASES, run_lease_key
from storage_schema import FeatureStore
from storage_schema import keys
from tests.helpers.cli import REPO
from tests.helpers.serving import wait_for
from tests.helpers.configs import tiny_config

pytestmark = pytest.mark.slow

FAST = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1", "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1",
        "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "1"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A folder-only config whose empty folder gives every scan nothing to do (recorded as
    done), and the environment every serve of the module shares."""
    tmp = tmp_path_factory.mktemp("recovery")
    raw = tiny_config(tmp)
    del raw["encoders"]
    raw["checkpoints"] = [{"path": str(tmp / "ck"), "arch": "resnet18", "input_size": 32, "settle_seconds": 0}]
    raw["reference"] = {"scores": {}}
    raw["correlation"] = {"settings": []}
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(config))
    save_state(cfg.open_store(), cfg, watch_key(str(config)))  # a run is recorded: scans are quick
    env = dict(os.environ, REPEVAL_HOME=str(tmp / "home"), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **FAST)
    for name in ("PREFECT_API_URL", "PREFECT_HOME"):
        env.pop(name, None)  # serve's own server, on the module's one database
    started = []
    lab = {"tmp": tmp, "config": str(config), "store": raw["store"], "env": env, "started": started}
    yield lab
    for proc, _ in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _serve(lab, name: str):
    log = lab["tmp"] / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", lab["config"], "--interval", "2",
                             "--watch-interval", "3600"], cwd=REPO, env=lab["env"], stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), start_new_session=True)
    lab["started"].append((proc, log))
    served = {"proc": proc, "log": lambda: log.read_text(errors="replace")}
    banner = _wait("the banner", lambda: re.search(r"run history: (http://127\.0\.0\.1:\d+)", served["log"]()),
                   served, 240)
    served["api"] = banner.group(1) + "/api"
    return served


def _wait(what: str, check, served, timeout: float = 120):
    return wait_for(what, check, served, timeout, poll=0.5)


def _running_scan(lab, served) -> str | None:
    """The id of a scheduled run of ``served`` whose flow process holds its run lease now.

    Only a live child of this serve counts: an earlier serve of the module stopped by a
    signal may have left an unreleased lease of a run that is long over."""
    store = FeatureStore(lab["store"])
    for run_id in store.backend.list(keys.lease_dir(RUN_LEASES), dirs_only=True):
        info = store.lease(run_lease_key(run_id)).current()
        if info is None or info.released or info.holder_gone():
            continue
        try:
            if psutil.Process(int(info.process["pid"])).ppid() == served["proc"].pid:
                return run_id
        except (psutil.Error, KeyError, TypeError, ValueError):
            continue
    return None


def _completed_scans(served) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: served["api"]}), get_client(sync_client=True) as client:
        return client.count_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["repeval-scan-checkpoints"])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType.COMPLETED]))))


def _stray_servers(lab) -> list:
    """The `prefect server start` processes of this module's serves still alive."""
    return [p for p in psutil.process_iter(["cmdline", "environ"])
            if "server" in (p.info["cmdline"] or []) and (p.info["environ"] or {}).get("REPEVAL_HOME")
            == lab["env"]["REPEVAL_HOME"]]


def _hold_a_scan(lab, served):
    """Hold the store's schedule lease, so the next scan stays RUNNING (waiting for it); the lease and the run id."""
    held = FeatureStore(lab["store"]).lease(SCHEDULE_LEASE)
    held.acquire()
    return held, _wait("a scan in progress", lambda: _running_scan(lab, served), served)


def test_a_killed_serve_is_reclaimed_by_the_next_and_scans_go_on(lab):
    first = _serve(lab, "first")
    held, run_id = _hold_a_scan(lab, first)
    os.killpg(first["proc"].pid, signal.SIGKILL)  # the machine dies mid-scan
    first["proc"].wait()
    held.release()
    # the serve's own Prefect server (its own session) ends with it: nothing of it is left
    deadline = time.monotonic() + 60
    while _stray_servers(lab) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _stray_servers(lab)

    second = _serve(lab, "second")
    line = _wait("the reclaim line", lambda: re.search(rf"reclaimed flow run \S+ \({run_id}\) of dead serve pid "
                                                         rf"(\d+) on host (\S+) \(.*\): marked Crashed, slot released",
                                                         second["log"]()), second)
    assert line.group(2) == socket.gethostname()
    assert int(line.group(1)) == first["proc"].pid
    done = _completed_scans(second)
    _wait("a scan after the reclaim", lambda: _completed_scans(second) > done, second, 60)
    lab["second"] = second


def test_sigterm_to_the_group_and_its_server_stops_serve_in_seconds_with_one_line(lab):
    served = lab.get("second") or _serve(lab, "third")
    held, _ = _hold_a_scan(lab, served)  # a scan in progress when the signal comes
    children = psutil.Process(served["proc"].pid).children(recursive=True)
    server = [c for c in children if "server" in c.cmdline()]
    try:  # as systemd stops a unit: every process at once, the Prefect server first
        server[0].terminate()
        os.killpg(served["proc"].pid, signal.SIGTERM)
        signalled = time.monotonic()
        assert served["proc"].wait(timeout=60) == 128 + signal.SIGTERM
        print(f"stopped {time.monotonic() - signalled:.1f} s after SIGTERM")
    finally:
        held.release()
    log = served["log"]()
    assert log.count("repeval serve: stopped by SIGTERM") == 1 and "Traceback" not in log, log[-4000:]
    _all_gone(children)


def _all_gone(processes) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = [c for c in processes if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.5)
    raise AssertionError(f"left behind: {[c.cmdline() for c in alive]}")


def test_sigint_to_serve_alone_exits_130(lab):
    served = _serve(lab, "fourth")
    children = psutil.Process(served["proc"].pid).children(recursive=True)
    served["proc"].send_signal(signal.SIGINT)  # at once: serve may still be setting its schedules up
    try:
        assert served["proc"].wait(timeout=60) == 128 + signal.SIGINT, served["log"]()[-4000:]
    except subprocess.TimeoutExpired:  # a serve left running would take the next tests' scans
        os.killpg(served["proc"].pid, signal.SIGKILL)
        raise AssertionError("serve ignored SIGINT:\n" + served["log"]()[-4000:]) from None
    log = served["log"]()
    assert log.count("repeval serve: stopped by SIGINT") == 1 and "Traceback" not in log, log[-4000:]
    _all_gone(children)


def test_serve_whose_prefect_server_died_stops_with_one_line(lab):
    served = _serve(lab, "fifth")
    children = psutil.Process(served["proc"].pid).children(recursive=True)
    server = [c for c in children if "server" in c.cmdline()]
    server[0].kill()
    assert served["proc"].wait(timeout=90) == 1  # nothing is served without it
    log = served["log"]()
    assert "repeval serve: stopped: its Prefect server stopped answering" in log and "Traceback" not in log, log
    assert "server.log" in log
    _all_gone(children)


def test_a_run_of_the_config_reclaims_a_killed_serve_too(lab):
    served = _serve(lab, "sixth")
    held, run_id = _hold_a_scan(lab, served)
    os.killpg(served["proc"].pid, signal.SIGKILL)
    served["proc"].wait()
    held.release()
    deadline = time.monotonic() + 60
    while _stray_servers(lab) and time.monotonic() < deadline:  # one server on the database at a time
        time.sleep(0.5)
    out = subprocess.run([sys.executable, "-m", "flows.cli", "run", lab["config"]], cwd=REPO, env=lab["env"],
                         capture_output=True, text=True, timeout=300)
    assert re.search(rf"\[run\] reclaimed flow run \S+ \({run_id}\) of dead serve pid {served['proc'].pid} ",
                     out.stderr), out.stderr[-4000:]
