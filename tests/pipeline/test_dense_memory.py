"""Peak memory of the dense protocols against their memory model (``memory_bytes``).

Each case runs in a fresh process (this module run with ``python -m``: the same
measurement as ``memory_child``: hold the maps and targets, warm the protocol up on a tiny
copy, reset the RSS peak, run once) at two train sizes. The model counts the maps and
targets held plus the cell's own work (predictions, metric, a minibatch's activations);
the measured peak growth during the run must not exceed that work at either size, so a
cell the planner admits fits where it was scheduled. The seconds are in
benchmarks/bench_dense.py.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def run_child(task: str, sizes: list[tuple[int, int]]) -> list[dict]:
    spec = {"task": task, "sizes": sizes, **CASES[task]}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tests.pipeline.test_dense_memory", json.dumps(spec)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset the RSS peak")
@pytest.mark.parametrize("task", list(CASES))
def test_dense_peak_memory_within_its_model(task):
    # the large cell holds more test predictions and metric work (tens of KiB per test image at 112 x 112):
    # the rows-dependent terms of the model are exercised, not only its fixed allowance
    small, large = run_child(task, [(32, 32), (64, 512)])
    assert large["growth"] - small["growth"] > 4 * 2**20, (small, large)
    for point in (small, large):
        summary = (f"{task} at {point['n_train']} train maps: growth {point['growth'] / 2**20:.1f} MiB, "
                   f"modelled {point['estimate_extra'] / 2**20:.1f} MiB")
        assert point["growth"] <= point["estimate_extra"], f"{summary}: memory_bytes underestimates"
        assert point["score"] is not None and np.isfinite(point["score"]), summary  # the run did real work


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
