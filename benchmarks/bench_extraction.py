"""Throughput of the extraction job against a bare forward-pass loop over the same batches.

Compared: ``jobs.extraction.extract.extract`` writing every batch's features into a fresh local
FeatureStore (labels, lease, array creation with provenance, chunk writes on the writer
thread, chunk-done markers, completion record), against a loop that feeds the same model
the same batches and keeps nothing: ``for images in iter_batches_for_benchmark(...):
encoder.forward(images)``. Why this is the fair comparison: both sides use the one
loaded ``Encoder`` (same weights, device, autocast setting and thread budget), the same
transform, the same DataLoader settings (``num_workers`` 0, the job's default) and the
same batch boundaries (``iter_batches_for_benchmark`` yields exactly the job's batches),
so the only difference is what the job adds around the forward pass. Model loading is
outside both timings (the job accepts a loaded Encoder; a real run pays it once either
way). The job runs with ``progress=False``, as the benchmark flow runs it; everything
else is ``ExtractConfig``'s defaults apart from ``batch_size``.

Threads: one torch/BLAS thread for both sides by default (``--threads``). On this shared
2-core machine, with torch's default of 2 threads, the same pass took anywhere from 2.4 s
to 29 s depending on what other processes were doing (OpenMP workers waiting for
descheduled siblings; ViT-tiny at 64 px is hundreds of tiny ops per batch), which buries
a 10 % effect. The job's writer thread is then free to use the second core; its work
(zstd of one 512 KiB chunk per 4 batches) is small next to the forward pass.

Per model: one untimed warm-up of each side, then bare, job, bare, job, ... and the
medians, and the median of the per-pair ratios (robust to load that drifts between pairs
on a shared machine; the goal verdict uses it). images/s = images / wall time of the whole call (for the job: from the
FeatureStore's creation to the returned report). The job's own ``images_per_s`` (timed
from its first batch, so without its setup) is printed beside it.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_extraction.py [--quick] [--markdown]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (  # noqa: E402
    limit_threads, machine_line, median, pair_ratios, print_tables, timed, verdict,
)

GOAL = 0.9
FULL = dict(models=("resnet18", "vit_tiny_patch16_224"), batches=21, repeats=5)
QUICK = dict(models=("resnet18",), batches=4, repeats=2)


def bench_model(arch: str, input_size: int, batch_size: int, n_batches: int, repeats: int) -> dict:
    from jobs.extraction.extract import ExtractConfig, extract
    from jobs.extraction.forward import iter_batches_for_benchmark
    from pipeline.datasets import TexturesDataset
    from pipeline.encoders import EncoderSpec, load_encoder
    from storage_schema import FeatureStore

    n_images = batch_size * n_batches
    n_classes = 4
    dataset = TexturesDataset(n_per_class={"train": -(-n_images // n_classes)})
    n_images = dataset.num_samples("train")
    encoder = load_encoder(EncoderSpec(name=arch, arch=arch, input_size=input_size))
    config = ExtractConfig(batch_size=batch_size, progress=False)
    tmp = Path(tempfile.mkdtemp(prefix="repeval-bench-extract-"))

    def bare() -> int:
        images = 0
        for batch in iter_batches_for_benchmark(dataset, "train", encoder, batch_size):
            feats = encoder.forward(batch)
            images += next(iter(feats.values())).shape[0]
        return images

    runs = 0

    def job():
        nonlocal runs
        runs += 1
        store = FeatureStore(str(tmp / f"store-{runs}"))
        report = extract(store, encoder, dataset, "train", config)
        if report.status != "extracted" or report.images != n_images:
            raise RuntimeError(f"unexpected extraction report: {report.status}, {report.images} images")
        return report

    try:
        bare(), job()  # warm-up: first-call allocations, oneDNN kernels, lazy imports
        t_bare, t_job, job_rates = [], [], []
        for _ in range(repeats):
            t, images = timed(bare)
            assert images == n_images
            t_bare.append(t)
            t, report = timed(job)
            t_job.append(t)
            job_rates.append(report.images_per_s)
            shutil.rmtree(tmp / f"store-{runs}", ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"arch": arch, "input_size": input_size, "images": n_images, "batches": -(-n_images // batch_size),
            "t_bare": t_bare, "t_job": t_job, "job_rates": job_rates, "device": str(encoder.device),
            "autocast": encoder.autocast, "dims": encoder.feature_dims()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="resnet18 only, 4 batches, 2 repeats (< 60 s)")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    p.add_argument("--repeats", type=int, default=None, help="timed pairs per model (default 5; quick 2)")
    p.add_argument("--models", nargs="+", default=None, help="timm architectures (default resnet18 vit_tiny_patch16_224)")
    p.add_argument("--input-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=None, help="batches per pass (default 21; quick 4)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch/BLAS threads for both sides (default 1; 0: the libraries' defaults)")
    args = p.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    models = args.models or cfg["models"]
    repeats = args.repeats or cfg["repeats"]
    n_batches = args.batches or cfg["batches"]
    threads = limit_threads(args.threads or None)
    started = time.perf_counter()
    print(f"bench_extraction ({'quick' if args.quick else 'full'}): textures dataset, batch_size "
          f"{args.batch_size}, input {args.input_size}px, random weights; warm-up of each side, then "
          f"{repeats} alternating pairs (bare, job, ...) per model; medians")
    print(f"machine: {machine_line()}; threads: {threads}")

    results = []
    for arch in models:
        res = bench_model(arch, args.input_size, args.batch_size, n_batches, repeats)
        results.append(res)
        print(f"  {arch}: bare {[round(t, 2) for t in res['t_bare']]} s, job {[round(t, 2) for t in res['t_job']]} s "
              f"({res['images']} images, device {res['device']}, dims {res['dims']})", flush=True)

    rows = []
    for res in results:
        bare_rate = res["images"] / median(res["t_bare"])
        job_rate = res["images"] / median(res["t_job"])
        ratio = job_rate / bare_rate
        paired = median(pair_ratios(res["t_bare"], res["t_job"]))  # per pair: job img/s over bare img/s
        rows.append([f"{res['arch']} @{res['input_size']}px", f"{res['images']} ({res['batches']})",
                     bare_rate, job_rate, f"{ratio:.3f}x", f"{paired:.3f}x", median(res["job_rates"]),
                     verdict(paired, GOAL).replace("x)", "x of bare)")])
    print_tables(f"Extraction throughput (median of {repeats} alternating pairs)",
                 ["model", "images (batches)", "bare loop img/s", "extract job img/s",
                  "job / bare (ratio of medians)", "job / bare (median of pair ratios)",
                  "job's own img/s (from 1st batch)", "goal (on pair ratios)"], rows, args.markdown)
    print(f"\ntotal wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
