"""How far each protocol's score moves when nothing about the weights does.

Every protocol that reads pooled features runs with its defaults on a few transfer-sized
feature sets (hundreds to a few thousand rows, 10 to 100 classes, overlapping classes
included) and, when a demo store is there, on the demo's stored features. The same cells
then run again where only the arithmetic changes:

* ``ulps-<s>``: every nonzero feature moved by up to 4 float32 ulps (seed ``s``), as
  another machine's extraction rounds them;
* ``threads-1``: one thread for torch and every BLAS/OpenMP pool instead of two;
* ``avx2`` and ``scalar``: ATen's AVX2 and scalar kernels (``ATEN_CPU_CAPABILITY=avx2``
  / ``default``; oneDNN and MKL held to AVX2 for the first).

Each variant runs in its own process (kernels are chosen when torch loads). Per protocol
it prints: cells, cells whose score moved, the largest move in points and in test images
(predictions that differ from the baseline's), and how often the selection (C, alpha, ...)
moved. The baseline is this machine's own kernels on two threads.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_stability.py [--quick] [--markdown]
[--protocols logistic ridge ...] [--store demo-out/store]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import machine_line, print_tables  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROTOCOLS = ("logistic", "ridge", "knn", "ncm", "fewshot", "lowshot", "mlp")
#: the diagnostics that record what a protocol selected
SELECTION = {"logistic": ("C",), "ridge": ("alpha",), "mlp": ("weight_decay", "epochs"), "lowshot": ("alphas",)}
VARIANTS = {
    "baseline": {"threads": 2, "ulps": None, "env": {}},
    "ulps-1": {"threads": 2, "ulps": 1, "env": {}},
    "ulps-2": {"threads": 2, "ulps": 2, "env": {}},
    "ulps-3": {"threads": 2, "ulps": 3, "env": {}},
    "threads-1": {"threads": 1, "ulps": None, "env": {}},
    "avx2": {"threads": 2, "ulps": None,
             "env": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}},
    "scalar": {"threads": 2, "ulps": None, "env": {"ATEN_CPU_CAPABILITY": "default"}},
}
#: (name, train rows, test rows, width, classes, class separation): small transfer-sized sets
SETS = (("well-separated", 600, 400, 128, 10, 0.6), ("overlapping", 1000, 600, 256, 20, 0.25),
        ("many-classes", 2000, 1000, 512, 100, 0.35))
QUICK_SETS = (("well-separated", 300, 200, 64, 10, 0.6), ("overlapping", 400, 300, 128, 20, 0.25))
DEMO_LAYERS = ("pre_logits", "block3")


def synthetic(name: str, n_train: int, n_test: int, d: int, k: int, separation: float, seed: int = 0):
    """Class-clustered Gaussians in a 64-d latent space through a random projection, ReLU:
    correlated, non-negative, partly sparse, like pooled CNN features."""
    rng = np.random.default_rng([seed, n_train, d, k])
    latent = 64
    means = rng.normal(0.0, separation, (k, latent))
    W = rng.normal(0.0, 1.0 / np.sqrt(latent), (latent, d))
    b = rng.normal(-0.5, 0.5, d)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.permutation(np.arange(n) % k).astype(np.int64)
        z = means[y] + rng.normal(size=(n, latent))
        out[split] = (np.maximum(z @ W + b + 0.1 * rng.normal(size=(n, d)), 0.0).astype(np.float32), y)
    return name, out, k


def demo_sets(store_path: str, limit: int, models: list[str] | None = None):
    """The demo's stored features: every (encoder, dataset) of its store (or of ``models``),
    pre_logits and block3, at most ``limit`` arrays."""
    from storage_schema import FeatureStore

    store = FeatureStore(store_path, read_only=True)
    out = []
    for key in sorted(store.iter_feature_keys()):
        parts = key.split("/")
        if len(parts) != 5 or parts[0] != "features" or parts[3] != "train" or parts[4] not in DEMO_LAYERS:
            continue
        _, model, dataset, _, layer = parts
        if models and model not in models:
            continue
        test_key = f"features/{model}/{dataset}/test/{layer}"
        try:
            splits = {s: (store.open_array(k).read().astype(np.float32), store.labels(dataset, s).read())
                      for s, k in (("train", key), ("test", test_key))}
        except Exception:  # noqa: BLE001  an incomplete or missing split is left out
            continue
        out.append((f"demo {model} {dataset} {layer}", splits, int(max(splits["train"][1].max(),
                                                                       splits["test"][1].max())) + 1))
        if len(out) >= limit:
            break
    return out


def move_ulps(X: np.ndarray, seed: int, ulps: int = 4) -> np.ndarray:
    """Every nonzero value moved by a random whole number of float32 ulps in [-ulps, ulps]."""
    rng = np.random.default_rng([seed, X.shape[0], X.shape[1]])
    bits = X.view(np.int32).copy()
    step = rng.integers(-ulps, ulps + 1, X.shape).astype(np.int32)
    nonzero = X != 0
    # the bit pattern of a float of either sign orders its magnitude: a step is that many ulps
    bits[nonzero] += step[nonzero]
    return bits.view(np.float32)


def worker(variant: str, args) -> None:
    import torch
    from threadpoolctl import threadpool_limits

    from pipeline.protocols.cell import EvalData
    from pipeline.protocols.registry import get_protocol

    spec = VARIANTS[variant]
    torch.set_num_threads(spec["threads"])
    threadpool_limits(spec["threads"])
    sets = [synthetic(*s) for s in (QUICK_SETS if args.quick else SETS)]
    if args.store:
        sets += demo_sets(args.store, args.demo_cells, args.demo_models)
    results = {}
    for name, splits, k in sets:
        (Xtr, ytr), (Xte, yte) = splits["train"], splits["test"]
        if spec["ulps"] is not None:
            Xtr, Xte = move_ulps(Xtr, 2 * spec["ulps"]), move_ulps(Xte, 2 * spec["ulps"] + 1)
        data = EvalData(y_train=ytr, X_test=Xte, y_test=yte, n_classes=k, X_train=Xtr)
        for protocol in args.protocols:
            started = time.perf_counter()
            settings = {"device": "cpu"}
            if protocol == "fewshot":  # the defaults' 5 ways, or every class of a smaller set
                settings["n_way"] = min(5, k)
            result = get_protocol(protocol)(data, settings)
            diag = result.diagnostics
            results[f"{protocol}|{name}"] = {
                "score": float(result.metrics["score"]),
                "selection": {key: diag.get(key) for key in SELECTION.get(protocol, ())},
                "evidence": np.asarray(result.evidence.values).ravel().tolist() if result.evidence else [],
                "warnings": sorted(w["code"] for w in result.warnings),
                "selection_set": diag.get("selection_set"),
                "seconds": time.perf_counter() - started,
                "capability": torch.backends.cpu.get_cpu_capability(),
            }
    Path(args.out).write_text(json.dumps(results))


def run_variant(variant: str, args, folder: str) -> dict:
    out = os.path.join(folder, f"{variant}.json")
    env = {**os.environ, **VARIANTS[variant]["env"], "OMP_NUM_THREADS": str(VARIANTS[variant]["threads"]),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, __file__, "--worker", variant, "--out", out, "--protocols", *args.protocols,
           "--demo-cells", str(args.demo_cells)] + (["--quick"] if args.quick else []) + (
           ["--store", args.store] if args.store else []) + (
           ["--demo-models", *args.demo_models] if args.demo_models else [])
    subprocess.run(cmd, env=env, check=True)
    return json.loads(Path(out).read_text())


def compare(runs: dict[str, dict], protocols) -> list[list]:
    base = runs["baseline"]
    rows = []
    for protocol in protocols:
        cells = [c for c in base if c.split("|")[0] == protocol]
        moved_cells, flips, checks, worst_points, worst_images = set(), 0, 0, 0.0, 0
        per_variant = {}
        for variant, run in runs.items():
            if variant == "baseline":
                continue
            moved = 0
            for cell in cells:
                a, b = base[cell], run[cell]
                checks += 1
                points = 100 * abs(a["score"] - b["score"])
                ea, eb = np.asarray(a["evidence"]), np.asarray(b["evidence"])
                images = int(np.sum(ea != eb)) if ea.shape == eb.shape else max(ea.size, eb.size)
                if points > 1e-9 or images:
                    moved += 1
                    moved_cells.add(cell)
                worst_points, worst_images = max(worst_points, points), max(worst_images, images)
                flips += a["selection"] != b["selection"]
            per_variant[variant] = moved
        seconds = float(np.median([base[c]["seconds"] for c in cells])) if cells else float("nan")
        mean_score = 100 * float(np.mean([base[c]["score"] for c in cells])) if cells else float("nan")
        rows.append([protocol, len(cells), mean_score, len(moved_cells), worst_points, worst_images,
                     f"{flips}/{checks}" if SELECTION.get(protocol) else "-",
                     ", ".join(f"{v} {n}" for v, n in per_variant.items() if n) or "none", seconds])
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="two small feature sets")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    p.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--store", help="a repeval store whose features to add (the demo's: demo-out/store)")
    p.add_argument("--demo-cells", type=int, default=8, help="at most this many stored feature arrays")
    p.add_argument("--demo-models", nargs="+", help="only these encoders of the store")
    p.add_argument("--json", help="also write every variant's cells (scores, selections, predictions) here")
    p.add_argument("--worker", choices=list(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args)
        return
    if args.store is None and Path("demo-out/store").is_dir():
        args.store = "demo-out/store"
    variants = ["baseline"] + [v for v in args.variants if v != "baseline"]
    with tempfile.TemporaryDirectory() as folder:
        runs = {v: run_variant(v, args, folder) for v in variants}
    if args.json:
        Path(args.json).write_text(json.dumps(runs))
    capability = next(iter(runs["baseline"].values()))["capability"] if runs["baseline"] else "?"
    print(machine_line() + f"; baseline kernels: {capability}, 2 threads")
    print(f"feature sets: {', '.join(s[0] for s in (QUICK_SETS if args.quick else SETS))}"
          + (f" and up to {args.demo_cells} arrays of {args.store}" if args.store else ""))
    print_tables("Scores under a few-ulps perturbation, 1 thread, AVX2 and scalar kernels, against the baseline",
                 ["protocol", "cells", "mean score (%)", "cells moved", "largest move (points)",
                  "largest move (test images)",
                  "selection moved", "moved cells per variant", "median s/cell"],
                 compare(runs, args.protocols), args.markdown)


if __name__ == "__main__":
    main()
