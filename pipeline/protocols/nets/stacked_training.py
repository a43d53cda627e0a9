"""Seeded minibatch training of small torch probes, a whole hyperparameter grid at once."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from pipeline.protocols.blocks import BLOCK_BYTES
from pipeline.protocols.inputs.features import as_cpu_tensor

__all__ = [
    "GridRecord", "RowBatches", "StackedAdamW", "StackedModel", "evaluate", "select_member",
    "train_epoch", "train_fixed", "train_grid",
]

# Float32 elements of one evaluation pass per device type (the input batch and the members'
# activations; scaled down for wide inputs and wide models): the protocols' block size.
EVAL_ELEMENTS = {kind: size // 4 for kind, size in BLOCK_BYTES.items()}


class StackedModel(Protocol):
    """G models of one architecture with their parameters stacked along axis 0."""

    params: dict[str, torch.Tensor]  # every tensor has G rows along axis 0
    decayed: frozenset[str]  # names of the parameters weight decay applies to
    # optional: activation_elements(row_shape) -> elements all members hold per input row

    def logits(self, xb: torch.Tensor) -> torch.Tensor:
        """Class scores of every member."""
        ...


class StackedAdamW:
    """AdamW (Loshchilov & Hutter 2019) on stacked parameters, one (lr, wd) per member."""
    # The update is torch.optim.AdamW's, written out so the learning rate and weight decay
    # can differ along the member axis: p <- p (1 - lr wd) (decayed parameters only), then
    # p <- p - lr m_hat / (sqrt(v_hat) + eps) with bias-corrected moments.

    def __init__(self, params: Mapping[str, torch.Tensor], lrs: torch.Tensor, wds: torch.Tensor,
                 decayed: frozenset[str], betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params, self.decayed, self.betas, self.eps = dict(params), decayed, betas, eps
        self.lrs, self.wds = lrs, wds
        self.exp_avg = {k: torch.zeros_like(p) for k, p in self.params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in self.params.items()}
        self.steps = 0

    def _member(self, values: torch.Tensor, ndim: int) -> torch.Tensor:
        return values.view((-1,) + (1,) * (ndim - 1))

    @torch.no_grad()
    def step(self) -> None:
        """One update from the ``.grad`` of every parameter."""
        self.steps += 1
        beta1, beta2 = self.betas
        bias1, bias2_sqrt = 1 - beta1**self.steps, math.sqrt(1 - beta2**self.steps)
        for name, p in self.params.items():
            lr = self._member(self.lrs, p.ndim)
            if name in self.decayed:
                p.mul_(1 - lr * self._member(self.wds, p.ndim))
            m, v = self.exp_avg[name], self.exp_avg_sq[name]
            m.lerp_(p.grad, 1 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            # in place, one temporary: p -= m / ((sqrt(v) / bias2_sqrt + eps) * bias1 / lr)
            denom = v.sqrt().div_(bias2_sqrt).add_(self.eps).mul_(bias1 / lr)
            p.addcdiv_(m, denom, value=-1.0)

    def zero_grad(self) -> None:
        """Drop every parameter's gradient."""
        for p in self.params.values():
            p.grad = None


@dataclass(frozen=True)
class GridRecord:
    """What the validated grid run saw, per member (grid point) and epoch."""
    # ``val_accuracy`` / ``val_loss`` are (G, epochs_run) with NaN after a member stopped;
    # ``best_epoch`` counts epochs from 1; ``stopped_early`` marks members whose validation
    # score had not improved for ``patience`` epochs before ``max_epochs``.

    val_accuracy: np.ndarray
    val_loss: np.ndarray
    best_epoch: np.ndarray
    best_accuracy: np.ndarray
    best_loss: np.ndarray
    stopped_early: np.ndarray
    epochs_run: int


class RowBatches:
    """Rows of row-aligned arrays (their rows concatenated), gathered one minibatch at a time."""

    def __init__(self, parts: Sequence[np.ndarray], row_map: Callable[[torch.Tensor, int], torch.Tensor] | None = None):
        self.parts = [as_cpu_tensor(p) for p in parts]
        tails = {tuple(p.shape[1:]) for p in self.parts}
        if len(tails) != 1:
            raise ValueError(f"parts of RowBatches must share their trailing shape, got {sorted(tails)}")
        self.starts = np.concatenate([[0], np.cumsum([p.shape[0] for p in self.parts])]).astype(np.int64)
        self.shape = (int(self.starts[-1]),) + tails.pop()
        self.row_map = row_map

    def batch(self, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The rows at positions ``rows`` as float32 on ``device``, mapped."""
        if len(self.parts) == 1:
            out = self.parts[0][rows]
        else:
            part_of = np.searchsorted(self.starts, rows.numpy(), side="right") - 1
            out = torch.empty((rows.numel(),) + self.shape[1:], dtype=self.parts[0].dtype)
            for p in np.unique(part_of):
                mask = torch.from_numpy(part_of == p)
                out[mask] = self.parts[p][rows[mask] - int(self.starts[p])].to(out.dtype)
        out = out.to(device=device, dtype=torch.float32, non_blocking=True)
        return out if self.row_map is None else self.row_map(out, 0)


def _batch(X: torch.Tensor | RowBatches, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(X, RowBatches):
        return X.batch(rows, device)
    return X[rows].to(device=device, dtype=torch.float32, non_blocking=True)


def _eval_rows(X: torch.Tensor | RowBatches, model: StackedModel, device: torch.device) -> int:
    """Rows per evaluation pass: the input batch and the members' activations stay near
    ``EVAL_ELEMENTS`` elements (a model may say how many it holds per row)."""
    per_row = math.prod(X.shape[1:])
    activations = getattr(model, "activation_elements", None)
    if activations is not None:
        per_row = max(per_row, int(activations(tuple(X.shape[1:]))))
    return max(1, EVAL_ELEMENTS.get(device.type, EVAL_ELEMENTS["cpu"]) // max(1, per_row))


@torch.no_grad()
def evaluate(model: StackedModel, X: torch.Tensor, codes: torch.Tensor, rows: np.ndarray,
             device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Per-member accuracy and mean cross-entropy on ``rows`` of ``X``."""
    correct, loss = None, None
    step = _eval_rows(X, model, device)
    for start in range(0, rows.size, step):
        idx = torch.from_numpy(rows[start:start + step])
        Z = model.logits(_batch(X, idx, device))
        y = codes[idx].to(device)
        hit = (Z.argmax(dim=2) == y).sum(dim=1, dtype=torch.float64)
        ce = torch.nn.functional.cross_entropy(Z.transpose(1, 2), y.expand(Z.shape[0], -1), reduction="none")
        part = ce.sum(dim=1, dtype=torch.float64)
        correct = hit if correct is None else correct + hit
        loss = part if loss is None else loss + part
    return (correct / rows.size).cpu().numpy(), (loss / rows.size).cpu().numpy()


def train_epoch(model: StackedModel, opt: StackedAdamW, X: torch.Tensor, codes: torch.Tensor, rows: np.ndarray,
                batch_size: int, generator: torch.Generator, device: torch.device) -> None:
    """One pass over ``rows`` in a seeded random order, one AdamW step per minibatch."""
    order = torch.from_numpy(rows)[torch.randperm(rows.size, generator=generator)]
    for start in range(0, rows.size, batch_size):
        idx = order[start:start + batch_size]
        Z = model.logits(_batch(X, idx, device))
        y = codes[idx].to(device).expand(Z.shape[0], -1)
        # sum over members of each member's mean CE: member g's gradient is its own
        loss = torch.nn.functional.cross_entropy(Z.transpose(1, 2), y, reduction="sum") / idx.numel()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _improved(acc: np.ndarray, loss: np.ndarray, best_acc: np.ndarray, best_loss: np.ndarray) -> np.ndarray:
    """Higher validation accuracy, or the same accuracy at a lower cross-entropy."""
    return (acc > best_acc) | ((acc == best_acc) & (loss < best_loss))


def train_grid(make_model: Callable[[int, torch.Generator], StackedModel], X: torch.Tensor, codes: torch.Tensor,
               train_rows: np.ndarray, val_rows: np.ndarray, lrs: np.ndarray, wds: np.ndarray,
               batch_size: int, max_epochs: int, patience: int, seed: int,
               device: torch.device) -> GridRecord:
    """Train G = len(lrs) members on ``train_rows``, scoring each on ``val_rows`` every epoch."""
    generator = torch.Generator().manual_seed(int(seed))
    model = make_model(len(lrs), generator)
    opt = StackedAdamW(model.params, torch.as_tensor(lrs, dtype=torch.float32, device=device),
                       torch.as_tensor(wds, dtype=torch.float32, device=device), model.decayed)
    G = len(lrs)
    acc_curve, loss_curve = np.full((G, max_epochs), np.nan), np.full((G, max_epochs), np.nan)
    best_acc, best_loss = np.full(G, -np.inf), np.full(G, np.inf)
    best_epoch, active = np.zeros(G, dtype=int), np.ones(G, dtype=bool)
    epoch = 0
    while epoch < max_epochs and active.any():
        train_epoch(model, opt, X, codes, train_rows, batch_size, generator, device)
        epoch += 1
        acc, loss = evaluate(model, X, codes, val_rows, device)
        acc_curve[active, epoch - 1], loss_curve[active, epoch - 1] = acc[active], loss[active]
        better = active & _improved(acc, loss, best_acc, best_loss)
        best_acc[better], best_loss[better], best_epoch[better] = acc[better], loss[better], epoch
        active &= epoch - best_epoch < patience
    return GridRecord(acc_curve[:, :epoch], loss_curve[:, :epoch], best_epoch, best_acc, best_loss,
                      ~active, epoch)


def select_member(record: GridRecord, lrs: np.ndarray, wds: np.ndarray) -> int:
    """The member with the best validation score."""
    order = np.lexsort((lrs, -wds, record.best_loss, -record.best_accuracy))
    return int(order[0])


def train_fixed(make_model: Callable[[int, torch.Generator], StackedModel], X: torch.Tensor, codes: torch.Tensor,
                rows: np.ndarray, lr: float, wd: float, batch_size: int, epochs: int, seed: int,
                device: torch.device) -> StackedModel:
    """Train one member for exactly ``epochs`` epochs on ``rows`` (the refit)."""
    # Same initial weights and seeded minibatch order as ``train_grid`` with this ``seed``.
    generator = torch.Generator().manual_seed(int(seed))
    model = make_model(1, generator)
    opt = StackedAdamW(model.params, torch.tensor([lr], dtype=torch.float32, device=device),
                       torch.tensor([wd], dtype=torch.float32, device=device), model.decayed)
    for _ in range(epochs):
        train_epoch(model, opt, X, codes, rows, batch_size, generator, device)
    return model
