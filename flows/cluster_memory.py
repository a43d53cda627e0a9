"""The memory each Dask worker offers evaluation cells, and the tasks' requests for it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from jobs.evaluation.cell_memory import MEMORY_RESOURCE, declared_memory, format_bytes, parse_bytes
from jobs.config import DaskSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerMemory:
    """What the workers of a cluster offer evaluation cells."""

    capacities: list[int]
    declared: bool
    where: str


def machine_memory() -> int:
    """This machine's memory available to processes (its cgroup limit where lower)."""
    from distributed.system import MEMORY_LIMIT

    return int(MEMORY_LIMIT)


def local_worker_limit(settings: DaskSettings, n_workers: int) -> int:
    """The memory limit of each embedded LocalCluster worker, in bytes."""
    if settings.memory_limit == "auto":
        return machine_memory() // max(1, n_workers)
    return parse_bytes(settings.memory_limit, "config.dask.memory_limit")


def local_memory(settings: DaskSettings, n_workers: int) -> WorkerMemory:
    """What the embedded LocalCluster's workers will offer."""
    limit = local_worker_limit(settings, n_workers)
    where = f"the local cluster ({n_workers} workers of {format_bytes(limit)})"
    return WorkerMemory([declared_memory(limit)] * n_workers, True, where)


def cluster_memory(address: str, timeout: float = 30.0) -> WorkerMemory:
    """What the workers of the cluster at ``address`` offer, asked of its scheduler."""
    from distributed import Client

    with Client(address, timeout=timeout) as client:
        try:
            client.wait_for_workers(1, timeout=timeout)
        except TimeoutError:
            log.warning("no Dask worker at %s yet: cells are not checked against worker memory", address)
            return WorkerMemory([], False, f"the cluster at {address}")
        workers = client.scheduler_info()["workers"].values()
    declared = [int(w["resources"][MEMORY_RESOURCE]) for w in workers if MEMORY_RESOURCE in (w.get("resources") or {})]
    if declared:
        return WorkerMemory(declared, True, f"the cluster at {address}")
    limits = [declared_memory(int(w["memory_limit"])) for w in workers if w.get("memory_limit")]
    log.warning("the workers at %s declare no %s resource: evaluation tasks run without memory requests "
                "(start workers with --resources %s=<bytes>)", address, MEMORY_RESOURCE, MEMORY_RESOURCE)
    return WorkerMemory(limits, False, f"the cluster at {address}")


@contextlib.contextmanager
def memory_request(nbytes: int | None) -> Iterator[None]:
    """Tasks submitted inside ask Dask for ``nbytes`` of the ``MEMORY`` resource (None: nothing)."""
    if nbytes is None:
        yield
        return
    import dask

    with dask.annotate(resources={MEMORY_RESOURCE: int(nbytes)}):
        yield
