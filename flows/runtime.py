"""Where flows run: Prefect's API and the Dask cluster, embedded or existing.

Embedded default: one temporary local Prefect API for the whole run, exported through
PREFECT_API_URL so that every Dask worker process reports to it. Without that, each
worker process would start a temporary server of its own (seen: a 9-task flow took
22.5 s that way against 5.7 s with one server). Prefect's state for the embedded mode
lives in a repeval folder, never in the user's ~/.prefect.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def repeval_home() -> Path:
    return Path(os.environ.get("REPEVAL_HOME", Path.home() / ".cache" / "repeval"))


def prepare_environment() -> None:
    """Call before Prefect is imported: offline hub, no analytics, private Prefect home."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_HOME", str(repeval_home() / "prefect"))
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # cluster start/stop chatter


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """Yield the API URL this run reports to, starting one local API if none is set."""
    prepare_environment()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    current = PREFECT_API_URL.value()
    if current:  # a Prefect server, or a test harness: share it with the workers
        previous = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = current
        try:
            yield current
        finally:
            _restore("PREFECT_API_URL", previous)
        return
    from prefect.server.api.server import SubprocessASGIServer

    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    server = SubprocessASGIServer()
    server.start()
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def task_runner(address: str | None, n_workers: int = 2, threads_per_worker: int = 1, processes: bool = True):
    """prefect-dask's DaskTaskRunner on an existing scheduler or a new LocalCluster.

    Local workers declare a ``GPU`` resource when this machine has GPUs, so that
    extraction tasks (which ask for one) get a GPU each.
    """
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    gpus = gpu_count()
    kwargs = {"n_workers": max(n_workers, gpus), "threads_per_worker": threads_per_worker,
              "processes": processes, "dashboard_address": None}
    if gpus:
        kwargs["resources"] = {"GPU": 1}
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)
