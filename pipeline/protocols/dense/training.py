"""The dense heads' training: SGD with momentum and the seed's polynomial decay, resumable."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.protocols.dense.heads import upsample
from pipeline.protocols.finetune.state import load_state, save_state

__all__ = ["Rows", "Schedule", "TrainOutcome", "channel_stats", "predict_batches", "train_head"]

_STAT_ROWS = 64  # images per block when the channel statistics are accumulated


@dataclass(frozen=True)
class Schedule:
    """How a head is trained."""

    learning_rate: float
    epochs: int
    batch_size: int
    momentum: float
    weight_decay: float
    power: float
    seed: int
    save_every: int

    def learning_rate_at(self, step: int, total: int) -> float:
        """``learning_rate * (1 - step / total) ** power``."""
        return self.learning_rate * (1.0 - step / total) ** self.power


@dataclass(frozen=True)
class Rows:
    """Training rows drawn from several arrays without concatenating them."""

    maps: Sequence[Any]
    targets: Sequence[Any]
    index: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    def batch(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Maps and targets of the rows at ``positions`` (in that order)."""
        chosen = self.index[positions]
        maps, targets = [], []
        for part, row in chosen:
            maps.append(np.asarray(self.maps[part][row]))
            targets.append(np.asarray(self.targets[part][row]))
        return np.stack(maps), np.stack(targets)


@dataclass
class TrainOutcome:
    """What a training run did."""

    losses: list[float] = field(default_factory=list)
    steps: int = 0
    total_steps: int = 0
    resumed_from: int | None = None
    diverged: bool = False
    seconds: float = 0.0


def channel_stats(parts: Sequence[Any], rows: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation over every pixel of the given rows (float64)."""
    total, sq, count = 0.0, 0.0, 0
    for X, chosen in zip(parts, rows):
        for start in range(0, len(chosen), _STAT_ROWS):
            block = np.asarray(X[np.sort(chosen[start:start + _STAT_ROWS])], dtype=np.float64)
            flat = block.reshape(-1, block.shape[-1])
            total, sq, count = total + flat.sum(axis=0), sq + (flat * flat).sum(axis=0), count + len(flat)
    mean = total / count
    std = np.sqrt(np.maximum(sq / count - mean * mean, 0.0))
    std = np.where(std > 1e-6 * np.maximum(np.abs(mean), 1.0), std, 1.0)
    return torch.from_numpy(mean.astype(np.float32)), torch.from_numpy(std.astype(np.float32))


def train_head(head: torch.nn.Module, rows: Rows, schedule: Schedule,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], size: tuple[int, int],
               device: torch.device, scratch: Path | None = None, identity: str = "",
               on_step: Callable[[int], None] | None = None) -> TrainOutcome:
    """Train ``head`` on ``rows`` by the schedule; resumable from ``scratch``."""
    started = time.perf_counter()
    per_epoch = -(-len(rows) // schedule.batch_size)
    total = schedule.epochs * per_epoch
    optimizer = torch.optim.SGD(head.parameters(), lr=schedule.learning_rate, momentum=schedule.momentum,
                                weight_decay=schedule.weight_decay)
    out = TrainOutcome(total_steps=total)
    saved = load_state(scratch, identity, what="dense training") if scratch is not None else None
    if saved is not None:
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        out.losses, out.steps, out.diverged = list(saved["losses"]), int(saved["step"]), bool(saved["diverged"])
        out.resumed_from = out.steps
    head.train()
    order, epoch_of_order = None, -1
    while out.steps < total and not out.diverged:
        epoch, position = divmod(out.steps, per_epoch)
        if epoch != epoch_of_order:
            order = np.random.default_rng([schedule.seed, epoch]).permutation(len(rows))
            epoch_of_order = epoch
        maps, targets = rows.batch(order[position * schedule.batch_size:(position + 1) * schedule.batch_size])
        for group in optimizer.param_groups:
            group["lr"] = schedule.learning_rate_at(out.steps, total)
        outputs = upsample(head(torch.from_numpy(maps).to(device, torch.float32)), size)
        loss = loss_fn(outputs, torch.from_numpy(targets).to(device))
        value = float(loss.detach())
        out.losses.append(value)
        if not np.isfinite(value):
            out.diverged = True
        else:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        out.steps += 1
        last = out.steps == total or out.diverged
        if scratch is not None and (out.steps % schedule.save_every == 0 or last):
            save_state(scratch, {"identity": identity, "step": out.steps, "head": head.state_dict(),
                                 "optimizer": optimizer.state_dict(), "losses": out.losses,
                                 "diverged": out.diverged})
        if on_step is not None:
            on_step(out.steps)
    head.eval()
    out.seconds = time.perf_counter() - started
    return out


def predict_batches(head: torch.nn.Module, maps: Any, size: tuple[int, int], batch_size: int, device: torch.device,
                    finish: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[tuple[int, np.ndarray]]:
    """The head's predictions at the targets' resolution, a batch of images at a time."""
    head.eval()
    with torch.inference_mode():
        for start in range(0, len(maps), batch_size):
            x = torch.from_numpy(np.asarray(maps[start:start + batch_size])).to(device, torch.float32)
            yield start, finish(upsample(head(x), size)).cpu().numpy()
