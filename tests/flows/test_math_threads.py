"""Math threads of local Dask worker processes: Dask's nanny would start each with one
OpenMP/BLAS thread, so one large cell on an otherwise idle machine would use one core."""

from __future__ import annotations

import os

import pytest

from flows.runtime import math_threads, worker_math_threads


def _threads_seen() -> dict:
    import torch
    from threadpoolctl import threadpool_info

    return {"torch": torch.get_num_threads(), "env": os.environ.get("OMP_NUM_THREADS"),
            "blas": sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="torch and OpenBLAS use at most one thread per core")
def test_worker_processes_start_with_the_threads_asked(monkeypatch):
    from distributed import Client, LocalCluster

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as under a test runner: the setting still wins
    with worker_math_threads(2):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0")
    with cluster, Client(cluster) as client:
        seen = client.submit(_threads_seen).result()
    # torch and numpy's BLAS read them at import, before any task: both must see 2, not 1
    assert seen == {"torch": 2, "env": "2", "blas": [2]}
    assert os.environ["OMP_NUM_THREADS"] == "1"  # this process's own setting is back


def test_an_explicit_setting_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert math_threads(4, n_workers=2, threads_per_worker=2) == 4


@pytest.mark.parametrize(("limit", "expected"), [("3", 3), ("1", 1), ("64", 16)])
def test_auto_stays_within_the_limit_the_environment_chose(monkeypatch, limit, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", limit)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert math_threads("auto", n_workers=1, threads_per_worker=1) == expected


@pytest.mark.parametrize(("workers", "threads", "expected"), [(1, 1, 16), (2, 1, 8), (2, 2, 4), (4, 8, 1)])
def test_auto_shares_the_cores_between_worker_threads(monkeypatch, workers, threads, expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert math_threads("auto", n_workers=workers, threads_per_worker=threads) == expected
