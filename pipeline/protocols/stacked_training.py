"""Seeded minibatch training of small torch probes, a whole hyperparameter grid at once.

The MLP and attentive probes pick their learning rate and weight decay on a validation
split, with early stopping. Instead of one fit per grid point, the G grid points are G
copies of the model stacked along a leading axis of every parameter: one forward pass
(batched matrix products) serves them all, on the same minibatches. The loss is the sum of
the members' mean cross-entropies, so each member receives exactly its own gradient, and
the optimiser (``StackedAdamW``, torch's AdamW update with a learning rate and weight decay
per member) is elementwise, so every member follows the trajectory it would follow alone.
Every member starts from the same initial weights: the grid compares hyperparameters, not
initialisations.

Determinism: initial weights and the minibatch order come from a ``torch.Generator``
seeded by the caller (the global torch RNG is neither read nor changed), so two fits with
the same seed on the CPU give bitwise identical parameters.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Protocol

import numpy as np
import torch
from sklearn.exceptions import DataConversionWarning
from sklearn.model_selection import StratifiedShuffleSplit
from sklearn.utils.multiclass import type_of_target

from pipeline.errors import ConfigError, DataValidationError

__all__ = [
    "GridRecord", "SoftmaxOutputMixin", "StackedAdamW", "StackedModel", "as_cpu_tensor", "check_fraction",
    "check_grid", "check_positive_int", "check_seed", "encode_labels", "evaluate", "resolve_device",
    "select_member", "train_fixed", "train_grid", "validation_split",
]

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:<index>")
# Rows per evaluation pass, scaled down for wide inputs (tokens) to bound memory.
_EVAL_ELEMENTS = 2**24


def resolve_device(device: Any) -> torch.device:
    """The torch device named by ``device``.

    Parameters
    ----------
    device : str or torch.device
        ``"auto"`` (CUDA when available, else the CPU), ``"cpu"``, ``"cuda"`` or
        ``"cuda:<index>"``, or a ``torch.device``.

    Returns
    -------
    torch.device
        The device; a CUDA device only when CUDA is available and the index exists.

    Raises
    ------
    ConfigError
        For any other value, or CUDA asked on a machine without it.
    """
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device={device!r} is not a device; valid choices: {', '.join(DEVICE_CHOICES)}")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device={device!r} is not a device; valid choices: {', '.join(DEVICE_CHOICES)}") from None
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: only {', '.join(DEVICE_CHOICES)} are supported")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} asked for CUDA, but torch.cuda.is_available() is False; "
                              "use device='cpu' or 'auto'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return resolved


def encode_labels(y: Any, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Class labels of any sortable hashable type as (classes, integer codes).

    Parameters
    ----------
    y : array-like of shape (n_samples,)
        Class labels: integers, strings, booleans...; a column vector is flattened with a
        ``DataConversionWarning`` (sklearn's convention).
    n_samples : int
        Number of feature rows the labels must match.

    Returns
    -------
    classes : ndarray
        The sorted distinct labels (at least two).
    codes : ndarray of int64
        Index of each sample's label in ``classes``.

    Raises
    ------
    DataValidationError
        Continuous or multi-output targets, a length mismatch, labels that cannot be
        sorted together, or fewer than two classes.
    """
    if y is None:
        raise DataValidationError("This estimator requires y to be passed, but the target y is None")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the shape of y "
                      "to (n_samples,), for example using ravel().", DataConversionWarning, stacklevel=3)
        y = y.ravel()
    if y.ndim != 1:
        raise DataValidationError(f"y must be 1-D class labels of shape (n_samples,), got shape {y.shape}")
    if y.shape[0] != n_samples:
        raise DataValidationError(f"y has {y.shape[0]} labels, but X has {n_samples} samples; they must match "
                                  "one to one")
    try:
        kind = type_of_target(y, input_name="y")
        classes, codes = np.unique(y, return_inverse=True)
    except (TypeError, ValueError) as exc:
        raise DataValidationError(f"Unusable class labels y: {exc}") from None
    if kind not in ("binary", "multiclass"):
        raise DataValidationError(f"Unknown label type: y is {kind!r}; a classifier needs discrete class labels")
    if classes.size < 2:
        raise DataValidationError(f"y has {classes.size} class(es) ({classes[:5].tolist()}), but at least 2 "
                                  "classes are required to fit a classifier")
    return classes, codes.astype(np.int64).ravel()


def validation_split(codes: np.ndarray, val_fraction: float, random_state: Any,
                     val_mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, validation): the given ``val_mask`` or a seeded stratified draw.

    Parameters
    ----------
    codes : ndarray of int
        Class code per row.
    val_fraction : float
        Share of the rows drawn for validation when ``val_mask`` is None.
    random_state : int or None
        Seed of the stratified draw.
    val_mask : array-like of bool, optional
        Rows of a dataset-defined validation split.

    Returns
    -------
    train, val : ndarray of int
        Sorted row indices of the two parts.
    """
    if val_mask is not None:
        mask = np.asarray(val_mask)
        if mask.dtype != bool or mask.shape != codes.shape:
            raise DataValidationError(f"val_mask must be a boolean array of shape {codes.shape}, got "
                                      f"{mask.dtype} {mask.shape}")
        if mask.all() or not mask.any():
            raise DataValidationError(f"val_mask marks {int(mask.sum())} of {codes.size} rows; both the train "
                                      "and the validation part need rows")
        return np.flatnonzero(~mask), np.flatnonzero(mask)
    splitter = StratifiedShuffleSplit(1, test_size=val_fraction, random_state=random_state)
    try:
        train, val = next(splitter.split(np.zeros((codes.size, 1)), codes))
    except ValueError as exc:
        counts = np.bincount(codes)
        raise DataValidationError(
            f"Cannot draw a stratified {val_fraction:g} validation split from {codes.size} samples of "
            f"{counts.size} classes (smallest class: {counts.min()} samples): {exc}. Pass a dataset-defined "
            "val_mask or use more samples per class."
        ) from None
    return np.sort(train), np.sort(val)


def check_grid(values: Any, name: str, low_open: bool) -> np.ndarray:
    """A non-empty 1-D grid of finite values, each > 0 (``low_open``) or >= 0."""
    try:
        grid = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        grid = np.array([np.nan])
    ok = grid.size > 0 and np.all(np.isfinite(grid)) and np.all(grid > 0 if low_open else grid >= 0)
    if not ok:
        rule = "> 0" if low_open else ">= 0"
        raise ConfigError(f"{name} must be a non-empty list of finite numbers {rule}, got {values!r}")
    return np.unique(grid)


def check_positive_int(value: Any, name: str) -> int:
    """``value`` as an int >= 1, or a ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_fraction(value: Any, name: str) -> float:
    """``value`` as a float strictly between 0 and 1, or a ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < value < 1:
        raise ConfigError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def check_seed(value: Any) -> int:
    """``value`` as a seed (an integer in [0, 2**32)), or a ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= value < 2**32:
        raise ConfigError(f"random_state must be an integer in [0, 2**32), got {value!r}")
    return int(value)


class SoftmaxOutputMixin:
    """decision_function / predict_proba / predict of a classifier from its ``_logits(X)`` (n, K)."""

    def decision_function(self, X: Any) -> np.ndarray:
        """Logits (n, K); z_1 - z_0 (n,) for two classes."""
        Z = self._logits(X)
        return Z[:, 1] - Z[:, 0] if self.classes_.size == 2 else Z

    def predict_proba(self, X: Any) -> np.ndarray:
        """Softmax of the logits, (n, K)."""
        Z = self._logits(X).astype(np.float64)
        Z -= Z.max(axis=1, keepdims=True)
        P = np.exp(Z)
        return P / P.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class label (the first on exact ties)."""
        Z = self._logits(X)  # first: it raises NotFittedError before classes_ is read
        return self.classes_[np.argmax(Z, axis=1)]


class StackedModel(Protocol):
    """G models of one architecture with their parameters stacked along axis 0."""

    params: dict[str, torch.Tensor]  # every tensor has G rows along axis 0
    decayed: frozenset[str]  # names of the parameters weight decay applies to

    def logits(self, xb: torch.Tensor) -> torch.Tensor:
        """(G, B, K) class scores of a float32 batch ``xb`` of B rows."""
        ...


class StackedAdamW:
    """AdamW (Loshchilov & Hutter 2019) on stacked parameters, one (lr, wd) per member.

    The update is torch.optim.AdamW's, written out so the learning rate and weight decay
    can differ along the member axis: p <- p (1 - lr wd) (decayed parameters only), then
    p <- p - lr m_hat / (sqrt(v_hat) + eps) with bias-corrected moments.

    Parameters
    ----------
    params : mapping of str to Tensor
        Leaf tensors requiring grad, member axis first.
    lrs, wds : Tensor of shape (G,)
        Learning rate and weight decay of each member.
    decayed : frozenset of str
        Parameters that weight decay applies to (matrices; not biases or norm gains).
    betas, eps : Adam's constants (torch's defaults).
    """

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
            denom = (v.sqrt() / bias2_sqrt).add_(self.eps)
            p.sub_((lr / bias1) * m / denom)

    def zero_grad(self) -> None:
        """Drop every parameter's gradient."""
        for p in self.params.values():
            p.grad = None


@dataclass(frozen=True)
class GridRecord:
    """What the validated grid run saw, per member (grid point) and epoch.

    ``val_accuracy`` / ``val_loss`` are (G, epochs_run) with NaN after a member stopped;
    ``best_epoch`` counts epochs from 1; ``stopped_early`` marks members whose validation
    score had not improved for ``patience`` epochs before ``max_epochs``.
    """

    val_accuracy: np.ndarray
    val_loss: np.ndarray
    best_epoch: np.ndarray
    best_accuracy: np.ndarray
    best_loss: np.ndarray
    stopped_early: np.ndarray
    epochs_run: int


def _batch(X: torch.Tensor, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    return X[rows].to(device=device, dtype=torch.float32, non_blocking=True)


def _eval_rows(X: torch.Tensor) -> int:
    return max(1, _EVAL_ELEMENTS // max(1, math.prod(X.shape[1:])))


@torch.no_grad()
def evaluate(model: StackedModel, X: torch.Tensor, codes: torch.Tensor, rows: np.ndarray,
             device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Per-member accuracy and mean cross-entropy on ``rows`` of ``X``.

    Returns
    -------
    accuracy, loss : ndarray of shape (G,)
    """
    correct, loss = None, None
    step = _eval_rows(X)
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


def _epoch(model: StackedModel, opt: StackedAdamW, X: torch.Tensor, codes: torch.Tensor, rows: np.ndarray,
           batch_size: int, generator: torch.Generator, device: torch.device) -> None:
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
    """Train G = len(lrs) members on ``train_rows``, scoring each on ``val_rows`` every epoch.

    Parameters
    ----------
    make_model : callable
        ``make_model(G, generator)`` builds G stacked members with identical initial
        weights drawn from ``generator``.
    X : Tensor
        All features (CPU), (n, d) or (n, T, d); batches are moved to ``device``.
    codes : Tensor of int64
        Class code per row of ``X``.
    train_rows, val_rows : ndarray of int
        Rows to train on and to score.
    lrs, wds : ndarray of shape (G,)
        Learning rate and weight decay per member.
    batch_size, max_epochs, patience : int
        Minibatch size; epoch budget; epochs without improvement after which a member stops.
    seed : int
        Seeds the initial weights and the minibatch order.
    device : torch.device
        Where the members are trained.

    Returns
    -------
    GridRecord
        Validation curves, each member's best epoch and whether it stopped early. The loop
        ends when every member has stopped or at ``max_epochs``; members keep training
        after they stop (one batched pass serves all), but nothing after their stop counts.
    """
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
        _epoch(model, opt, X, codes, train_rows, batch_size, generator, device)
        epoch += 1
        acc, loss = evaluate(model, X, codes, val_rows, device)
        acc_curve[active, epoch - 1], loss_curve[active, epoch - 1] = acc[active], loss[active]
        better = active & _improved(acc, loss, best_acc, best_loss)
        best_acc[better], best_loss[better], best_epoch[better] = acc[better], loss[better], epoch
        active &= epoch - best_epoch < patience
    return GridRecord(acc_curve[:, :epoch], loss_curve[:, :epoch], best_epoch, best_acc, best_loss,
                      ~active, epoch)


def select_member(record: GridRecord, lrs: np.ndarray, wds: np.ndarray) -> int:
    """The member with the best validation score (accuracy, then lower cross-entropy);
    exact ties go to the larger weight decay, then the smaller learning rate."""
    order = np.lexsort((lrs, -wds, record.best_loss, -record.best_accuracy))
    return int(order[0])


def train_fixed(make_model: Callable[[int, torch.Generator], StackedModel], X: torch.Tensor, codes: torch.Tensor,
                rows: np.ndarray, lr: float, wd: float, batch_size: int, epochs: int, seed: int,
                device: torch.device) -> StackedModel:
    """Train one member for exactly ``epochs`` epochs on ``rows`` (the refit).

    Same initial weights and seeded minibatch order as ``train_grid`` with this ``seed``.

    Returns
    -------
    StackedModel
        The trained model, G = 1.
    """
    generator = torch.Generator().manual_seed(int(seed))
    model = make_model(1, generator)
    opt = StackedAdamW(model.params, torch.tensor([lr], dtype=torch.float32, device=device),
                       torch.tensor([wd], dtype=torch.float32, device=device), model.decayed)
    for _ in range(epochs):
        _epoch(model, opt, X, codes, rows, batch_size, generator, device)
    return model


def as_cpu_tensor(X: np.ndarray) -> torch.Tensor:
    """A CPU tensor over ``X`` without a copy where numpy allows (float16 stays float16;
    batches are cast to float32 on their way to the device)."""
    with warnings.catch_warnings():  # a read-only array (memmap) is only ever read here
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(X))
