"""The dense heads' training: SGD with momentum and the seed's polynomial decay, resumable.

The seed's dense tasks (Goyal et al. 2019's code, used by Ericsson et al. 2021) train with
SGD, momentum 0.9, weight decay, and a learning rate ``lr * (1 - t / T) ** 0.9`` at step t
of T; here T = epochs x steps per epoch, so ``epochs`` scales the schedule to a budget.
Each epoch visits the training rows in an order drawn from ``(seed, epoch)`` alone, so a
run resumed at any step feeds the same batches as an uninterrupted one. Every
``save_every`` steps and at the end the head, the optimiser's momentum buffers, the step and
the losses are saved atomically in the run's scratch folder (``pipeline.protocols.finetune.state``);
a later call with the same identity resumes from there and ends, on the CPU, with bitwise
the same head. A non-finite loss stops the run: it is reported as diverged, never scored.
"""

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
    """How a head is trained.

    Parameters
    ----------
    learning_rate : float
        Peak learning rate (step 0).
    epochs : int
        Passes over the training rows; T = epochs x ceil(rows / batch_size).
    batch_size : int
        Images per step.
    momentum, weight_decay, power : float
        SGD momentum, L2 weight decay and the polynomial decay's power.
    seed : int
        Seeds the batch order.
    save_every : int
        Steps between saved states (resumable runs only).
    """

    learning_rate: float
    epochs: int
    batch_size: int
    momentum: float
    weight_decay: float
    power: float
    seed: int
    save_every: int

    def learning_rate_at(self, step: int, total: int) -> float:
        """``learning_rate * (1 - step / total) ** power``.

        Parameters
        ----------
        step, total : int

        Returns
        -------
        float
        """
        return self.learning_rate * (1.0 - step / total) ** self.power


@dataclass(frozen=True)
class Rows:
    """Training rows drawn from several arrays without concatenating them.

    Parameters
    ----------
    maps : sequence of array
        (n_i, h, w, d) maps of each part (train, validation).
    targets : sequence of array
        Their targets.
    index : numpy.ndarray
        (N, 2) int64: (part, row) of every training row, in order.
    """

    maps: Sequence[Any]
    targets: Sequence[Any]
    index: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    def batch(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Maps and targets of the rows at ``positions`` (in that order).

        Parameters
        ----------
        positions : numpy.ndarray
            Positions into :attr:`index`.

        Returns
        -------
        tuple of numpy.ndarray
        """
        chosen = self.index[positions]
        maps, targets = [], []
        for part, row in chosen:
            maps.append(np.asarray(self.maps[part][row]))
            targets.append(np.asarray(self.targets[part][row]))
        return np.stack(maps), np.stack(targets)


@dataclass
class TrainOutcome:
    """What a training run did.

    Parameters
    ----------
    losses : list of float
        The loss of every step.
    steps : int
        Steps trained (T unless it diverged).
    total_steps : int
        T.
    resumed_from : int or None
        The saved step it resumed at.
    diverged : bool
        Stopped at a non-finite loss.
    seconds : float
        Wall time of this call.
    """

    losses: list[float] = field(default_factory=list)
    steps: int = 0
    total_steps: int = 0
    resumed_from: int | None = None
    diverged: bool = False
    seconds: float = 0.0


def channel_stats(parts: Sequence[Any], rows: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation over every pixel of the given rows (float64).

    Parameters
    ----------
    parts : sequence of array
        (n_i, h, w, d) maps.
    rows : sequence of numpy.ndarray
        The rows of each part that count (the training rows only).

    Returns
    -------
    tuple of torch.Tensor
        float32 (d,) mean and std (a constant channel gets std 1).
    """
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
    """Train ``head`` on ``rows`` by the schedule; resumable from ``scratch``.

    Parameters
    ----------
    head : torch.nn.Module
        The head, on ``device`` (trained in place).
    rows : Rows
        The training rows.
    schedule : Schedule
    loss_fn : callable
        ``loss_fn(upsampled outputs (B, C, H, W), targets) -> scalar``.
    size : tuple of int
        (H, W) of the targets.
    device : torch.device
    scratch : Path or None
        This run's folder for its saved state (None: not saved).
    identity : str
        What a saved state must match (``run_identity`` of the run).
    on_step : callable, optional
        Called with the number of finished steps after each step.

    Returns
    -------
    TrainOutcome
    """
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
    """The head's predictions at the targets' resolution, a batch of images at a time.

    Parameters
    ----------
    head : torch.nn.Module
    maps : array
        (n, h, w, d) maps.
    size : tuple of int
        (H, W).
    batch_size : int
    device : torch.device
    finish : callable
        Upsampled outputs (B, C, H, W) -> predictions (class maps, unit normals).

    Yields
    ------
    tuple
        ``(first row, predictions as numpy)``.
    """
    head.eval()
    with torch.inference_mode():
        for start in range(0, len(maps), batch_size):
            x = torch.from_numpy(np.asarray(maps[start:start + batch_size])).to(device, torch.float32)
            yield start, finish(upsample(head(x), size)).cpu().numpy()
