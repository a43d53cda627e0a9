"""Where flows run: Prefect's API and the Dask cluster, embedded or existing."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from jobs.config.run import repeval_home
from jobs.evaluation.cell_memory import MEMORY_RESOURCE, declared_memory
from pipeline.protocols.inputs.devices import available_cores

log = logging.getLogger(__name__)


def prepare_environment(verbose: bool = False) -> None:
    """Call before Prefect is imported: offline hub, no analytics, private Prefect home."""
    # Runs log through Prefect's run loggers at INFO (their lines are kept with each run by
    # the Prefect API), but Prefect's console handler prints only with ``verbose``: the
    # terminal shows repeval's own progress and summary lines, never Prefect's tracebacks.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect gives its local server 20 s to start; a busy laptop (or a CI runner) needs more
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_HOME", str(repeval_home() / "prefect"))
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # Prefect makes only the leaf
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    for logger in ("FLOW_RUNS", "TASK_RUNS"):  # what a run logs is kept with the run
        os.environ.setdefault(f"PREFECT_LOGGING_LOGGERS_PREFECT_{logger}_LEVEL", "INFO")
    if verbose:
        os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] = "INFO"
        os.environ["DASK_LOGGING__DISTRIBUTED"] = "info"
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")  # cluster start/stop chatter
    # Dask worker processes are daemonic by default, and daemonic processes may not start
    # the DataLoader worker processes that decode images (extract.num_workers > 0).
    os.environ.setdefault("DASK_DISTRIBUTED__WORKER__DAEMON", "False")


@contextlib.contextmanager
def prefect_api(scheduler: bool = False) -> Iterator[str]:
    """Yield the API URL this run reports to, starting one local API if none is set."""
    # ``scheduler``: the local API must create scheduled runs (``repeval serve``). Prefect's
    # temporary server runs no background services, so a full local server is started.
    prepare_environment()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    current = PREFECT_API_URL.value()
    if current:  # a Prefect server, or a test harness: share it with the workers
        previous = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = current
        try:
            yield current
        finally:
            flush_run_logs()  # whichever API: the run's last lines are stored with it
            _restore("PREFECT_API_URL", previous)
        return
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    with (full_server() if scheduler else temporary_server()) as url:
        os.environ["PREFECT_API_URL"] = url
        try:
            with temporary_settings(updates={PREFECT_API_URL: url}):
                try:
                    yield url
                finally:
                    flush_run_logs()  # the run's last log lines reach the API before it stops
        finally:
            os.environ.pop("PREFECT_API_URL", None)


def flush_run_logs(timeout: float = 60.0) -> None:
    """Block until this process's queued run logs are stored by the Prefect API."""
    # Prefect ships run logs from a background worker in batches (every 2 s by default), so
    # without this the last lines of a run (its summary) may reach the API after the caller
    # has moved on, or never, when the API stops first. Outside an event loop only (a
    # flow's own code, and the CLI, run none); ``timeout`` bounds a stuck API.
    import asyncio

    from prefect.logging.handlers import APILogHandler, APILogWorker

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: wait for the drain, as long as it takes
        APILogWorker.drain_all(timeout=timeout)
        return
    APILogHandler().flush()  # inside a loop: Prefect drains in a thread of its own


@contextlib.contextmanager
def temporary_server() -> Iterator[str]:
    """Prefect's temporary local API (no background services) for the length of a run; its URL."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    try:
        yield server.api_url
    finally:
        server.stop()


@contextlib.contextmanager
def full_server(timeout: float = 120.0) -> Iterator[str]:
    """``prefect server start`` on a free loopback port, with its services (scheduler)."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    log_path = Path(os.environ["PREFECT_HOME"]) / "server.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
             "--analytics-off"],  # with its web UI: the run history, one click from the banner
            stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, "PREFECT_API_URL": ""},
            # out of serve's process group: a signal to the group (Ctrl-C, systemd) reaches serve,
            # which stops its runs while the server still records them, then stops the server;
            # and the server ends with serve when serve is killed (kill -9: no stray server)
            start_new_session=True, preexec_fn=_end_with_parent,
        )
    _local_servers.append(proc)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {proc.returncode}; see {log_path}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not answer within {timeout} s; see {log_path}")
            time.sleep(0.5)
        yield url
    finally:
        _local_servers.remove(proc)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


#: The ``prefect server start`` processes of :func:`full_server` now running in this process.
_local_servers: list = []


def local_server_exit() -> int | None:
    """The exit status of this process's local Prefect server (:func:`full_server`) if it has
    died; None while it runs, or when the API is not one this process started."""
    # A dead server is certain at once, where its clients only see failed requests, which they
    # retry for a minute before giving up.
    for proc in _local_servers:
        if proc.poll() is not None:
            return proc.returncode
    return None


def _end_with_parent() -> None:
    """In a child before exec (Linux): SIGTERM to it when the process that started it dies."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
    except (OSError, AttributeError):  # not Linux: the server is stopped by serve's own exit only
        pass


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def gpu_count() -> int:
    """CUDA devices torch sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_workers(n_workers: int) -> int:
    """Workers of the embedded LocalCluster: as asked, and at least one per GPU."""
    return max(n_workers, gpu_count())


_MATH_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def math_threads(setting: int | str, n_workers: int, threads_per_worker: int) -> int:
    """Threads each task's torch/BLAS math may use in a local worker process."""
    # ``auto``: this machine's cores shared by every worker thread (never more threads than
    # cores), at least one, and at most OMP_NUM_THREADS where this process has it (a limit
    # the user or a test runner chose).
    if setting != "auto":
        return int(setting)
    share = max(1, available_cores() // max(1, n_workers * threads_per_worker))
    limit = os.environ.get("OMP_NUM_THREADS", "")
    return min(share, int(limit)) if limit.isdigit() and int(limit) >= 1 else share


@contextlib.contextmanager
def worker_math_threads(threads: int) -> Iterator[None]:
    """Give local worker processes started within the block ``threads`` OMP/MKL/OpenBLAS threads."""
    # Dask's nanny exports OMP_NUM_THREADS=1 (and MKL's, OpenBLAS's) before it spawns a worker,
    # so that many one-thread tasks do not oversubscribe the cores; one large cell would then
    # use one core of many. The variables must be set before the worker imports numpy and
    # torch, hence the nanny's pre-spawn settings rather than its ``env``; and this process's
    # own variables too, since the nanny lets them override its settings.
    import dask

    key = "distributed.nanny.pre-spawn-environ"
    previous = {name: os.environ.get(name) for name in _MATH_THREAD_VARIABLES}
    os.environ.update({name: str(int(threads)) for name in _MATH_THREAD_VARIABLES})
    try:
        with dask.config.set({f"{key}.{name}": int(threads) for name in _MATH_THREAD_VARIABLES}):
            yield
    finally:
        for name, value in previous.items():
            _restore(name, value)


def task_runner(address: str | None, n_workers: int = 2, threads_per_worker: int = 1, processes: bool = True,
                gpu: bool = False, memory_limit: int | None = None):
    """prefect-dask's DaskTaskRunner on an existing scheduler or a new LocalCluster."""
    # ``gpu``: extraction tasks ask for a ``GPU`` resource, so local workers declare one
    # each (one per GPU of this machine, at least one worker). ``memory_limit``: bytes per
    # local worker; each then declares its ``MEMORY`` resource (flows.cluster_memory).
    # Worker processes get it as Dask's memory limit too; workers that are threads of one
    # process do not (Dask would compare the whole process with one worker's share).
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    kwargs = {"n_workers": local_workers(n_workers), "threads_per_worker": threads_per_worker,
              "processes": processes, "dashboard_address": ":0"}
    resources = {"GPU": 1} if gpu else {}
    if memory_limit is not None:
        if processes:
            kwargs["memory_limit"] = int(memory_limit)
        resources[MEMORY_RESOURCE] = declared_memory(memory_limit)
    if resources:
        kwargs["resources"] = resources
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)
