"""MLP probe: one hidden ReLU layer instead of the linear model (Kolesnikov et al. 2019, 4.3)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from pipeline.protocols.blocks import FeatureRows, block_rows
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.inputs.features import validate_features
from pipeline.protocols.inputs.parameters import check_grid, check_number
from pipeline.protocols.nets.grid_probe import GridProbe

__all__ = ["DEFAULT_MLP_WEIGHT_DECAYS", "MLPProbe"]

#: Weight decay grid: none, then four decades (AdamW's decoupled decay per step is lr * wd).
DEFAULT_MLP_WEIGHT_DECAYS: tuple[float, ...] = (0.0, 1e-4, 1e-3, 1e-2, 1e-1)


class StackedMLP:
    """G one-hidden-layer MLPs, parameters stacked along axis 0, identical initial weights
    (torch.nn.Linear's default init: uniform in +-1/sqrt(fan_in) for weights and biases)."""

    decayed = frozenset({"W1", "W2"})

    def __init__(self, G: int, d: int, hidden: int, K: int, generator: torch.Generator, device: torch.device):
        def uniform(shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
            bound = 1.0 / math.sqrt(fan_in)
            one = (torch.rand(shape, generator=generator) * 2 - 1) * bound
            return one.expand(G, *shape).clone().to(device).requires_grad_(True)

        self.params = {"W1": uniform((d, hidden), d), "b1": uniform((1, hidden), d),
                       "W2": uniform((hidden, K), hidden), "b2": uniform((1, K), hidden)}

    def activation_elements(self, row_shape: tuple[int, ...]) -> int:
        """Elements every member holds per input row: hidden units and logits."""
        G, _, hidden = self.params["W1"].shape
        return G * (hidden + self.params["W2"].shape[2])

    def logits(self, xb: torch.Tensor) -> torch.Tensor:
        """Class scores of every member."""
        p = self.params
        hidden = torch.relu(torch.matmul(xb, p["W1"]) + p["b1"])  # (G, B, hidden)
        return torch.baddbmm(p["b2"], hidden, p["W2"])


class MLPProbe(GridProbe):
    """One-hidden-layer ReLU probe, weight decay and epochs selected on validation.

    Parameters
    ----------
    hidden_units : int
        Width of the hidden layer (1,000 as in Kolesnikov et al. 2019).
    weight_decays : sequence of float
        AdamW decoupled weight decay values tried (>= 0); a single value fixes it. The
        validation split is still used, for early stopping.
    learning_rate : float
        AdamW learning rate (constant).
    batch_size : int
        Minibatch rows.
    max_epochs : int
        Epoch budget of every fit.
    patience : int
        Epochs without a better validation score after which a grid member stops.
    val_fraction : float
        Share of the train rows drawn (stratified, seeded) for validation when ``fit`` gets
        no ``val_mask``.
    random_state : int
        Seeds the validation draw, the initial weights and the minibatch order.
    device : str or torch.device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"`` or ``"cuda:<index>"``.

    Attributes
    ----------
    classes_ : ndarray of the sorted labels (any sortable hashable type).
    coefs_ : [W1 (d, hidden_units), W2 (hidden_units, K)], float32.
    intercepts_ : [b1 (hidden_units,), b2 (K,)], float32.
    weight_decay_ : selected weight decay.
    n_epochs_ : epochs of the selected grid member's best validation score, and of the refit.
    weight_decays_ : the grid, ascending.
    val_accuracy_, val_loss_ : best validation accuracy / cross-entropy per grid value.
    best_epochs_ : epoch (from 1) of each grid value's best validation score.
    val_curves_ : (grid size, epochs run) validation accuracy per epoch, NaN after a
        member stopped.
    stopped_early_ : the selected member stopped because its validation score had not
        improved for ``patience`` epochs (False: it ran to ``max_epochs``).
    solver_ : ``"adamw"``.
    device_ : the device trained on.
    n_features_in_ : feature width.

    A ConvergenceWarning is emitted when the selected member's best epoch is the last of
    ``max_epochs`` (validation was still improving when the budget ran out).
    """

    def __init__(self, hidden_units: int = 1000, weight_decays: Any = DEFAULT_MLP_WEIGHT_DECAYS,
                 learning_rate: float = 1e-3, batch_size: int = 256, max_epochs: int = 100, patience: int = 10,
                 val_fraction: float = 0.2, random_state: int = 0, device: str | torch.device = "auto"):
        self.hidden_units = hidden_units
        self.weight_decays = weight_decays
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.val_fraction = val_fraction
        self.random_state = random_state
        self.device = device

    def _grid(self) -> tuple[np.ndarray, np.ndarray, torch.device]:
        self._check_training("hidden_units")
        check_number(self.learning_rate, "learning_rate", 0, low_open=True)
        wds = check_grid(self.weight_decays, "weight_decays", low_open=False)
        return np.full(wds.size, float(self.learning_rate)), wds, resolve_device(self.device)

    def _checked(self, X: Any) -> np.ndarray:
        return validate_features(self, X, reset=True)

    def _stacked(self, shape: tuple[int, ...], K: int, device: torch.device) -> Any:
        self.n_features_in_ = d = int(shape[1])

        def make(G: int, generator: torch.Generator) -> StackedMLP:
            return StackedMLP(G, d, self.hidden_units, K, generator, device)

        return make

    def _keep(self, model: StackedMLP, best: int, lrs: np.ndarray, wds: np.ndarray) -> None:
        self.weight_decays_, self.weight_decay_ = wds, float(wds[best])
        p = {k: v.detach()[0].cpu().numpy() for k, v in model.params.items()}
        self.coefs_ = [p["W1"], p["W2"]]
        self.intercepts_ = [p["b1"][0], p["b2"][0]]

    def predict_rows(self, rows: FeatureRows) -> np.ndarray:
        """``predict`` over ``FeatureRows`` (and their row map), block by block on the fitted device.

        Parameters
        ----------
        rows : FeatureRows

        Returns
        -------
        ndarray of shape (n,)
            Predicted labels.
        """
        check_is_fitted(self)
        device = torch.device(self.device_)
        W1, W2 = (torch.from_numpy(w).to(device) for w in self.coefs_)
        b1, b2 = (torch.from_numpy(b).to(device) for b in self.intercepts_)
        out = np.empty(len(rows), dtype=np.intp)
        with torch.no_grad():
            for block, start in rows.blocks(device=device, dtype=torch.float32,
                                            rows=block_rows(max(W1.shape[1], W1.shape[0]), device, itemsize=4)):
                logits = torch.relu(block @ W1 + b1) @ W2 + b2
                out[start:start + block.shape[0]] = torch.argmax(logits, dim=1).cpu().numpy()
        return self.classes_[out]

    def _logits(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        (W1, W2), (b1, b2) = self.coefs_, self.intercepts_
        hidden = np.maximum(X.astype(np.float32, copy=False) @ W1 + b1, 0.0)
        return hidden @ W2 + b2
