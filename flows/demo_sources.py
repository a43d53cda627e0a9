"""A few steps of supervised training on a source task, saved as a checkpoint."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import timm
import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader

from pipeline.datasets import DatasetAdapter, TorchImageDataset
from pipeline.encoders import EncoderSpec, load_encoder


#: Threads torch uses while training, on every machine (results depend on the count).
TRAINING_THREADS = 1
#: Training runs in float64: the CPU's kernels (oneDNN, MKL, ATen's vector code) sum in an
#: order of their own per instruction set, and a hundred optimiser steps amplify float32's
#: rounding differences into other checkpoints; float64's are about 1e9 times smaller, so
#: every machine's checkpoints agree to far below float32's resolution.
TRAINING_DTYPE = torch.float64


@dataclass
class TrainedCheckpoint:
    """A checkpoint written by :func:`train_checkpoints`."""

    path: str
    steps: int
    source_accuracy: float


@contextlib.contextmanager
def reproducible_torch(seed: int, threads: int = TRAINING_THREADS) -> Iterator[None]:
    """Seeded, deterministic, fixed-thread torch on the CPU while the block runs."""
    previous_threads = torch.get_num_threads()
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        # warn_only: an op without a deterministic kernel warns instead of stopping the demo
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
            torch.set_num_threads(previous_threads)


@contextlib.contextmanager
def portable_init() -> Iterator[None]:
    """``Tensor.normal_`` and ``Tensor.uniform_`` drawn the same under every CPU kernel set
    while the block runs."""
    # torch's samplers have vector kernels (the same on AVX2 and AVX-512) and scalar ones
    # (``ATEN_CPU_CAPABILITY=default``) that round differently: a resnet18's initial weights
    # then differ in the last bit of millions of values, and training amplifies that into other
    # checkpoints. Here both draws are computed in float64 from ``torch.rand`` (whose float64
    # draws are exact on both kernels; normal: a Box-Muller transform) and rounded to the
    # tensor's dtype, where the kernels' last-bit differences in float64 ``log`` and ``cos``
    # vanish. Only model construction runs under it (``nn.init``'s initialisers call these).
    originals = torch.Tensor.normal_, torch.Tensor.uniform_

    def normal_(tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> torch.Tensor:
        u1 = torch.rand(tensor.shape, dtype=torch.float64, generator=generator)
        u2 = torch.rand(tensor.shape, dtype=torch.float64, generator=generator)
        z = torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos((2.0 * np.pi) * u2)
        with torch.no_grad():
            return tensor.copy_(z * std + mean)

    def uniform_(tensor: torch.Tensor, a: float = 0.0, b: float = 1.0, *, generator=None) -> torch.Tensor:
        u = torch.rand(tensor.shape, dtype=torch.float64, generator=generator)
        with torch.no_grad():
            return tensor.copy_(u * (b - a) + a)

    torch.Tensor.normal_, torch.Tensor.uniform_ = normal_, uniform_
    try:
        yield
    finally:
        torch.Tensor.normal_, torch.Tensor.uniform_ = originals


def _batches(adapter: DatasetAdapter, split: str, transform, batch_size: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    while True:  # endless shuffled epochs
        yield from DataLoader(TorchImageDataset(adapter, split, transform), batch_size=batch_size,
                              shuffle=True, generator=gen, drop_last=True)


@torch.no_grad()
def _accuracy(model: torch.nn.Module, adapter: DatasetAdapter, split: str, transform) -> float:
    model.eval()
    correct = 0
    for images, index in DataLoader(TorchImageDataset(adapter, split, transform), batch_size=256):
        pred = model(images.to(TRAINING_DTYPE)).argmax(1).numpy()
        correct += int(np.sum(pred == adapter.labels(split)[index.numpy()]))
    return correct / adapter.num_samples(split)


def train_checkpoints(arch: str, source: DatasetAdapter, steps: list[int], out_dir: str, *,
                      input_size: int = 32, batch_size: int = 64, lr: float = 2e-3, seed: int = 0,
                      prefix: str = "", threads: int = TRAINING_THREADS) -> list[TrainedCheckpoint]:
    """Train ``arch`` from a seeded random init, saving a checkpoint at each step count."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with reproducible_torch(seed, threads):  # building an encoder seeds torch too: inside the guard
        # the frozen-encoder view of the same weights gives the exact evaluation transform
        transform = load_encoder(EncoderSpec(name="source", arch=arch, input_size=input_size, seed=seed)).transform()
        torch.manual_seed(seed)
        return _train(arch, source, steps, out, transform, input_size, batch_size, lr, seed, prefix)


def _train(arch: str, source: DatasetAdapter, steps: list[int], out: Path, transform, input_size: int,
           batch_size: int, lr: float, seed: int, prefix: str) -> list[TrainedCheckpoint]:
    kwargs = {"img_size": input_size} if "vit" in arch else {}
    with portable_init():  # initial weights that do not depend on the CPU's vector kernels
        model = timm.create_model(arch, pretrained=False, num_classes=len(source.class_names), **kwargs)
    model = model.to(TRAINING_DTYPE)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    batches = _batches(source, "train", transform, batch_size, seed)
    saved, done = [], 0
    for target in sorted(steps):
        model.train()
        while done < target:
            images, index = next(batches)
            labels = torch.as_tensor(source.labels("train")[index.numpy()])
            loss = torch.nn.functional.cross_entropy(model(images.to(TRAINING_DTYPE)), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
        acc = _accuracy(model, source, "test", transform)
        path = out / f"{prefix}{arch}-step{target:04d}.safetensors"
        save_file({k: (v.float() if v.is_floating_point() else v).contiguous()
                   for k, v in model.state_dict().items()}, str(path))  # float32, as training code saves
        path.with_suffix(".json").write_text(json.dumps(
            {"reference_score": acc, "steps": target, "arch": arch, "source": source.describe()}))
        saved.append(TrainedCheckpoint(str(path), target, acc))
    return saved
