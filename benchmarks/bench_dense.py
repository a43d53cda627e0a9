"""What the dense readouts cost: store bytes per image of spatial maps and per-pixel targets,
and seconds per training epoch of the dense heads against a bare torch loop.

Store: random-init resnet18 (``block2.map``, ``block3.map``) and vit_tiny_patch16_224
(``block11.map``) at 224 px extract a generated ADE20K-layout copy (images 256 x 320, 150
classes) into a temporary store; per image, the bytes a map or target takes in float16 /
uint8 before compression and on disk (Zstd level 1 + crc32c chunks), and the NYUv2 normals'
float16 targets likewise.

Training: ``train_head`` (the protocols' loop: per-epoch seeded order, polynomial decay,
resumable saves every ``save_every`` steps) against the loop a user would write (the same
head, SGD with momentum, ``LambdaLR`` with the same decay, no saves), on in-memory float16
maps of a resnet18 ``block3.map`` at 224 px (14 x 14 x 256) with targets at 224 x 224:
segmentation (linear head, 150 classes, cross-entropy) and normals (the ``conv`` head, 256
hidden channels, cosine loss). The normals heads' table: seconds per epoch of ``train_head``
for the ``conv`` head (regression) and the default ``pspnet`` head (classification over 40
clustered normals) on the same maps. Runs alternate bare, ours, ... after one untimed warm-up;
printed are the median seconds per epoch and the median per-pair ratio (ours / bare).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_dense.py [--images 64] [--repeats 3]
[--device cuda] [--markdown] [--heads-only]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import limit_threads, machine_line, median, pair_ratios, print_tables, timed  # noqa: E402

SIZE, BATCH, K = 224, 8, 150


def _ade_copy(root: Path, n: int) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, folder in (("train", "training"), ("val", "validation")):
        for sub in ("images", "annotations"):
            (root / "ADEChallengeData2016" / sub / folder).mkdir(parents=True)
        for i in range(1, n + 1):
            labels = np.kron(rng.integers(0, K + 1, (8, 10)), np.ones((32, 32), dtype=np.int64)).astype(np.uint8)
            image = rng.integers(0, 255, (256, 320, 3), dtype=np.uint8)
            base = root / "ADEChallengeData2016"
            Image.fromarray(image).save(base / "images" / folder / f"ADE_{split}_{i:08d}.jpg")
            Image.fromarray(labels, mode="L").save(base / "annotations" / folder / f"ADE_{split}_{i:08d}.png")
    return root


def _disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and f.name != "zarr.json")


def store_rows(n: int, device: str) -> list[list]:
    from jobs.extraction.extract import ExtractConfig, extract
    from pipeline.datasets import make_dataset
    from pipeline.encoders import EncoderSpec, load_encoder
    from storage_schema import FeatureStore

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ade = make_dataset("ade20k", root=str(_ade_copy(root / "ade", n)))
        store = FeatureStore(str(root / "store"))
        config = ExtractConfig(batch_size=8, chunk_batches=1, progress=False, device=device)
        for arch, layers in (("resnet18", ("block2.map", "block3.map")), ("vit_tiny_patch16_224", ("block11.map",))):
            encoder = load_encoder(EncoderSpec(name=arch, arch=arch, input_size=SIZE, layers=layers), device=device)
            extract(store, encoder, ade, "val", config)
            for layer in layers:
                arr = store.features(arch, "ade20k", "val", layer)
                raw = int(arr.read().nbytes) // n
                rows.append([f"{arch} {layer}", "x".join(map(str, arr.shape[1:])), raw,
                             _disk_bytes(root / "store" / arr.key) // n])
        targets = store.open_array(store.features("resnet18", "ade20k", "val", "block3.map").attrs["labels"])
        rows.append([f"ADE20K targets ({targets.key.rsplit('/', 1)[1]})", "x".join(map(str, targets.shape[1:])),
                     int(targets.read().nbytes) // n, _disk_bytes(root / "store" / targets.key) // n])
        rows.append(["NYUv2 normal targets (float16, same crop)", f"{SIZE}x{SIZE}x3", SIZE * SIZE * 3 * 2, "n/a"])
    return rows


def _data(task: str, n: int):
    import numpy as np

    rng = np.random.default_rng(0)
    maps = rng.normal(size=(n, 14, 14, 256)).astype(np.float16)
    if task == "segmentation":
        return maps, rng.integers(0, K, (n, SIZE, SIZE)).astype(np.uint8)
    normals = rng.normal(size=(n, SIZE, SIZE, 3))
    return maps, (normals / np.linalg.norm(normals, axis=-1, keepdims=True)).astype(np.float16)


def _loss(task: str):
    from pipeline.protocols.dense.runners import normals_loss, segmentation_loss  # the protocols' own

    return segmentation_loss(255) if task == "segmentation" else normals_loss


def _head(task: str, maps, device):
    import numpy as np

    from pipeline.protocols.dense.heads import make_head
    from pipeline.protocols.dense.training import channel_stats

    mean, std = channel_stats([maps], [np.arange(len(maps))])
    kind, out, hidden = ("linear", K, 0) if task == "segmentation" else ("conv", 3, 256)
    return make_head(kind, 256, out, hidden, mean, std, 0).to(device)


def ours(task: str, maps, targets, device, scratch: Path) -> float:
    import numpy as np

    from pipeline.protocols.dense.training import Rows, Schedule, train_head

    head = _head(task, maps, device)
    rows = Rows([maps], [targets], np.stack([np.zeros(len(maps)), np.arange(len(maps))], 1).astype(np.int64))
    schedule = Schedule(0.01, 1, BATCH, 0.9, 1e-4, 0.9, 0, 4)
    seconds, _ = timed(lambda: train_head(head, rows, schedule, _loss(task), (SIZE, SIZE), device, scratch, "bench"))
    return seconds


def bare(task: str, maps, targets, device) -> float:
    import numpy as np
    import torch
    import torch.nn.functional as F

    head = _head(task, maps, device)
    loss_fn = _loss(task)
    steps = -(-len(maps) // BATCH)
    opt = torch.optim.SGD(head.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: (1 - t / steps) ** 0.9)

    def run():
        order = np.random.default_rng(0).permutation(len(maps))
        for s in range(steps):
            idx = np.sort(order[s * BATCH:(s + 1) * BATCH])
            x = torch.from_numpy(maps[idx]).to(device, torch.float32)
            y = torch.from_numpy(targets[idx]).to(device)
            out = F.interpolate(head(x), size=(SIZE, SIZE), mode="bilinear", align_corners=False)
            loss = loss_fn(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    return timed(run)[0]


#: The normals heads compared per epoch: (head, formulation, hidden units, batch size): version 1's
#: quick settings and the seed's (the protocol's defaults).
NORMALS_HEADS = (("conv", "regression", 256, 8), ("pspnet", "classification", 512, 4))


def head_rows(n: int, repeats: int, device, scratch: Path) -> list[list]:
    """Seconds per epoch of ``train_head`` for each normals head of :data:`NORMALS_HEADS`."""
    import numpy as np

    from pipeline.protocols.dense.codebook import codebook_loss, normal_codebook
    from pipeline.protocols.dense.heads import make_head
    from pipeline.protocols.dense.training import Rows, Schedule, channel_stats, train_head

    maps, targets = _data("normals", n)
    index = np.arange(len(maps))
    mean, std = channel_stats([maps], [index])
    rows_out = []
    for kind, formulation, hidden, batch in NORMALS_HEADS:
        if formulation == "classification":
            codebook = normal_codebook([targets], [index], 40, 0)
            loss, outputs = codebook_loss(codebook), len(codebook)
        else:
            loss, outputs = _loss("normals"), 3
        rows = Rows([maps], [targets], np.stack([np.zeros(len(maps)), index], 1).astype(np.int64))
        schedule = Schedule(0.01, 1, batch, 0.9, 1e-4, 0.9, 0, 4)
        times = []
        for r in range(repeats + 1):  # the first, untimed: warm-up
            head = make_head(kind, 256, outputs, hidden, mean, std, 0).to(device)
            seconds, _ = timed(lambda: train_head(head, rows, schedule, loss, (SIZE, SIZE), device,
                                                  scratch / f"{kind}-{r}", "bench"))
            times.append(seconds)
        rows_out.append([f"{kind}, {formulation}", hidden, batch, n, median(times[1:])])
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64, help="training images per epoch")
    parser.add_argument("--store-images", type=int, default=16, help="images extracted for the store figures")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--heads-only", action="store_true", help="only the normals heads' table")
    args = parser.parse_args()
    import torch

    threads = limit_threads(args.threads)
    device = torch.device(args.device)
    print(machine_line(), f"threads: {threads}", f"device: {device}", sep="\n")
    with tempfile.TemporaryDirectory() as tmp:
        print_tables(f"normals heads, seconds per epoch (train_head), resnet18 block3.map at {SIZE} px "
                     f"(14 x 14 x 256), targets {SIZE} x {SIZE}",
                     ["head, formulation", "hidden units", "batch", "images", "s / epoch"],
                     head_rows(args.images, args.repeats, device, Path(tmp)), args.markdown)
    if args.heads_only:
        return
    print_tables(f"store bytes per image at {SIZE} px", ["array", "per image", "bytes (float16/uint8)",
                                                         "bytes on disk (Zstd)"],
                 store_rows(args.store_images, args.device), args.markdown)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in ("segmentation", "normals"):
            maps, targets = _data(task, args.images)
            bare(task, maps, targets, device), ours(task, maps, targets, device, Path(tmp) / f"{task}-warm")
            b, o = [], []
            for r in range(args.repeats):
                b.append(bare(task, maps, targets, device))
                o.append(ours(task, maps, targets, device, Path(tmp) / f"{task}-{r}"))
            rows.append([task, args.images, median(b), median(o), median(pair_ratios(o, b))])
    print_tables(f"seconds per epoch, resnet18 block3.map at {SIZE} px (14 x 14 x 256), targets {SIZE} x {SIZE}, "
                 f"batch {BATCH}", ["task", "images", "bare loop (s)", "train_head (s)", "ratio ours / bare"], rows,
                 args.markdown)


if __name__ == "__main__":
    main()
