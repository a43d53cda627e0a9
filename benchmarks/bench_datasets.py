"""Listing and fingerprinting an ImageNet-size image tree, without reading the images.

Generates an ILSVRC-2012-style tree of small files (default 100,000 in 1,000 synset
folders under ``train/``, plus one ``val/`` image per class) and times, side by side in
one process, interleaved, 3 repeats each:

* ``repeval imagenet (stat)``: ``make_dataset("imagenet", root=...)`` (list, stat every
  file, parse labels) plus ``fingerprint("train")`` from the file list with sizes and
  modification times: what a run does before extraction;
* ``torchvision ImageFolder``: ``ImageFolder(root/train)``, the listing a user would
  otherwise write (no stat, no fingerprint);
* ``repeval imagenet (content)``: the same with ``content_hash=True``, every byte read
  (the files here are tiny, so this understates the cost on real JPEGs, ~110 kB each).

The tree is freshly written, so it is in the page cache: the figures are warm-cache
times. Target: under 30 s for 100,000 files (printed, not asserted).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_datasets.py [--files 100000] [--classes 1000]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_S = 30.0


def make_tree(root: Path, files: int, classes: int) -> None:
    """``train/<wnid>/<wnid>_<k>.JPEG`` (files // classes each) and ``val/<wnid>/`` (one each)."""
    payload = b"\xff\xd8" + os.urandom(190)  # a small stand-in: listing never decodes
    per_class = files // classes
    for c in range(classes):
        wnid = f"n{c:08d}"
        for split, count in (("train", per_class), ("val", 1)):
            folder = root / split / wnid
            folder.mkdir(parents=True)
            for k in range(count):
                (folder / f"{wnid}_{k}.JPEG").write_bytes(payload)


def time_ours(root: Path, content: bool) -> tuple[float, int, int]:
    from pipeline.datasets import make_dataset

    started = time.perf_counter()
    ds = make_dataset("imagenet", root=root, content_hash=content)
    ds.fingerprint("train")
    return time.perf_counter() - started, ds.num_samples("train"), len(pickle.dumps(ds))


def time_torchvision(root: Path) -> tuple[float, int]:
    from torchvision.datasets import ImageFolder

    started = time.perf_counter()
    folder = ImageFolder(str(root / "train"))
    return time.perf_counter() - started, len(folder.samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # import both sides before timing: library import is not part of any figure
    import torchvision.datasets  # noqa: F401

    import pipeline.datasets  # noqa: F401

    with tempfile.TemporaryDirectory(prefix="repeval-bench-datasets-") as tmp:
        root = Path(tmp) / "imagenet"
        started = time.perf_counter()
        make_tree(root, args.files, args.classes)
        print(f"generated {args.files:,} train files in {args.classes:,} folders (+{args.classes:,} val) "
              f"in {time.perf_counter() - started:.1f} s")
        ours, theirs, content = [], [], []
        for _ in range(args.repeats):  # interleaved: the machine's load drifts between repeats
            t, n, pickled = time_ours(root, content=False)
            ours.append(t)
            t_tv, n_tv = time_torchvision(root)
            theirs.append(t_tv)
            content.append(time_ours(root, content=True)[0])
        if n != n_tv:
            raise SystemExit(f"listing disagrees: repeval {n} files, torchvision {n_tv}")
        med = statistics.median
        rows = [("repeval imagenet (stat fingerprint)", med(ours)), ("torchvision ImageFolder (listing only)",
                                                                    med(theirs)),
                ("repeval imagenet (content fingerprint)", med(content))]
        print(f"{'what':42s} {'median s':>9s} {'files/s':>10s}  ratio to torchvision")
        for label, seconds in rows:
            print(f"{label:42s} {seconds:9.2f} {n / seconds:10,.0f}  {seconds / med(theirs):.2f}x")
        print(f"per-pair ratio repeval stat / torchvision: median "
              f"{med([a / b for a, b in zip(ours, theirs)]):.2f}x")
        print(f"adapter pickled for each DataLoader worker: {pickled / 1e6:.1f} MB")
        verdict = "meets" if med(ours) < TARGET_S else "MISSES"
        print(f"listing + stat fingerprint of {n:,} files: {med(ours):.2f} s ({verdict} the {TARGET_S:.0f} s target)")


if __name__ == "__main__":
    main()
