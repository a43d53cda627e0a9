"""A score moves only when the features do: the logistic, ridge and k-NN probes at their
defaults give the same choice and the same test predictions (to within one test image) from
features a few float32 ulps apart, computed by ATen's scalar kernels on one thread, as from
the originals on this process's kernels and threads.

The second computation runs in a child process (the kernels are chosen when torch loads);
the feature sets are pooled-CNN-like (ReLU of a random projection of class clusters), one
well separated and one with overlapping classes, small enough that the probes' selections
meet flat validation curves. benchmarks/bench_stability.py measures the same on more sets
and more variants.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.cli import REPO, cli_env

PROTOCOLS = ("logistic", "ridge", "knn")
SELECTION = {"logistic": "C", "ridge": "alpha"}
_CHILD = r"""
import json, sys
import numpy as np
import torch
from tests.pipeline.test_stable_scores import cells, move_ulps
torch.set_num_threads(1)
print(json.dumps(cells(moved=True)))
"""


def feature_sets():
    out = []
    for name, n_train, n_test, d, k, separation in (("separated", 240, 200, 64, 6, 0.6),
                                                     ("overlapping", 300, 240, 96, 12, 0.3)):
        rng = np.random.default_rng([n_train, d, k])
        means, W = rng.normal(0.0, separation, (k, 32)), rng.normal(0.0, 1 / np.sqrt(32), (32, d))
        bias = rng.normal(-0.5, 0.5, d)
        splits = {}
        for split, n in (("train", n_train), ("test", n_test)):
            y = rng.permutation(np.arange(n) % k)
            X = np.maximum((means[y] + rng.normal(size=(n, 32))) @ W + bias, 0.0).astype(np.float32)
            splits[split] = (X, y)
        out.append((name, splits, k))
    return out


def move_ulps(X: np.ndarray, seed: int, ulps: int = 4) -> np.ndarray:
    """Every nonzero value moved by a random whole number of float32 ulps in [-ulps, ulps]."""
    bits = X.view(np.int32).copy()
    step = np.random.default_rng(seed).integers(-ulps, ulps + 1, X.shape).astype(np.int32)
    bits[X != 0] += step[X != 0]
    return bits.view(np.float32)


def cells(moved: bool = False) -> dict:
    from pipeline.protocols.cell import EvalData
    from pipeline.protocols.registry import get_protocol

    out = {}
    for name, splits, k in feature_sets():
        (X_train, y_train), (X_test, y_test) = splits["train"], splits["test"]
        if moved:
            X_train, X_test = move_ulps(X_train, 1), move_ulps(X_test, 2)
        data = EvalData(y_train=y_train, X_test=X_test, y_test=y_test, n_classes=k, X_train=X_train)
        for protocol in PROTOCOLS:
            result = get_protocol(protocol)(data, {"device": "cpu"})
            out[f"{protocol} {name}"] = {"selection": result.diagnostics.get(SELECTION.get(protocol)),
                                         "predictions": result.evidence.values.tolist(),
                                         "score": result.metrics["score"],
                                         "warnings": sorted(w["code"] for w in result.warnings)}
    return out


@pytest.mark.slow
def test_the_probes_choose_and_predict_the_same_from_other_kernels_threads_and_rounding():
    env = cli_env() | {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    child = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    theirs = json.loads(child.stdout.strip().splitlines()[-1])
    ours = cells()
    assert set(ours) == set(theirs) and len(ours) == 2 * len(PROTOCOLS)
    for cell, mine in ours.items():
        other = theirs[cell]
        assert mine["selection"] == other["selection"], cell  # exactly the same choice
        moved = int(np.sum(np.array(mine["predictions"]) != np.array(other["predictions"])))
        n_test = len(mine["predictions"])
        assert moved <= 1, (cell, moved)
        assert abs(mine["score"] - other["score"]) <= 1 / n_test + 1e-12, cell
        assert "selection_fragile" not in mine["warnings"], cell
