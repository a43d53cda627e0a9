"""repeval's k-NN against faiss-cpu and against one matrix product (the GEMM floor).

The same features as ``bench_protocols.py`` (class-clustered, ReLU'd, float32; d = 512,
100 classes, 5,000 test queries), k = 20, cosine similarity, exp(s / 0.07) weights, at
several train sizes (default 20,000 and 320,000). Three sides, interleaved in one process
with one thread each (torch, every BLAS and OpenMP pool), the order rotated every repeat:

* repeval: ``KNNClassifier(20, "cosine", "exp", 0.07).fit(X_train, y).predict(X_test)``;
* faiss-cpu: the exact ``IndexFlatIP`` on L2-normalised float32 copies (``faiss.normalize_L2``),
  ``search(queries, 20)``, then the same weighted vote (``knn_class_weights``); timed from
  the raw arrays, as a user would run it;
* the GEMM floor: one float32 product of the normalised queries by the train matrix with
  torch (``torch.mm``, MKL, into a reused 5,000 x 20,000 output, 20,000 train rows at a
  time: the same multiply-adds as one product, without a 6 GB output at 320k rows);
* the same product with numpy (``np.matmul``: the OpenBLAS of numpy's wheel, which
  repeval's CPU search uses; on AMD CPUs it is faster than torch's MKL);
* the ``retrieval`` readout on the same features (each test row queries the train rows:
  mAP@R, recall@1/5), run as a cell runs it (``get_protocol("retrieval")(EvalData(...))``):
  one search at depth max(R) (200 at 20,000 rows and 100 classes) with k-NN's code, then
  the metrics; its time is reported against repeval's k-NN (goal: within 1.5x).

Reported: the median wall time of each side, the median of the per-repeat ratios
(repeval vs faiss: faiss time / repeval time, > 1 means repeval is faster; share of a
floor: the product's time / repeval's, 1 means repeval runs at that product's speed),
whether the predictions are identical and how many queries' neighbour sets differ.

faiss-cpu's wheel bundles its own OpenBLAS, which picks its kernel from the CPU at load
time and can pick a slow generic one (on AVX-512 CPUs unless ``OPENBLAS_CORETYPE`` names
the CPU's). So unless ``--coretype`` is given, the script first times a faiss search in a
fresh process under each kernel the CPU can run (the default one, and Haswell/Zen with
AVX2, SkylakeX/Cooperlake with AVX-512), then measures in a fresh process with the fastest;
the kernel is read back with threadpoolctl and named in the output. OPENBLAS_CORETYPE
also reaches numpy's OpenBLAS (the same kernel family; its own choice is printed too).

faiss is a benchmark-only dependency: ``.venv/bin/pip install -e '.[bench]'`` (or
``pip install faiss-cpu``). Without it, repeval and the floor run alone.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_knn.py [--sizes 20000 320000] [--markdown]``
(about 10 minutes on a 2-core machine; ``--quick``: 20,000 rows, about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks._common import limit_threads, machine_line, median, print_tables  # noqa: E402

K = 20
TEMPERATURE = 0.07
N_TEST, D, N_CLASSES = 5_000, 512, 100
FLOOR_ROWS = 20_000  # train rows per product of the floor


def _faiss():
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def openblas_kernels() -> list[dict]:
    """The OpenBLAS libraries loaded in this process: file, version and kernel (threadpoolctl)."""
    from threadpoolctl import threadpool_info

    return [{"file": Path(p["filepath"]).name, "version": p.get("version"), "kernel": p.get("architecture")}
            for p in threadpool_info() if p.get("internal_api") == "openblas"]


def faiss_kernel() -> str | None:
    """The kernel of the OpenBLAS that faiss loaded (its wheel's own, under faiss_cpu.libs)."""
    for lib in openblas_kernels():
        if "openblaso" in lib["file"] or "faiss" in lib["file"]:
            return lib["kernel"]
    return None


def candidate_coretypes() -> list[str | None]:
    """None (OpenBLAS's own choice) and the named kernels this CPU can run."""
    try:
        flags = set(next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split())
    except (OSError, StopIteration):
        flags = set()
    out: list[str | None] = [None]
    if "avx2" in flags:
        out += ["Haswell", "Zen"]
    if "avx512f" in flags:
        out += ["SkylakeX", "Cooperlake"]
    return out


def features(n_train: int, seed: int):
    from benchmarks.bench_protocols import make_features

    # the splits of bench_protocols (train, val, test drawn in that order): at 20,000 train
    # rows these are its very arrays
    data = make_features({"train": n_train, "val": 5_000, "test": N_TEST}, D, N_CLASSES, seed=seed)
    return data["train"], data["test"]


def faiss_side(faiss, Xtr, ytr, Xte, k: int = K):
    """Exact inner-product search on normalised copies, then repeval's weighted vote."""
    from pipeline.protocols.neighbours.knn import knn_class_weights

    train, queries = Xtr.copy(), Xte.copy()
    faiss.normalize_L2(train)
    faiss.normalize_L2(queries)
    index = faiss.IndexFlatIP(train.shape[1])
    index.add(train)
    del train
    scores, idx = index.search(queries, k)
    pred = np.argmax(knn_class_weights(scores, idx, ytr, N_CLASSES, "exp", TEMPERATURE), axis=1)
    return pred, idx


def probe(args) -> None:
    """Child: time one faiss search (5,000 x 20,000) under this process's kernel."""
    faiss = _faiss()
    limit_threads(1)
    faiss.omp_set_num_threads(1)
    (Xtr, ytr), (Xte, _) = features(FLOOR_ROWS, args.seed)
    best = min(_timed(lambda: faiss_side(faiss, Xtr, ytr, Xte)) for _ in range(2))
    print(json.dumps({"kernel": faiss_kernel(), "seconds": best}))


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def pick_coretype(args) -> tuple[str | None, list[str]]:
    """The OPENBLAS_CORETYPE whose faiss search was fastest, and a line per kernel tried."""
    tried, lines = [], []
    for coretype in candidate_coretypes():
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        if coretype:
            env["OPENBLAS_CORETYPE"] = coretype
        run = subprocess.run([sys.executable, __file__, "--probe", "--seed", str(args.seed)], env=env,
                             capture_output=True, text=True)
        if run.returncode != 0:  # a kernel the CPU cannot run dies with SIGILL
            lines.append(f"{coretype or 'default'}: failed (exit {run.returncode})")
            continue
        res = json.loads(run.stdout.strip().splitlines()[-1])
        tried.append((res["seconds"], coretype))
        lines.append(f"OPENBLAS_CORETYPE={coretype or '(unset)'}: kernel {res['kernel']}, {res['seconds']:.2f} s")
    return (min(tried)[1] if tried else None), lines


def measure(args) -> None:
    """Child (or the only process without faiss): the interleaved comparison."""
    import torch

    from pipeline.protocols import EvalData, get_protocol
    from pipeline.protocols.neighbours.knn import KNNClassifier

    faiss = _faiss()
    threads = limit_threads(1)
    if faiss is not None:
        faiss.omp_set_num_threads(1)
    print(f"machine: {machine_line()}; threads: {threads}")
    print("BLAS libraries: " + "; ".join(f"{lib['file']} {lib['version']} kernel {lib['kernel']}"
                                         for lib in openblas_kernels()) + "; torch: MKL (linked in)")
    if faiss is not None:
        print(f"faiss-cpu {faiss.__version__}; its OpenBLAS kernel: {faiss_kernel()} "
              f"(OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')})")
    else:
        print("faiss-cpu is not installed (pip install faiss-cpu, or the 'bench' extra): repeval and the floor only")
    print(f"k = {K}, cosine, exp(s/{TEMPERATURE}); {N_TEST} queries, d = {D}, {N_CLASSES} classes; "
          f"{args.repeats} interleaved repeats per side, order rotated")

    rows = []
    for n_train in args.sizes:
        (Xtr, ytr), (Xte, yte) = features(n_train, args.seed)
        Q = torch.from_numpy(Xte / np.linalg.norm(Xte, axis=1, keepdims=True)).float()
        T = torch.from_numpy(Xtr)  # the product's speed does not depend on the values
        out = torch.empty(N_TEST, min(FLOOR_ROWS, n_train))
        Qn, outn = Q.numpy(), out.numpy()

        def floor():
            for i in range(0, n_train, FLOOR_ROWS):
                part = T[i:i + FLOOR_ROWS]
                torch.mm(Q, part.T, out=out[:, :part.shape[0]])

        def floor_numpy():
            for i in range(0, n_train, FLOOR_ROWS):
                part = Xtr[i:i + FLOOR_ROWS]
                np.matmul(Qn, part.T, out=outn[:, :part.shape[0]])

        def ours():
            return KNNClassifier(K, metric="cosine", weights="exp", temperature=TEMPERATURE).fit(Xtr, ytr).predict(Xte)

        def retrieval():
            return get_protocol("retrieval")(EvalData(y_train=ytr, X_test=Xte, y_test=yte, n_classes=N_CLASSES,
                                                      X_train=Xtr), {"device": "cpu"})

        sides = {"repeval": ours, "floor": floor, "floor (numpy)": floor_numpy, "retrieval": retrieval}
        if faiss is not None:
            sides["faiss"] = lambda: faiss_side(faiss, Xtr, ytr, Xte)
        names = list(sides)
        times = {name: [] for name in names}
        results = {}
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                started = time.perf_counter()
                results[name] = sides[name]()
                times[name].append(time.perf_counter() - started)
            print(f"  n_train={n_train} repeat {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names),
                  flush=True)
        def share(floor_name):
            return f"{median([f / o for f, o in zip(times[floor_name], times['repeval'])]):.2f}"

        found = results["retrieval"]
        row = [f"{n_train:,}", median(times["repeval"]), median(times["floor"]), median(times["floor (numpy)"]),
               share("floor"), share("floor (numpy)"), median(times["retrieval"]),
               f"{median([r / o for r, o in zip(times['retrieval'], times['repeval'])]):.2f}x",
               f"{found.diagnostics['depth']}; mAP@R {found.metrics['map_at_r']:.4f}, "
               f"R@1 {found.metrics['recall_at_1']:.4f}, R@5 {found.metrics['recall_at_5']:.4f}"]
        if faiss is not None:
            vs = median([f / o for f, o in zip(times["faiss"], times["repeval"])])
            pred_faiss, idx_faiss = results["faiss"]
            _, idx_ours = KNNClassifier(K).fit(Xtr, ytr).kneighbors(Xte)
            sets = sum(set(a) != set(b) for a, b in zip(idx_ours, idx_faiss))
            differ = int(np.sum(results["repeval"] != pred_faiss))
            row[2:2] = [median(times["faiss"])]
            row[-3:-3] = [f"{vs:.2f}x", f"{'identical' if differ == 0 else f'{differ} differ'} "
                    f"({sets} of {N_TEST} neighbour sets differ)"]
        rows.append(row)
        del Xtr, T, out, Qn, outn
    headers = ["train rows", "repeval s", "GEMM floor (torch) s", "GEMM (numpy) s", "share of the torch floor",
               "share of numpy's GEMM", "retrieval s", "retrieval / k-NN", "retrieval depth; metrics"]
    if faiss is not None:
        headers[2:2] = ["faiss-cpu s"]
        headers[-3:-3] = ["repeval vs faiss", "predictions vs faiss"]
    print_tables("k-NN fit + predict (median wall time; ratios: median of per-repeat ratios)", headers, rows,
                 args.markdown)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[20_000, 320_000], help="train rows")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per side")
    p.add_argument("--quick", action="store_true", help="20,000 train rows only")
    p.add_argument("--coretype", help="OPENBLAS_CORETYPE for faiss (default: the fastest of a probe)")
    p.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = [20_000]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.probe:
        probe(args)
        return
    if args.child or _faiss() is None:
        measure(args)
        return
    started = time.perf_counter()
    coretype = args.coretype
    if coretype is None:
        coretype, lines = pick_coretype(args)
        print("faiss's OpenBLAS kernels, one 5,000 x 20,000 search each (fresh processes):\n  " + "\n  ".join(lines))
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    child = [sys.executable, __file__, "--child", "--repeats", str(args.repeats), "--seed", str(args.seed),
             "--sizes", *map(str, args.sizes)] + (["--markdown"] if args.markdown else [])
    code = subprocess.run(child, env=env).returncode
    print(f"\ntotal wall time: {time.perf_counter() - started:.0f} s")
    sys.exit(code)


if __name__ == "__main__":
    main()
