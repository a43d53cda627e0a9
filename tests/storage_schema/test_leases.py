"""Leases decide the single writer of an array group, across real processes."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from storage_schema import FeatureStore, keys
from tests.helpers.leases import KEY, LeaseContract


def _race(store_url: str, barrier, results) -> None:
    lease = FeatureStore(store_url).lease(KEY, ttl=30)
    barrier.wait()
    won = lease.try_acquire()
    results.put((os.getpid(), won))
    if won:
        time.sleep(0.5)  # hold it while the others are still trying
        lease.release()


class TestLeaseContract(LeaseContract):
    """On a local folder."""


def test_exactly_one_of_racing_processes_acquires(store_url):
    FeatureStore(store_url)
    ctx = mp.get_context("spawn")
    n = 6
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(store_url, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
    assert sum(won for _, won in outcomes) == 1


def test_killed_holder_on_this_machine_is_taken_over_before_its_ttl(store_url):
    FeatureStore(store_url)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from storage_schema import FeatureStore
        FeatureStore({store_url!r}).lease({KEY!r}, ttl=3600).acquire()
        print("held", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = FeatureStore(store_url).lease(KEY, ttl=3600)
        assert not waiter.try_acquire()  # alive: its one-hour lease holds
        holder.send_signal(signal.SIGKILL)
        # Not reaped yet (no wait()): a zombie counts as gone too. No TTL is waited out.
        deadline = time.monotonic() + 30
        while not waiter.try_acquire():
            assert time.monotonic() < deadline, "the killed holder's lease was not taken over"
            time.sleep(0.02)
        assert waiter.current().generation == 1
        waiter.release()
    finally:
        holder.kill()
        holder.wait()


def _lease_record(store: FeatureStore, process: dict) -> None:
    record = {"owner": "x:1:y", "heartbeat": time.time(), "ttl": 3600, "released": False, "process": process}
    assert store.backend.create_exclusive(keys.lease_generation_key(KEY, 0), json.dumps(record).encode())


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("holder", ["other-host", "other-pid-namespace", "other-boot", "no-process-record",
                                    "live", "dead", "pid-reused"])
def test_only_a_holder_known_dead_on_this_machine_is_taken_over_early(store_url, holder):
    from storage_schema.leases import _machine, _start_time

    store = FeatureStore(store_url)
    here, pid = dict(_machine()), os.getpid()
    process = {**here, "pid": _dead_pid(), "started": 1}
    if holder == "other-host":
        process["host"] += "-elsewhere"
    elif holder == "other-pid-namespace":
        process["pid_ns"] = "pid:[1]"
    elif holder == "other-boot":
        process["boot_id"] = "0" * 36
    elif holder == "no-process-record":  # written by an older repeval
        process = None
    elif holder == "live":
        process.update(pid=pid, started=_start_time(pid))
    elif holder == "pid-reused":  # the holder's pid now belongs to a younger process
        process.update(pid=pid, started=_start_time(pid) - 1)
    _lease_record(store, process)
    lease = store.lease(KEY, ttl=3600)
    assert lease.try_acquire() == (holder in ("dead", "pid-reused"))
    lease.release()
