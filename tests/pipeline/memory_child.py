"""Peak memory of one protocol run, measured in this fresh process (run as a module).

``python -m tests.pipeline.memory_child '{"protocol": "ridge", ...}'`` builds synthetic
class-clustered features, holds them, warms the protocol up on a tiny copy (imports and
one-time allocations), then runs it once and prints a JSON line: the feature bytes held,
the peak RSS growth during the run (VmHWM reset through /proc/self/clear_refs), the
protocol's own ``memory_bytes`` estimate and the score. The parent sets
MALLOC_MMAP_THRESHOLD_ so that freed arrays leave the RSS at once.
"""

from __future__ import annotations

import gc
import json
import sys

import numpy as np


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def features(n: int, d: int, n_classes: int, dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class-clustered features (n, d) in ``dtype`` and their labels, built in row blocks
    (the class centres are the same for every seed; the noise differs)."""
    centres = np.random.default_rng(12345).normal(0.0, 1.0, (n_classes, d)).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % n_classes).astype(np.int64)
    rng.shuffle(y)
    X = np.empty((n, d), dtype=dtype)
    for i in range(0, n, 8192):
        block = centres[y[i:i + 8192]] + rng.normal(0.0, 1.5, (len(y[i:i + 8192]), d)).astype(np.float32)
        X[i:i + 8192] = np.abs(block)
    return X, y


def token_features(n: int, d: int, n_classes: int, dtype: str, seed: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """``features`` (n, d), each row repeated as T tokens (n, T, d); T = 1: pooled (n, d)."""
    X, y = features(n, d, n_classes, dtype, seed)
    return (np.repeat(X[:, None], T, axis=1) if T > 1 else X), y


def measure(protocol, settings: dict, n_train: int, n_test: int, d: int, K: int, dtype: str, T: int = 1) -> dict:
    """Hold features of this size, run the protocol once, report its peak RSS growth."""
    from pipeline.protocols import EvalData

    X_tr, y_tr = token_features(n_train, d, K, dtype, 0, T)
    X_te, y_te = token_features(n_test, d, K, dtype, 1, T)
    data = EvalData(y_train=y_tr, X_test=X_te, y_test=y_te, n_classes=K, X_train=X_tr)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status_bytes("VmRSS")
    result = protocol(data, settings)
    peak = _status_bytes("VmHWM")
    held = X_tr.nbytes + X_te.nbytes
    estimate = protocol.memory_bytes(n_train, n_test, 0, d, K, X_tr.itemsize, settings, n_tokens=T)
    # what the estimate counts as held: the train split too unless the protocol streams it
    modelled_held = X_te.nbytes + (0 if protocol.streams_train else X_tr.nbytes)
    return {"n_train": n_train, "feature_bytes": held, "growth": peak - before,
            "ratio": (held + peak - before) / held, "estimate_extra": estimate - modelled_held,
            "score": result.metrics.get("score"), "seconds": result.seconds}


def main(spec: dict) -> list[dict]:
    """Warm the protocol up on a tiny cell, then measure each (n_train, n_test) of ``spec["sizes"]``."""
    import torch

    from pipeline.protocols import EvalData, get_protocol

    torch.set_num_threads(1)
    protocol = get_protocol(spec["protocol"])
    settings = spec.get("settings", {})
    K, d, dtype, T = spec["n_classes"], spec["dim"], spec.get("dtype", "float32"), spec.get("tokens", 1)
    X, y = token_features(2000, d, K, dtype, 2, T)
    protocol(EvalData(y_train=y, X_test=X[:200], y_test=y[:200], n_classes=K, X_train=X), settings)  # warm-up
    del X, y
    return [measure(protocol, settings, n_train, n_test, d, K, dtype, T) for n_train, n_test in spec["sizes"]]


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
