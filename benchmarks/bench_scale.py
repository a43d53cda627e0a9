"""Protocols at lab scale: seconds and peak memory against the number of train rows.

Every point (protocol, n) runs in its own fresh process, which builds synthetic features,
holds them (as a caller holding a cell's arrays would), then runs the protocol once
through the registry and reports its wall time and the peak RSS growth during the run
(VmHWM reset through /proc/self/clear_refs just before; MALLOC_MMAP_THRESHOLD_ makes
freed arrays leave the RSS at once). "peak / features" is (features + growth) / features:
the protocols promise at most 1.5x plus terms that do not grow with n. The same protocol
written with scikit-learn (or, for few-shot, the per-episode loop a user would write)
runs in its own process at each n where its extrapolated peak fits in the machine's
available memory. Growth exponents are least-squares slopes of log(seconds) against
log(n). Each side's CPU seconds (``time.process_time``) are reported beside its wall
time: with one thread a side they are the compute it used, which other processes' load
on a shared machine inflates far less than the wall time.

* logistic: the ``logistic`` protocol with one C (``Cs: null``, C = 1, l2 transform)
  against ``LogisticRegression(C=1, lbfgs)`` on the L2-normalised features; with
  ``--logistic-grid`` the protocol's 45-value C grid instead (no reference);
* ridge: exact leave-one-out over 13 alphas against ``RidgeCV`` (same PRESS);
* knn: k = 20 cosine, exp(s / 0.07) weights against ``KNeighborsClassifier`` (brute,
  cosine, the same weights);
* fewshot: 600 5-way 20-shot episodes against the per-episode loop;
* lowshot: the default ridge sweep (shots 1..128 and all, 5 seeds) against the same sweep
  with ``RidgeCV`` per sample.

Features: class-clustered Gaussians in a 64-d latent space, projected to d dimensions,
ReLU (non-negative, correlated like pooled CNN features), generated in row blocks.
Defaults: d = 512, 100 classes, 10,000 test rows, float32, n = 20k, 80k, 320k (``--full``
adds 1.28 M), one thread per library (``--threads 0``: library defaults).

GPU (``--device cuda``): the protocols run on the GPU (the references stay on the CPU);
peak GPU memory is reported too. ``--targets`` runs the issue's two GPU targets at
ImageNet size (1.28 M x 768, 1,000 classes, float16): k-NN with 50,000 queries under
30 s, and the logistic probe with the 45-value C grid under 10 minutes.

Run: ``.venv/bin/python benchmarks/bench_scale.py [--quick] [--full] [--device cuda] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks._common import limit_threads, machine_line, print_tables  # noqa: E402

PROTOCOLS = ("logistic", "ridge", "knn", "fewshot", "lowshot")
SIZES = (20_000, 80_000, 320_000)
FULL_SIZE = 1_280_000
QUICK = dict(sizes=(20_000, 40_000, 80_000), dim=256, classes=20, test=2_000)
TEMPERATURE, K_NEIGHBORS = 0.07, 20
MiB = 2**20


# -- the child: one measured point ----------------------------------------------------------
def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def synthetic_blocks(n: int, d: int, n_classes: int, seed: int,
                     block: int = 16_384) -> tuple[np.ndarray, Iterator[np.ndarray]]:
    """The labels, and the features ReLU(W z + b) with z ~ N(mu_y, I) in 64 latent
    dimensions as float32 row blocks (generated as they are asked for)."""
    rng = np.random.default_rng(1000)  # the same classes and projection for every split
    means = rng.normal(0.0, 0.5, (n_classes, 64)).astype(np.float32)
    W = rng.normal(0.0, 1.0 / 8.0, (64, d)).astype(np.float32)
    b = rng.normal(-0.3, 0.5, d).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % n_classes).astype(np.int64)

    def blocks() -> Iterator[np.ndarray]:
        for i in range(0, n, block):
            z = means[y[i:i + block]] + rng.standard_normal((len(y[i:i + block]), 64), dtype=np.float32)
            yield np.maximum(z @ W + b, 0.0)

    return y, blocks()


def synthetic(n: int, d: int, n_classes: int, dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class-clustered features (:func:`synthetic_blocks`) in memory, and their labels."""
    y, blocks = synthetic_blocks(n, d, n_classes, seed)
    X = np.empty((n, d), dtype=dtype)
    for i, rows in zip(range(0, n, 16_384), blocks):
        X[i:i + len(rows)] = rows
    return X, y


def _settings(protocol: str, args: dict) -> dict:
    device = {"device": args["device"]}
    return {
        "logistic": {"Cs": "default" if args["logistic_grid"] else None, "C": 1.0, **device},
        "ridge": device, "knn": device, "fewshot": device, "lowshot": device,
    }[protocol]


def _reference(protocol: str, X, y, X_te, y_te, n_classes: int):
    """The same protocol with scikit-learn (few-shot: the per-episode loop); its score."""
    from sklearn.linear_model import LogisticRegression, RidgeCV

    from benchmarks.bench_protocols import fewshot_loop
    from pipeline.protocols.linear.ridge import DEFAULT_ALPHAS

    def normalised(A):
        return A / np.linalg.norm(A, axis=1, keepdims=True)

    if protocol == "logistic":
        clf = LogisticRegression(C=1.0, max_iter=1000).fit(normalised(X), y)
        return float(np.mean(clf.predict(normalised(X_te)) == y_te))
    if protocol == "ridge":
        T = -np.ones((len(y), n_classes))
        T[np.arange(len(y)), y] = 1.0
        rcv = RidgeCV(alphas=DEFAULT_ALPHAS).fit(X, T)
        return float(np.mean(np.argmax(rcv.predict(X_te), axis=1) == y_te))
    if protocol == "knn":
        from sklearn.neighbors import KNeighborsClassifier

        def weights(dist):
            return np.exp((1.0 - np.asarray(dist, dtype=np.float64)) / TEMPERATURE)

        knn = KNeighborsClassifier(K_NEIGHBORS, algorithm="brute", metric="cosine", weights=weights).fit(X, y)
        return float(np.mean(knn.predict(X_te) == y_te))
    if protocol == "fewshot":
        return fewshot_loop(np.concatenate([X, X_te]), np.concatenate([y, y_te]))[0]
    # lowshot: the default sweep with RidgeCV on each sample (l2 features, as the protocol);
    # the score compared is the headline, "all"
    Xn, Xt = normalised(X), normalised(X_te)
    classes = np.arange(n_classes)
    for shots in (1, 2, 4, 8, 16, 32, 64, 128):
        if np.bincount(y, minlength=n_classes).min() < shots:
            continue
        for rep in range(5):
            rng = np.random.default_rng([0, shots, rep])
            idx = np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), shots, replace=False) for c in classes]))
            T = -np.ones((len(idx), n_classes))
            T[np.arange(len(idx)), y[idx]] = 1.0
            RidgeCV(alphas=DEFAULT_ALPHAS).fit(Xn[idx], T).predict(Xt)
    T = -np.ones((len(y), n_classes))
    T[np.arange(len(y)), y] = 1.0
    return float(np.mean(np.argmax(RidgeCV(alphas=DEFAULT_ALPHAS).fit(Xn, T).predict(Xt), axis=1) == y_te))


def child(spec: dict) -> dict:
    """Build and hold the features, run one side once, measure time and peak memory."""
    import scipy.linalg  # noqa: F401  (loaded first, so that its BLAS gets the thread limit too)

    limit_threads(spec["threads"])
    import torch

    from pipeline.protocols import EvalData, get_protocol

    protocol, n, d, K = spec["protocol"], spec["n"], spec["dim"], spec["classes"]
    X, y = synthetic(n, d, K, spec["dtype"], 0)
    X_te, y_te = synthetic(spec["test"], d, K, spec["dtype"], 1)
    if spec["side"] == "ours":  # warm-up on a small cell: imports, kernels, thread pools
        proto, settings = get_protocol(protocol), _settings(protocol, spec)
        warm = dict(settings, **({"Cs": None} if protocol == "logistic" else {}))
        proto(EvalData(y_train=y[:4000], X_test=X_te[:500], y_test=y_te[:500], n_classes=K, X_train=X[:4000]), warm)
    else:
        warm = 6000 if protocol == "fewshot" else 2000  # episodes need n_shot + n_query rows of 5 classes
        _reference(protocol, X[:warm], y[:warm], X_te[:200], y_te[:200], K) if protocol != "lowshot" else None
    cuda = torch.cuda.is_available() and spec["device"].startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status("VmRSS")
    started, cpu_started = time.perf_counter(), time.process_time()
    if spec["side"] == "ours":
        data = EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=K, X_train=X)
        result = proto(data, settings)
        score = result.metrics["score"]
    else:
        score = _reference(protocol, X, y, X_te, y_te, K)
    if cuda:
        torch.cuda.synchronize()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    growth = _status("VmHWM") - before
    held = X.nbytes + X_te.nbytes
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "growth": growth, "features": held,
            "ratio": (held + growth) / held,
            "score": float(score), "gpu_peak": torch.cuda.max_memory_allocated() if cuda else 0}


# -- the parent: points, references, tables ----------------------------------------------------
def run_point(spec: dict) -> dict | None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode != 0:
        print(f"  {spec['side']} {spec['protocol']} n={spec['n']} failed:\n{proc.stderr[-2000:]}", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def exponent(ns: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(n)."""
    if len(ns) < 2:
        return float("nan")
    return float(np.polyfit(np.log(ns), np.log(values), 1)[0])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="n = 20k, 40k, 80k at d = 256, 20 classes (a few minutes)")
    p.add_argument("--full", action="store_true", help="also n = 1.28 M")
    p.add_argument("--only", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    p.add_argument("--sizes", nargs="+", type=int, help="train rows per point (overrides the defaults)")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--test", type=int, default=10_000, help="test rows (k-NN queries)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--device", default="cpu", help="device setting of the protocols: cpu, cuda, cuda:<i>, auto")
    p.add_argument("--threads", type=int, default=1, help="torch/BLAS threads per process (0: library defaults)")
    p.add_argument("--logistic-grid", action="store_true", help="the 45-value C grid instead of one C")
    p.add_argument("--no-reference", action="store_true", help="skip the scikit-learn side")
    p.add_argument("--targets", action="store_true",
                   help="the GPU targets: k-NN and the 45-C logistic grid at 1.28 M x 768, 1,000 classes, float16")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.quick:
        args.dim, args.classes, args.test = QUICK["dim"], QUICK["classes"], QUICK["test"]
    sizes = args.sizes or list(QUICK["sizes"] if args.quick else SIZES) + ([FULL_SIZE] if args.full else [])
    points = [(p, n) for p in args.only for n in sizes]
    if args.targets:
        args.dim, args.classes, args.dtype, args.no_reference = 768, 1000, "float16", True
        points = [("knn", FULL_SIZE), ("logistic", FULL_SIZE)]
    threads = None if args.threads == 0 else args.threads
    started = time.perf_counter()
    print(f"bench_scale: d={args.dim}, {args.classes} classes, {args.test} test rows, {args.dtype}, "
          f"device={args.device}, threads per process: {limit_threads(threads)}")
    print(f"machine: {machine_line()}; available memory {_available() / 2**30:.1f} GiB")
    base = {"dim": args.dim, "classes": args.classes, "test": 50_000 if args.targets else args.test,
            "dtype": args.dtype, "device": args.device, "threads": threads, "logistic_grid": args.logistic_grid}
    results: dict[tuple[str, int], dict] = {}
    last_ref: dict[str, tuple[int, dict]] = {}  # the reference's previous point, to extrapolate its peak
    for protocol, n in points:
        spec = dict(base, protocol=protocol, n=n, side="ours")
        if args.targets and protocol == "logistic":
            spec["logistic_grid"], spec["test"] = True, 10_000
        ours = run_point(spec)
        ref = None
        m, prev = last_ref.get(protocol, (n, None))
        fits = prev is None or (prev["features"] + prev["growth"]) * n / m < 0.6 * _available()
        if not (args.no_reference or args.logistic_grid) and fits:
            ref = run_point(dict(spec, side="reference"))
            if ref:
                last_ref[protocol] = (n, ref)
        elif not fits:
            print(f"  reference {protocol} n={n}: skipped, its extrapolated peak does not fit in memory")
        results[(protocol, n)] = {"ours": ours, "ref": ref}
        if ours:
            line = (f"  {protocol} n={n}: {ours['seconds']:.2f} s (CPU {ours['cpu_seconds']:.2f} s), "
                    f"peak/features {ours['ratio']:.2f}, score {ours['score']:.4f}")
            if ref:
                line += (f"; reference {ref['seconds']:.2f} s (CPU {ref['cpu_seconds']:.2f} s), "
                         f"peak/features {ref['ratio']:.2f}, score {ref['score']:.4f}")
            print(line, flush=True)

    rows, exps = [], []
    for protocol in dict.fromkeys(p for p, _ in points):
        ns, secs = [], []
        for n in [m for p, m in points if p == protocol]:
            r = results[(protocol, n)]
            o, ref = r["ours"], r["ref"]
            if not o:
                continue
            ns.append(n)
            secs.append(o["seconds"])
            rows.append([protocol, n, o["seconds"], o["growth"] / MiB, o["ratio"], o["gpu_peak"] / MiB if o["gpu_peak"] else "-",
                         ref["seconds"] if ref else "n/a", ref["ratio"] if ref else "n/a",
                         f"{ref['seconds'] / o['seconds']:.2f}x" if ref else "n/a",
                         f"{o['score']:.4f} / {ref['score']:.4f}" if ref else f"{o['score']:.4f}",
                         o["cpu_seconds"], ref["cpu_seconds"] if ref else "n/a",
                         f"{ref['cpu_seconds'] / o['cpu_seconds']:.2f}x" if ref else "n/a"])
        exps.append([protocol, exponent(ns, secs)])
    print_tables("Time and peak memory per point (fresh process each; growth = peak RSS during the run "
                 "minus RSS before, features held)",
                 ["protocol", "n train", "repeval s", "growth MiB", "peak / features", "GPU peak MiB",
                  "reference s", "reference peak / features", "speed-up", "score (ours / reference)",
                  "repeval CPU s", "reference CPU s", "speed-up (CPU)"],
                 rows, args.markdown)
    print_tables("Growth exponent of repeval's time in n (1 = linear)", ["protocol", "exponent"], exps,
                 args.markdown)
    if args.targets:
        knn, logistic = results[("knn", FULL_SIZE)]["ours"], results[("logistic", FULL_SIZE)]["ours"]
        for name, res, goal in (("k-NN, 50,000 queries", knn, 30.0), ("logistic, 45-C grid", logistic, 600.0)):
            verdict = "n/a" if not res else ("met" if res["seconds"] < goal else "MISSED")
            print(f"target {name} at 1.28 M x 768: {res['seconds'] if res else float('nan'):.1f} s "
                  f"(goal < {goal:g} s): {verdict}")
    print(f"\ntotal wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
