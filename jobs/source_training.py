"""A few steps of supervised training on a source task, saved as a checkpoint.

The demo uses it to make encoders of graded quality from one architecture (more steps,
better source accuracy), so that the transfer correlation has something to find. The
source-task test accuracy is written beside the checkpoint as its reference score.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import timm
import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader

from pipeline.datasets import DatasetAdapter, TorchImageDataset
from pipeline.encoders import EncoderSpec, load_encoder


@dataclass
class TrainedCheckpoint:
    path: str
    steps: int
    source_accuracy: float


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
        pred = model(images).argmax(1).numpy()
        correct += int(np.sum(pred == adapter.labels(split)[index.numpy()]))
    return correct / adapter.num_samples(split)


def train_checkpoints(arch: str, source: DatasetAdapter, steps: list[int], out_dir: str, *,
                      input_size: int = 32, batch_size: int = 64, lr: float = 2e-3, seed: int = 0,
                      prefix: str = "") -> list[TrainedCheckpoint]:
    """Train ``arch`` from a seeded random init, saving a checkpoint at each step count."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the frozen-encoder view of the same weights gives the exact evaluation transform
    transform = load_encoder(EncoderSpec(name="source", arch=arch, input_size=input_size, seed=seed)).transform()
    torch.manual_seed(seed)
    kwargs = {"img_size": input_size} if "vit" in arch else {}
    model = timm.create_model(arch, pretrained=False, num_classes=len(source.class_names), **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    batches = _batches(source, "train", transform, batch_size, seed)
    saved, done = [], 0
    for target in sorted(steps):
        model.train()
        while done < target:
            images, index = next(batches)
            labels = torch.as_tensor(source.labels("train")[index.numpy()])
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
        acc = _accuracy(model, source, "test", transform)
        path = out / f"{prefix}{arch}-step{target:04d}.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        path.with_suffix(".json").write_text(json.dumps(
            {"reference_score": acc, "steps": target, "arch": arch, "source": source.describe()}))
        saved.append(TrainedCheckpoint(str(path), target, acc))
    return saved
