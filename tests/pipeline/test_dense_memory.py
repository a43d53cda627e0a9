"""Peak memory of the dense protocols against their memory model (``memory_bytes``).

Each case runs in a process of its own at two train sizes: forked for it from a server
(this module run with ``python -m``, ``memory_child.serve``) that has imported torch and
the protocols and run nothing, so the start-up is paid once and no other case's leftovers
can hide its growth. There, the same measurement as ``memory_child``: hold the maps and
targets, warm the protocol up on a tiny copy, reset the RSS peak, run once. The model
counts the maps and targets held plus the cell's own work (predictions, metric, a
minibatch's activations); the measured peak growth during the run must not exceed that
work at either size, so a cell the planner admits fits where it was scheduled. The
seconds are in benchmarks/bench_dense.py.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.pipeline.memory_child import MeasurementServer, serve

GRID, DIM, SIZE = 14, 64, 112
CASES = {
    "segmentation": {"settings": {"learning_rates": [0.01, 0.1], "epochs": 1, "batch_size": 8}, "n_classes": 10},
    # the protocol's default head and formulation (pspnet, classification), smaller
    "normals": {"settings": {"epochs": 1, "hidden_units": 32, "clusters": 8, "batch_size": 4}, "n_classes": 3},
}


def _cell(task: str, n: int, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    maps = rng.normal(size=(n, GRID, GRID, DIM)).astype(np.float16)
    if task == "segmentation":
        return maps, rng.integers(0, K, (n, SIZE, SIZE)).astype(np.uint8)
    normals = rng.normal(size=(n, SIZE, SIZE, 3))
    return maps, (normals / np.linalg.norm(normals, axis=-1, keepdims=True)).astype(np.float16)


def measure(task: str, settings: dict, n_train: int, n_test: int, K: int) -> dict:
    """Hold one cell's arrays, run the protocol once, report its peak RSS growth and model."""
    from pipeline.protocols import get_protocol
    from pipeline.protocols.dense.data import DenseData
    from tests.pipeline.memory_child import _status_bytes

    protocol = get_protocol(task)
    X_tr, y_tr = _cell(task, n_train, K, 0)
    X_te, y_te = _cell(task, n_test, K, 1)
    data = DenseData(task=task, X_train=X_tr, y_train=y_tr, X_test=X_te, y_test=y_te, n_classes=K)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status_bytes("VmRSS")
    result = protocol(data, settings)
    peak = _status_bytes("VmHWM")
    held = X_tr.nbytes + X_te.nbytes + y_tr.nbytes + y_te.nbytes
    estimate = protocol.memory_bytes(n_train, n_test, 0, DIM, K, X_tr.itemsize, settings, n_tokens=GRID * GRID,
                                     target_pixels=SIZE * SIZE)
    return {"n_train": n_train, "held": held, "growth": peak - before, "estimate_extra": estimate - held,
            "score": result.metrics.get("score")}


def main(spec: dict) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    task, settings, K = spec["task"], spec["settings"], spec["n_classes"]
    measure(task, settings, 8, 4, K)  # warm-up: imports and one-time allocations
    return [measure(task, settings, n_train, n_test, K) for n_train, n_test in spec["sizes"]]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The forking measurement server: torch's and the protocols' imports paid once for both tasks."""
    server = MeasurementServer("tests.pipeline.test_dense_memory", tmp_path_factory.mktemp("dense") / "server.log")
    yield server
    server.close()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset the RSS peak")
@pytest.mark.parametrize("task", list(CASES))
def test_dense_peak_memory_within_its_model(task, server):
    # the large cell holds more test predictions and metric work (tens of KiB per test image at 112 x 112):
    # the rows-dependent terms of the model are exercised, not only its fixed allowance
    small, large = server.measure({"task": task, "sizes": [(32, 32), (64, 512)], **CASES[task]})
    assert large["growth"] - small["growth"] > 4 * 2**20, (small, large)
    for point in (small, large):
        summary = (f"{task} at {point['n_train']} train maps: growth {point['growth'] / 2**20:.1f} MiB, "
                   f"modelled {point['estimate_extra'] / 2**20:.1f} MiB")
        assert point["growth"] <= point["estimate_extra"], f"{summary}: memory_bytes underestimates"
        assert point["score"] is not None and np.isfinite(point["score"]), summary  # the run did real work


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        # what every run imports anyway, before its warm-up: torch, the registry, the dense runners and heads
        serve(main, ["torch", "pipeline.protocols", "pipeline.protocols.dense.data", "pipeline.protocols.dense.runners",
                     "pipeline.protocols.dense.training", "pipeline.protocols.dense.heads",
                     "pipeline.protocols.inputs.features"])
    else:
        print(json.dumps(main(json.loads(sys.argv[1]))))
