"""An existing Dask cluster for the tests that need one: `dask scheduler` and `dask worker`
processes on 127.0.0.1, each in a session of its own, stopped workers first."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

BIN = Path(sys.executable).parent


@contextlib.contextmanager
def cli_cluster(tmp: Path, workers: dict[str, list[str]], env: dict[str, str]) -> Iterator[tuple[str, dict]]:
    """A scheduler and one single-threaded worker process per entry of ``workers`` (name ->
    extra `dask worker` arguments); yields (scheduler address, {name: Popen}, the scheduler
    under ``"scheduler"``). Logs and the workers' folders go to ``tmp``."""
    env = {**env, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}

    def start(args: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / "dask"), *args], stdout=open(tmp / log, "wb"), stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)

    sched_file = tmp / "scheduler.json"  # the scheduler writes its address here; the workers wait for it
    procs = {"scheduler": start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                                 "--scheduler-file", str(sched_file)], "scheduler.log")}
    try:
        common = ["--scheduler-file", str(sched_file), "--nthreads", "1", "--host", "127.0.0.1",
                  "--dashboard-address", ":0", "--no-nanny"]
        for name, extra in workers.items():
            # a SIGKILLed worker leaves its folder behind: under tmp, not in /tmp
            procs[name] = start(["worker", *common, "--name", name, "--local-directory", str(tmp / name), *extra],
                                f"{name}.log")
        deadline = time.monotonic() + 90
        while not sched_file.exists():
            assert time.monotonic() < deadline, (tmp / "scheduler.log").read_text()
            time.sleep(0.1)
        from distributed import Client  # deferred: the Dask client only where a cluster is started

        with Client(scheduler_file=str(sched_file), timeout=60) as client:
            client.wait_for_workers(len(workers), timeout=120)
            address = client.scheduler.address
        yield address, procs
    finally:
        stop([p for n, p in procs.items() if n != "scheduler"])
        stop([procs["scheduler"]])  # last: a worker whose scheduler closed under it can hang on SIGTERM


def stop(procs: list[subprocess.Popen], grace: float = 20) -> None:
    """SIGTERM to each process's group, then SIGKILL to those still running after ``grace`` s."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
