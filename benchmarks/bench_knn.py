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

``--streamed N`` (instead of the comparison above): k-NN over N train rows that stream from a
Zarr array on disk, as a cell streams them. The rows (``--streamed-dim``, default 768; class
clustered like the features above, generated chunk by chunk) are written into a temporary
``FeatureStore`` (``--tmp``, removed afterwards; 256-row chunks, zstd, ``--streamed-dtype``,
default float16), then each side runs in a fresh process of its own, one thread, measured
from after its imports and a warm-up: its wall time, its peak RSS growth (``VmHWM`` reset
through ``/proc/self/clear_refs``, less the RSS before) and the peak of numpy's allocations
(tracemalloc). The sides:

* ``read``: the blocks read and decoded, nothing else (what streaming costs by itself);
* ``repeval-streamed``: ``topk_blocks`` over ``jobs/evaluation/evaluate.py``'s ``train_blocks()``
  (dask blocks of whole chunks, about 8,192 rows, computed one at a time), then the vote;
* ``repeval-in-memory``: the whole array read first (``StoredArray.read``), then the same
  search over ``search_blocks``'s views of it, as a cell that does not stream;
* ``faiss-streamed``: the same blocks, each converted to float32, normalised
  (``faiss.normalize_L2``) and searched with ``faiss.knn`` (inner product, the BLAS path of
  ``IndexFlatIP``), the results merged in a ``faiss.ResultHeap``; then the vote.

``PYTHONPATH=. .venv/bin/python benchmarks/bench_knn.py --streamed 1280000 --streamed-queries 1000
--streamed-repeats 2 --coretype Zen --markdown`` (1.28 M x 768 float16: 1.8 GiB of rows, 0.8 GiB
on disk; writing them takes 4 minutes, each side about a minute; 13 minutes on 2 loaded cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks._common import (  # noqa: E402
    limit_threads, machine_line, median, print_tables, proc_status_bytes, reset_peak_rss,
)

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


# -- streamed from disk (--streamed) ---------------------------------------------------------
STREAM_CHUNK_ROWS = 256  # the default extraction chunking: batch_size 64 x chunk_batches 4
STREAM_KEY = "features/bench/synthetic/train/pre_logits"
STREAM_MODES = ("read", "repeval-streamed", "repeval-in-memory", "faiss-streamed")


class Synthetic:
    """``make_features``' distribution (ReLU(W z + b + noise), z ~ N(mu_y, I)), drawn chunk by chunk."""

    def __init__(self, d: int, n_classes: int, seed: int, latent: int = 128, separation: float = 0.4):
        rng = np.random.default_rng(seed)
        self.seed, self.n_classes, self.latent = seed, n_classes, latent
        self.means = rng.normal(0.0, separation, (n_classes, latent)).astype(np.float32)
        self.W = rng.normal(0.0, 1.0 / np.sqrt(latent), (latent, d)).astype(np.float32)
        self.b = rng.normal(-0.5, 0.5, d).astype(np.float32)

    def rows(self, n: int, part: int) -> tuple[np.ndarray, np.ndarray]:
        """(X float32 (n, d), y int64 (n,)) of part ``part``: the same rows whatever is drawn before."""
        rng = np.random.default_rng([self.seed, part])
        y = rng.integers(0, self.n_classes, n)
        z = self.means[y] + rng.standard_normal((n, self.latent), dtype=np.float32)
        noise = rng.standard_normal((n, self.W.shape[1]), dtype=np.float32)
        return np.maximum(z @ self.W + self.b + 0.1 * noise, 0.0), y


def streamed_child(args) -> None:
    """Child: one side of the streamed comparison in this fresh process; prints a JSON line."""
    import tracemalloc
    from types import SimpleNamespace

    import torch

    from jobs.evaluation.evaluate import DEFAULT_BLOCK_ROWS
    from pipeline.protocols.neighbours.knn import knn_class_weights, topk_blocks
    from pipeline.protocols.neighbours.protocols import search_blocks
    from storage_schema import FeatureStore

    faiss = _faiss() if args.streamed_child == "faiss-streamed" else None
    limit_threads(1)
    if faiss is not None:
        faiss.omp_set_num_threads(1)
    queries, y_train = np.load(args.queries), np.load(args.labels)
    train = FeatureStore(args.store, read_only=True).open_array(STREAM_KEY)
    chunk_rows = train.status.chunk_rows
    train_dask = train.to_dask(rows_per_block=max(1, DEFAULT_BLOCK_ROWS // chunk_rows) * chunk_rows)

    def train_blocks():  # jobs/evaluation/evaluate.py's: one dask block of whole chunks at a time
        offsets = np.cumsum((0,) + train_dask.chunks[0][:-1])
        for i, offset in enumerate(offsets):
            yield train_dask.blocks[i].compute(scheduler="synchronous"), int(offset)

    # warm-up outside the measurement: lazy imports, zarr codecs, a first compute, a tiny search
    train_dask[:1].compute(scheduler="synchronous")
    topk_blocks(queries[:2], [(np.ones((K + 1, queries.shape[1]), np.float32), 0)], K)
    if faiss is not None:
        faiss.knn(np.ones((2, 4), np.float32), np.ones((K + 1, 4), np.float32), K, metric=faiss.METRIC_INNER_PRODUCT)
    peak_reset = reset_peak_rss()
    rss_before = proc_status_bytes("VmRSS")
    tracemalloc.start()
    started = time.perf_counter()
    scores = idx = None
    if args.streamed_child == "read":
        for block, _ in train_blocks():
            pass
    elif args.streamed_child == "repeval-streamed":
        scores, idx = topk_blocks(queries, train_blocks(), K, "cosine", device="cpu")
    elif args.streamed_child == "repeval-in-memory":
        X_train = train.read()
        scores, idx = topk_blocks(queries, search_blocks(SimpleNamespace(train_blocks=None, X_train=X_train),
                                                         torch.device("cpu")), K, "cosine", device="cpu")
    else:  # faiss-streamed
        q = queries.astype(np.float32)  # a copy: normalize_L2 works in place
        faiss.normalize_L2(q)
        heap = faiss.ResultHeap(len(q), K, keep_max=True)
        for block, offset in train_blocks():
            block = np.ascontiguousarray(block, dtype=np.float32)
            faiss.normalize_L2(block)
            D, I = faiss.knn(q, block, K, metric=faiss.METRIC_INNER_PRODUCT)
            heap.add_result(D, I + offset)
        heap.finalize()
        scores, idx = heap.D, heap.I
    if idx is not None:
        knn_class_weights(scores, idx, y_train, int(y_train.max()) + 1, "exp", TEMPERATURE)
    seconds = time.perf_counter() - started
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak = proc_status_bytes("VmHWM")
    if idx is not None:
        np.save(args.out, idx)
    print(json.dumps({"mode": args.streamed_child, "seconds": seconds, "rss_growth": peak - rss_before,
                      "traced_peak": traced, "peak_reset": peak_reset, "n_blocks": len(train_dask.chunks[0]),
                      "blas": [f"{lib['file']} {lib['kernel']}" for lib in openblas_kernels()]}))


def write_store(root: str, n: int, d: int, dtype: str, seed: int) -> tuple[np.ndarray, float]:
    """The synthetic train rows in a new FeatureStore at ``root``, chunk by chunk; their labels and the seconds."""
    from storage_schema import ArraySpec, FeatureStore

    gen = Synthetic(d, N_CLASSES, seed)
    labels = np.empty(n, np.int64)
    store = FeatureStore(root)
    spec = ArraySpec(STREAM_KEY, (n, d), STREAM_CHUNK_ROWS, dtype, {"fingerprint": f"bench-knn-streamed-{seed}"})

    def produce(todo):
        for c in sorted(todo[STREAM_KEY]):
            lo, hi = c * STREAM_CHUNK_ROWS, min(n, (c + 1) * STREAM_CHUNK_ROWS)
            X, labels[lo:hi] = gen.rows(hi - lo, c)
            yield c, {STREAM_KEY: X.astype(dtype)}

    started = time.perf_counter()
    with store.lease(STREAM_KEY.rsplit("/", 1)[0]) as lease:
        store.write_arrays(lease, [spec], produce)
    return labels, time.perf_counter() - started


def measure_streamed(args) -> None:
    """The streamed comparison: write the array, run each side in a fresh process, compare."""
    n, d, dtype = args.streamed, args.streamed_dim, args.streamed_dtype
    stored = n * d * np.dtype(dtype).itemsize
    free = shutil.disk_usage(args.tmp).free
    if free < 1.5 * stored:
        raise SystemExit(f"{args.tmp} has {free / 2**30:.1f} GiB free; the array needs {stored / 2**30:.1f} GiB "
                         "(and room to spare): pass --tmp elsewhere")
    modes = [m for m in args.streamed_modes if m != "faiss-streamed" or _faiss() is not None]
    print(f"machine: {machine_line()}; one thread per side")
    print(f"streamed k-NN: {n:,} train rows x {d} {dtype} (chunks of {STREAM_CHUNK_ROWS} rows, zstd) in a "
          f"temporary FeatureStore under {args.tmp}; {args.streamed_queries} queries, k = {K}, cosine, "
          f"exp(s/{TEMPERATURE}); sides {', '.join(modes)}, {args.streamed_repeats} run(s) each, fresh processes",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="repeval-bench-knn-", dir=args.tmp) as tmp:
        root = os.path.join(tmp, "store")
        labels, write_s = write_store(root, n, d, dtype, args.seed)
        on_disk = sum(f.stat().st_size for f in Path(root).rglob("*") if f.is_file())
        print(f"written in {write_s:.0f} s: {on_disk / 2**30:.2f} GiB on disk "
              f"({stored / 2**30:.2f} GiB of {dtype} rows; the file cache holds it now)", flush=True)
        q_path, y_path = os.path.join(tmp, "queries.npy"), os.path.join(tmp, "labels.npy")
        np.save(q_path, Synthetic(d, N_CLASSES, args.seed).rows(args.streamed_queries, 10**9)[0])  # a part no chunk has
        np.save(y_path, labels)
        del labels
        env = dict(os.environ)
        if args.coretype:
            env["OPENBLAS_CORETYPE"] = args.coretype
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        found: dict[str, np.ndarray] = {}
        for r in range(args.streamed_repeats):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                out = os.path.join(tmp, f"idx-{mode}.npy")
                proc = subprocess.run([sys.executable, __file__, "--streamed-child", mode, "--store", root,
                                       "--queries", q_path, "--labels", y_path, "--out", out],
                                      env=env, capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"streamed child ({mode}) failed:\n{proc.stderr[-3000:]}")
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[mode].append(res)
                if os.path.exists(out):
                    found[mode] = np.load(out)
                print(f"  run {r + 1}, {mode}: {res['seconds']:.1f} s, peak RSS growth "
                      f"{res['rss_growth'] / 2**20:.0f} MiB, numpy's peak {res['traced_peak'] / 2**20:.0f} MiB",
                      flush=True)
    print(f"BLAS in the children: {runs[modes[-1]][-1]['blas']}")
    ref = found.get("repeval-streamed")
    rows = []
    for mode in modes:
        same = "-"
        if ref is not None and mode in found and mode != "repeval-streamed":
            sets = sum(set(a) != set(b) for a, b in zip(ref, found[mode]))
            same = f"{sets} of {len(ref)} differ"
        rows.append([mode, median([x["seconds"] for x in runs[mode]]),
                     max(x["rss_growth"] for x in runs[mode]) / 2**20,
                     max(x["traced_peak"] for x in runs[mode]) / 2**20, runs[mode][-1]["n_blocks"], same])
    if not all(x["peak_reset"] for m in modes for x in runs[m]):
        print("note: VmHWM could not be reset here; the RSS growth includes the start-up peak")
    print_tables(f"k-NN over {n:,} x {d} {dtype} train rows streamed from Zarr ({args.streamed_queries} queries, "
                 f"k = {K}; median wall time of {args.streamed_repeats} run(s), largest peaks)",
                 ["side", "seconds", "peak RSS growth MiB", "numpy's peak MiB (tracemalloc)", "blocks",
                  "neighbour sets vs repeval-streamed"], rows, args.markdown)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[20_000, 320_000], help="train rows")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per side")
    p.add_argument("--quick", action="store_true", help="20,000 train rows only")
    p.add_argument("--coretype", help="OPENBLAS_CORETYPE for faiss (default: the fastest of a probe)")
    p.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--streamed", type=int, metavar="N",
                   help="instead: k-NN over N train rows streamed from a temporary Zarr array (e.g. 1280000)")
    p.add_argument("--streamed-dim", type=int, default=768, help="feature width of --streamed")
    p.add_argument("--streamed-dtype", choices=("float16", "float32"), default="float16",
                   help="stored dtype of --streamed")
    p.add_argument("--streamed-queries", type=int, default=1000, help="queries of --streamed")
    p.add_argument("--streamed-repeats", type=int, default=1, help="runs per side of --streamed")
    p.add_argument("--streamed-modes", nargs="+", choices=STREAM_MODES, default=list(STREAM_MODES),
                   help="sides of --streamed")
    p.add_argument("--tmp", default=tempfile.gettempdir(), help="where --streamed writes its array (removed after)")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--streamed-child", choices=STREAM_MODES, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--queries", help=argparse.SUPPRESS)
    p.add_argument("--labels", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = [20_000]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.probe:
        probe(args)
        return
    if args.streamed_child:
        streamed_child(args)
        return
    if args.streamed:
        started = time.perf_counter()
        measure_streamed(args)
        print(f"\ntotal wall time: {time.perf_counter() - started:.0f} s")
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
