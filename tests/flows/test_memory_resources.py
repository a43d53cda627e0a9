"""Dask knows a cell's size: embedded workers declare a MEMORY resource, tasks that ask for
more than half of it never run two at once on a worker (with three threads free), and
the benchmark flow asks, for each evaluation task, exactly what its largest cell needs."""

from __future__ import annotations

import json
import time

import pytest
from prefect import flow, task

from flows.benchmark import run_plan
from flows.cluster_memory import memory_request
from flows.runtime import task_runner
from jobs.evaluation.cell_memory import MEMORY_RESOURCE, declared_memory, task_bytes
from jobs.config import load_config
from jobs.run.plan import make_plan
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.jobs.test_cell_memory import _import, _npy_folder, _stored_config

LIMIT = 400 * 2**20  # a small worker: 300 MiB declared


@task
def _hold(folder: str, name: str) -> dict:
    """Sleep a moment, recording when it ran and what its worker declares."""
    from distributed import get_worker

    started = time.time()
    time.sleep(1.0)
    record = {"start": started, "end": time.time(), "declared": get_worker().state.total_resources}
    with open(f"{folder}/{name}.json", "w") as f:
        json.dump(record, f)
    return record


def _max_overlap(records: list[dict]) -> int:
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


@pytest.mark.slow
def test_tasks_asking_for_more_than_half_a_workers_memory_run_one_at_a_time(tmp_path, prefect_harness):
    declared = declared_memory(LIMIT)

    @flow(task_runner=task_runner(None, n_workers=1, threads_per_worker=3, processes=False, memory_limit=LIMIT))
    def two_groups(folder: str):
        with memory_request(int(declared * 0.6)):
            big = [_hold.submit(folder, f"big{i}") for i in range(3)]
        [f.result() for f in big]
        with memory_request(int(declared * 0.3)):
            small = [_hold.submit(folder, f"small{i}") for i in range(3)]
        return [f.result() for f in big], [f.result() for f in small]

    big, small = two_groups(str(tmp_path))
    assert all(r["declared"] == {MEMORY_RESOURCE: declared} for r in big + small)  # declared by the runner
    assert _max_overlap(big) == 1  # 0.6 of the memory each: one at a time, though 3 threads are free
    assert _max_overlap(small) >= 2  # 0.3 each: the same worker runs them side by side


@pytest.mark.slow
def test_the_flow_asks_for_each_evaluation_tasks_largest_cell(tmp_path, prefect_harness):
    from distributed import LocalCluster
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Restrictions(SchedulerPlugin):
        def __init__(self, scheduler):
            self.scheduler, self.seen = scheduler, {}

        def transition(self, key, start, finish, *args, **kwargs):
            ts = self.scheduler.tasks.get(key)
            if finish == "processing" and ts is not None:
                self.seen[str(key)] = dict(ts.resource_restrictions or {})

    store = FeatureStore(str(tmp_path / "store"))
    _import(store, _npy_folder(tmp_path / "npy"))
    raw = _stored_config(tmp_path, cells_per_task=1)
    plan = make_plan(load_config(raw))
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0",
                      resources={MEMORY_RESOURCE: 2 * max(plan.cell_memory.values())}) as cluster:
        plugin = Restrictions(cluster.scheduler)
        cluster.scheduler.add_plugin(plugin)
        summary = run_plan(plan, dask_address=cluster.scheduler_address)
    assert summary["computed"] == 3 and not summary["failures"] and len(Ledger(store)) == 3
    asked = sorted(r[MEMORY_RESOURCE] for k, r in plugin.seen.items() if "evaluate" in k)
    assert asked == sorted(task_bytes([c.label()], plan.cell_memory) for c in plan.cells)
