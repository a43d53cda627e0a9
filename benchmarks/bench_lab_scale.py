"""A lab-size run end to end: seconds and peak memory of every stage, on this machine.

What a lab with an ImageNet-size feature set does, through the command line a user runs:

1. ``generate``: synthetic float16 features, ``--rows`` x ``--dim`` (default 1.28 M x 768,
   1,000 classes) and ``--test`` test rows (default 5,000: the k-NN queries), written
   block by block to a folder of ``.npy`` files (never whole in memory), and a second
   folder with the first ``--logistic-rows`` train rows (default 128 k) for the logistic
   probe;
2. ``import``: ``repeval import-features`` of both folders into a fresh store (read
   through memory maps, float16 kept);
3. one ``repeval run`` per protocol on the stored features (``source: store`` encoder, an
   embedded Dask cluster of ``--workers`` worker processes with ``--memory-limit`` each,
   so every evaluation task declares the memory its cell needs): ridge, k-NN, few-shot
   and low-shot on all rows, logistic (its 45-value C grid) on ``--logistic-rows``.

Each stage runs in its own process tree; a sampler thread reads the resident memory of
every process of the tree every 0.2 s. "peak RSS" is the largest sum over the tree (the
run's Prefect server and Dask workers included), "largest process" the largest single
process. "cell s" is the protocol's own fit time from the ledger; the rest of a stage's
seconds is reading the store, starting Prefect and Dask, correlating and the report.
"features" is the stored size of the train rows (float16), to read the peaks against.

Synthetic features: class-clustered Gaussians in a 64-d latent space projected to
``--dim`` and passed through a ReLU (non-negative and correlated, as pooled CNN features).

Run: ``.venv/bin/python benchmarks/bench_lab_scale.py [--rows N] [--markdown]`` (full size
needs about 6 GiB free and a few tens of minutes on two cores; ``--rows 20000 --classes
50`` checks the script in a minute). The work folder is removed at the end unless
``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks._common import machine_line, print_tables  # noqa: E402
from benchmarks.bench_scale import synthetic_blocks  # noqa: E402

MiB = 2**20
BLOCK = 32_768
PROTOCOLS = ("ridge", "knn", "fewshot", "lowshot", "logistic")


def write_features(folder: Path, split: str, n: int, d: int, n_classes: int, seed: int) -> None:
    """``<split>_features.npy`` (float16) and ``<split>_labels.npy``, written block by block."""
    y, blocks = synthetic_blocks(n, d, n_classes, seed)
    np.save(folder / f"{split}_labels.npy", y)
    write_npy(folder / f"{split}_features.npy", (n, d), blocks)


def write_npy(path: Path, shape: tuple[int, int], blocks) -> None:
    """A float16 ``.npy`` written from row blocks through a plain file (a memory map's
    dirty pages would count in this process's resident memory)."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)), "fortran_order": False, "shape": shape}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for block in blocks:
            f.write(np.ascontiguousarray(block, dtype=np.float16).tobytes())


def copy_head(src: Path, dst: Path, rows: int) -> None:
    """The first ``rows`` train rows and the whole test split of ``src`` into ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("test_features.npy", "test_labels.npy"):
        shutil.copyfile(src / name, dst / name)
    np.save(dst / "train_labels.npy", np.load(src / "train_labels.npy")[:rows])
    d = np.load(src / "train_features.npy", mmap_mode="r").shape[1]

    def blocks():
        for i in range(0, rows, BLOCK):  # a map per block, closed once copied
            yield np.array(np.load(src / "train_features.npy", mmap_mode="r")[i:min(i + BLOCK, rows)])

    write_npy(dst / "train_features.npy", (rows, d), blocks())


def generate(spec: dict) -> None:
    """The child of the ``generate`` stage."""
    work = Path(spec["work"])
    lab = work / "lab"
    lab.mkdir(parents=True, exist_ok=True)
    write_features(lab, "train", spec["rows"], spec["dim"], spec["classes"], 0)
    write_features(lab, "test", spec["test"], spec["dim"], spec["classes"], 1)
    copy_head(lab, work / "lab_logistic", min(spec["logistic_rows"], spec["rows"]))


# -- measuring a process tree ---------------------------------------------------------------
def measured(cmd: list[str], log: Path) -> dict:
    """Run ``cmd``; its seconds, exit status, and peak RSS (tree sum and largest process)."""
    import psutil

    # a loaded machine can take longer than Prefect's default 20 s to start a run's local API
    env = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180", **os.environ}
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        peak = {"tree": 0, "largest": 0}
        stop = threading.Event()

        def sample() -> None:
            root = psutil.Process(proc.pid)
            while not stop.is_set():
                try:
                    tree = [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    return
                rss = []
                for p in tree:
                    try:
                        rss.append(p.memory_info().rss)
                    except psutil.NoSuchProcess:  # ended between the listing and the read
                        continue
                peak["tree"] = max(peak["tree"], sum(rss))
                peak["largest"] = max(peak["largest"], max(rss, default=0))
                stop.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        stop.set()
        sampler.join()
    seconds = time.perf_counter() - started
    if rc != 0:
        print(f"  {' '.join(cmd[:4])} ... exited {rc}; last lines of {log}:\n"
              + "\n".join(log.read_text().splitlines()[-15:]), flush=True)
    return {"seconds": seconds, "rc": rc, "peak_tree": peak["tree"], "peak_largest": peak["largest"]}


def run_config(work: Path, store: Path, dataset: str, protocol: str, args) -> Path:
    """The ``repeval run`` config evaluating ``protocol`` on the stored features of ``dataset``."""
    import yaml

    settings = {"device": args.device}
    if protocol == "knn":
        settings["n_neighbors"] = 20
    config = {
        "store": str(store),
        "dask": {"n_workers": args.workers, "threads_per_worker": args.threads, "processes": True,
                 "memory_limit": args.memory_limit},
        "encoders": [{"name": "lab", "source": "store"}],
        "datasets": [{"name": dataset, "adapter": "features", "params": {"path": str(work / dataset)}}],
        "protocols": [{"name": protocol, "protocol": protocol, "settings": settings}],
        "report": {"path": str(work / f"report-{protocol}" / "report.html")},
    }
    path = work / f"{protocol}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def ledger_cell(store: Path, protocol: str) -> dict:
    from pipeline.errors import RepevalError
    from storage_schema import FeatureStore
    from storage_schema.ledger import Ledger

    try:
        records = list(Ledger(FeatureStore(str(store), read_only=True)))
    except RepevalError:  # no store: the import failed
        return {}
    for rec in records:
        if rec.get("setting") == protocol:
            metrics = rec.get("metrics") or {}
            score = metrics.get("score", (metrics.get("curve") or {}).get("all"))
            timings = rec.get("timings") or {}
            return {"fit_s": timings.get("fit_s"), "threads": timings.get("threads"), "score": score}
    return {}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_280_000, help="train rows (default: ImageNet's 1.28 M)")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--test", type=int, default=5_000, help="test rows: the k-NN queries")
    p.add_argument("--logistic-rows", type=int, default=128_000, help="train rows of the logistic probe")
    p.add_argument("--only", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    p.add_argument("--workers", type=int, default=1, help="Dask worker processes")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per Dask worker: cells at once (each cell's math gets the cores left to it)")
    p.add_argument("--memory-limit", default="auto", help="memory of each Dask worker (bytes, 8GiB, auto)")
    p.add_argument("--device", default="cpu", help="the protocols' device setting (cpu, cuda, auto)")
    p.add_argument("--work", help="work folder (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.child:
        generate(json.loads(args.child))
        return []
    work = Path(args.work or tempfile.mkdtemp(prefix="repeval-lab-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    repeval = str(Path(sys.executable).with_name("repeval"))
    logistic_rows = min(args.logistic_rows, args.rows)
    feature_bytes = args.rows * args.dim * 2
    print(f"bench_lab_scale: {args.rows} x {args.dim} float16 train rows ({feature_bytes / 2**30:.2f} GiB), "
          f"{args.classes} classes, {args.test} test rows, logistic on {logistic_rows} rows; "
          f"{args.workers} Dask worker(s) x {args.threads} thread(s), memory_limit {args.memory_limit}, "
          f"device {args.device}")
    print(f"machine: {machine_line()}; work folder {work}", flush=True)
    rows: list[dict] = []
    started = time.perf_counter()
    try:
        spec = {"work": str(work), "rows": args.rows, "dim": args.dim, "classes": args.classes, "test": args.test,
                "logistic_rows": logistic_rows}
        stages = [("generate", [sys.executable, __file__, "--child", json.dumps(spec)], args.rows, None)]
        for dataset, n in (("lab", args.rows), ("lab_logistic", logistic_rows)):
            stages.append((f"import {dataset}", [repeval, "import-features", "--store", str(store), "--model", "lab",
                                                 "--path", str(work / dataset), "--dataset-name", dataset], n, None))
        for protocol in args.only:
            dataset, n = ("lab_logistic", logistic_rows) if protocol == "logistic" else ("lab", args.rows)
            stages.append((f"run {protocol}", [repeval, "run", str(run_config(work, store, dataset, protocol, args))],
                           n, protocol))
        for name, cmd, n, protocol in stages:
            res = measured(cmd, work / f"{name.replace(' ', '-')}.log")
            # a run that failed after its cell (in the report) still recorded the cell's fit
            row = {"stage": name, "rows": n, **res, **(ledger_cell(store, protocol) if protocol else {})}
            rows.append(row)
            print(f"  {name}: {res['seconds']:.1f} s, peak RSS {res['peak_tree'] / MiB:.0f} MiB "
                  f"(largest process {res['peak_largest'] / MiB:.0f} MiB)"
                  + (f", cell {row['fit_s']:.1f} s on {row['threads']} thread(s), score {row['score']:.4f}"
                     if row.get("fit_s") is not None
                     and row.get("score") is not None else "") + ("" if res["rc"] == 0 else " FAILED"), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    table = [[r["stage"], r["rows"], r["seconds"], r.get("fit_s") if r.get("fit_s") is not None else "-",
              r.get("threads") or "-",
              r["peak_tree"] / MiB, r["peak_largest"] / MiB, r["peak_tree"] / (r["rows"] * args.dim * 2),
              f"{r['score']:.4f}" if r.get("score") is not None else "-", "ok" if r["rc"] == 0 else "FAILED"]
             for r in rows]
    print_tables(f"Lab-size run ({args.rows} x {args.dim} float16, {args.classes} classes, {args.test} test rows; "
                 "peak RSS sampled every 0.2 s over each stage's process tree)",
                 ["stage", "train rows", "seconds", "cell s", "cell threads", "peak RSS MiB", "largest process MiB",
                  "peak / features", "score", "status"], table, args.markdown)
    print(f"\ntotal wall time: {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
