"""Training speed of one fine-tuning run against a bare torch training loop.

Compared: ``pipeline.protocols.finetune.run_grid_point`` (seeded per-draw augmentation, the step
sampler, periodic atomic saves of the whole training state, deterministic kernels on CPU) against
the loop a user would write: the same timm model with a linear head, the same timm training
transform (random resized crop + flip), a ``DataLoader(shuffle=True, drop_last=True)``
cycled for the same number of steps, SGD with Nesterov momentum and ``CosineAnnealingLR``,
cross-entropy, ``backward``, ``step``; nothing saved, no per-draw seeding.

Both sides: resnet18 at 64 px (random init), batch 64, the textures dataset (256 train
images, 32 px, resized by the transform), the same device, thread budget and number of
DataLoader workers. steps/s counts the training loop only (for ``run_grid_point`` its own
``timing.steps_per_second``: from the first batch to the last step, saves included; model
loading and the evaluation pass are outside). The whole call's wall time is printed too.

Runs alternate bare, ours, bare, ours, ... after one untimed warm-up of each; printed are
the medians and the median of the per-pair ratios (ours / bare; 1.0 = no overhead).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_finetune.py [--steps 10] [--markdown]``;
on a GPU machine: ``... bench_finetune.py --device cuda --steps 200 --workers 8``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import limit_threads, machine_line, median, pair_ratios, print_tables  # noqa: E402

ARCH, SIZE, BATCH, TRAIN_PER_CLASS = "resnet18", 64, 64, 64


def _dataset():
    from pipeline.datasets import make_dataset

    return make_dataset("textures", n_per_class={"train": TRAIN_PER_CLASS, "test": 8})


def bare_loop(device: str, steps: int, workers: int, lr: float, wd: float) -> float:
    """steps/s of the plain training loop (model built outside the timing)."""
    import timm
    import torch
    import torch.nn.functional as F
    from timm.data import create_transform, resolve_model_data_config
    from torch.utils.data import DataLoader

    from pipeline.datasets import TorchImageDataset

    dataset = _dataset()
    labels = torch.as_tensor(dataset.labels("train"))
    model = timm.create_model(ARCH, num_classes=len(dataset.class_names)).to(device).train()
    cfg = {**resolve_model_data_config(model), "input_size": (3, SIZE, SIZE)}
    transform = create_transform(**cfg, is_training=True, hflip=0.5, color_jitter=None)
    loader = DataLoader(TorchImageDataset(dataset, "train", transform), batch_size=BATCH, shuffle=True,
                        drop_last=True, num_workers=workers, pin_memory=device == "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=wd / lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)

    def batches():
        while True:
            yield from loader

    _sync(device)
    started, done = time.perf_counter(), 0
    for images, index in batches():
        if done == steps:
            break
        images, target = images.to(device, non_blocking=True), labels[index].to(device, non_blocking=True)
        loss = F.cross_entropy(model(images), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        done += 1
    _sync(device)
    return steps / (time.perf_counter() - started)


def ours(device: str, steps: int, workers: int, lr: float, wd: float, save_every: int) -> tuple[float, float]:
    """(train-loop steps/s, whole-call seconds) of run_grid_point in a fresh scratch folder."""
    from pipeline.encoders import EncoderSpec
    from pipeline.protocols.finetune import RANDOM_RESIZED_CROP_FLIP, FinetuneSettings, GridPoint, run_grid_point

    settings = FinetuneSettings(steps=steps, batch_size=BATCH, lrs=(lr,), weight_decays=(wd,),
                                save_every=save_every, num_workers=workers)
    spec = EncoderSpec(name=ARCH, arch=ARCH, input_size=SIZE)
    with tempfile.TemporaryDirectory(prefix="repeval-bench-finetune-") as scratch:
        started = time.perf_counter()
        result = run_grid_point(spec, _dataset(), settings, GridPoint(lr, wd, RANDOM_RESIZED_CROP_FLIP),
                                scratch, device)
        return result["timing"]["steps_per_second"], time.perf_counter() - started


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers, both sides")
    parser.add_argument("--save-every", type=int, default=250, help="run_grid_point's save interval (default: "
                        "the setting's default; a run shorter than it saves once, at the end)")
    parser.add_argument("--threads", type=int, default=1, help="torch/BLAS threads (0: library default)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    threads = limit_threads(args.threads or None)
    lr, wd = 0.01, 1e-4
    print(f"{machine_line()}; threads: {threads}; device {args.device}")
    print(f"{ARCH} @ {SIZE} px, batch {BATCH}, {args.steps} steps, {args.workers} DataLoader workers, "
          f"{args.repeats} timed repeats per side")
    bare_loop(args.device, max(2, args.steps // 5), args.workers, lr, wd)  # warm-up (allocator, kernels)
    ours(args.device, max(2, args.steps // 5), args.workers, lr, wd, args.save_every)
    bare, mine, calls = [], [], []
    for _ in range(args.repeats):
        bare.append(bare_loop(args.device, args.steps, args.workers, lr, wd))
        sps, seconds = ours(args.device, args.steps, args.workers, lr, wd, args.save_every)
        mine.append(sps)
        calls.append(seconds)
    ratios = pair_ratios(mine, bare)
    rows = [
        ["bare torch loop", median(bare), median(bare) * BATCH, "-"],
        ["run_grid_point", median(mine), median(mine) * BATCH, f"{median(calls):.2f} s"],
    ]
    print_tables(f"Fine-tuning steps/s ({args.device})", ["side", "steps/s", "images/s", "whole call"], rows,
                 args.markdown)
    print(f"\nratio run_grid_point / bare: median of per-pair ratios {median(ratios):.3f} "
          f"(ratio of medians {median(mine) / median(bare):.3f}); pairs: {', '.join(f'{r:.3f}' for r in ratios)}")


if __name__ == "__main__":
    main()
