"""Attentive probe over token features (n, T, d): a learned query pools the tokens."""

from __future__ import annotations

import math
from itertools import product
from typing import Any

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.inputs.features import as_cpu_tensor, check_tokens
from pipeline.protocols.inputs.parameters import check_grid
from pipeline.protocols.nets.grid_probe import GridProbe

__all__ = ["AttentiveProbe", "DEFAULT_ATTENTIVE_LRS", "DEFAULT_ATTENTIVE_WEIGHT_DECAYS", "attentive_logits"]

#: Learning rates and weight decays tried (every pair: 9 grid points).
DEFAULT_ATTENTIVE_LRS: tuple[float, ...] = (1e-4, 1e-3, 1e-2)
DEFAULT_ATTENTIVE_WEIGHT_DECAYS: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default


def attentive_logits(p: dict[str, torch.Tensor], xb: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Class scores (G, B, K) of G stacked attentive probes on tokens ``xb`` (B, T, d)."""
    G, d = p["query"].shape
    B, T, _ = xb.shape
    H, dh = num_heads, d // num_heads
    q = (torch.einsum("gd,gde->ge", p["query"], p["Wq"]) + p["bq"]).view(G, H, dh)
    u = torch.einsum("gdhe,ghe->ghd", p["Wk"].view(G, d, H, dh), q) / math.sqrt(dh)  # (G, H, d)
    scores = torch.matmul(xb, u.reshape(G * H, d).T).view(B, T, G, H).permute(2, 0, 3, 1)  # (G, B, H, T)
    pooled = torch.matmul(torch.softmax(scores, dim=-1), xb.unsqueeze(0))  # (G, B, H, d)
    heads = torch.einsum("gbhd,gdhe->gbhe", pooled, p["Wv"].view(G, d, H, dh)) + p["bv"].view(G, 1, H, dh)
    out = torch.baddbmm(p["bo"].unsqueeze(1), heads.reshape(G, B, d), p["Wo"])
    normed = torch.nn.functional.layer_norm(out, (d,), eps=LAYER_NORM_EPS)
    normed = normed * p["ln_w"].unsqueeze(1) + p["ln_b"].unsqueeze(1)
    return torch.baddbmm(p["bc"].unsqueeze(1), normed, p["Wc"])


class StackedAttentive:
    """G attentive probes with identical initial weights, initialised as torch's modules
    are: query N(0, 0.02^2); Wq, Wk, Wv Xavier-uniform over the stacked (3d, d) in-projection;
    Wo, Wc and bc uniform in +-1/sqrt(d); other biases zero; layer norm gain one."""

    decayed = frozenset({"query", "Wq", "Wk", "Wv", "Wo", "Wc"})

    def __init__(self, G: int, d: int, K: int, num_heads: int, generator: torch.Generator | None,
                 device: torch.device, params: dict[str, np.ndarray] | None = None):
        self.num_heads = num_heads
        if params is not None:  # a fitted single probe, for prediction
            self.params = {k: torch.from_numpy(v).unsqueeze(0).to(device) for k, v in params.items()}
            return

        def uniform(shape: tuple[int, ...], bound: float) -> torch.Tensor:
            return (torch.rand(shape, generator=generator) * 2 - 1) * bound

        one = {"query": torch.randn((d,), generator=generator) * 0.02}
        in_bound = math.sqrt(6.0 / (d + 3 * d))
        for name in ("Wq", "Wk", "Wv"):
            one[name] = uniform((d, d), in_bound)
        one["Wo"] = uniform((d, d), 1.0 / math.sqrt(d))
        one["Wc"], one["bc"] = uniform((d, K), 1.0 / math.sqrt(d)), uniform((K,), 1.0 / math.sqrt(d))
        for name in ("bq", "bv", "bo", "ln_b"):
            one[name] = torch.zeros(d)
        one["ln_w"] = torch.ones(d)
        self.params = {k: v.expand(G, *v.shape).clone().to(device).requires_grad_(True) for k, v in one.items()}

    def logits(self, xb: torch.Tensor) -> torch.Tensor:
        """Class scores of every member."""
        return attentive_logits(self.params, xb, self.num_heads)

    def activation_elements(self, row_shape: tuple[int, ...]) -> int:
        """Elements every member holds per input row: scores and pooled tokens per head,
        the attended and normalised vectors."""
        G, d = self.params["query"].shape
        T = row_shape[0]
        return G * (self.num_heads * (T + 2 * d) + 4 * d)


class AttentiveProbe(GridProbe):
    """Cross-attention pooling of token features with a linear classifier on top.

    Parameters
    ----------
    num_heads : int
        Attention heads; must divide the feature width d.
    learning_rates, weight_decays : sequence of float
        AdamW grid (every pair is tried); single values fix them.
    batch_size : int
        Minibatch rows (each row is T tokens).
    max_epochs : int
        Epoch budget of every fit.
    patience : int
        Epochs without a better validation score after which a grid point stops.
    val_fraction : float
        Share of the train rows drawn (stratified, seeded) for validation when ``fit`` gets
        no ``val_mask``.
    random_state : int
        Seeds the validation draw, the initial weights and the minibatch order.
    device : str or torch.device
        ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"`` or ``"cuda:<index>"``.

    Attributes
    ----------
    classes_ : ndarray of the sorted labels.
    params_ : dict of float32 arrays of the refitted probe (shapes as ``attentive_logits``
        without the member axis).
    learning_rate_, weight_decay_ : the selected pair.
    n_epochs_ : epochs of the selected grid point's best validation score, and of the refit.
    grid_ : (G, 2) array of the (learning rate, weight decay) pairs tried.
    val_accuracy_, val_loss_, best_epochs_ : per grid point.
    val_curves_ : (G, epochs run) validation accuracy per epoch, NaN after a point stopped.
    stopped_early_ : the selected point stopped by patience (False: it ran to max_epochs).
    solver_ : ``"adamw"``. device_ : the device trained on.
    n_features_in_ : d. n_tokens_in_ : T seen in fit (prediction accepts any T).
    """

    def __init__(self, num_heads: int = 8, learning_rates: Any = DEFAULT_ATTENTIVE_LRS,
                 weight_decays: Any = DEFAULT_ATTENTIVE_WEIGHT_DECAYS, batch_size: int = 128, max_epochs: int = 50,
                 patience: int = 5, val_fraction: float = 0.2, random_state: int = 0,
                 device: str | torch.device = "auto"):
        self.num_heads = num_heads
        self.learning_rates = learning_rates
        self.weight_decays = weight_decays
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.val_fraction = val_fraction
        self.random_state = random_state
        self.device = device

    rows_needed = "token features (n, T, d)"
    row_ndim = 3

    def _grid(self) -> tuple[np.ndarray, np.ndarray, torch.device]:
        self._check_training("num_heads")
        lrs = check_grid(self.learning_rates, "learning_rates", low_open=True)
        wds = check_grid(self.weight_decays, "weight_decays", low_open=False)
        grid = np.array(list(product(lrs, wds)), dtype=np.float64)
        return grid[:, 0], grid[:, 1], resolve_device(self.device)

    def _checked(self, X: Any) -> np.ndarray:
        return check_tokens(X)

    def _stacked(self, shape: tuple[int, ...], K: int, device: torch.device) -> Any:
        _, T, d = shape
        if d % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} does not divide the feature width d={d}; choose a "
                              f"divisor of {d}")
        self.n_features_in_, self.n_tokens_in_ = d, T

        def make(G: int, generator: torch.Generator) -> StackedAttentive:
            return StackedAttentive(G, d, K, self.num_heads, generator, device)

        return make

    def _keep(self, model: StackedAttentive, best: int, lrs: np.ndarray, wds: np.ndarray) -> None:
        self.grid_ = np.column_stack([lrs, wds])
        self.learning_rate_, self.weight_decay_ = float(lrs[best]), float(wds[best])
        self.params_ = {k: v.detach()[0].cpu().numpy() for k, v in model.params.items()}

    def _logits(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = check_tokens(X)
        if X.shape[2] != self.n_features_in_:
            raise DataValidationError(f"X has {X.shape[2]} features per token, but AttentiveProbe is expecting "
                                      f"{self.n_features_in_} features as input")
        device = resolve_device(self.device)
        model = StackedAttentive(1, self.n_features_in_, self.classes_.size, self.num_heads, None, device,
                                  params=self.params_)
        Xt = as_cpu_tensor(X)
        rows = max(1, 2**22 // (X.shape[1] * X.shape[2]))
        with torch.no_grad():
            parts = [model.logits(Xt[s:s + rows].to(device=device, dtype=torch.float32))[0].cpu().numpy()
                     for s in range(0, X.shape[0], rows)]
        return np.concatenate(parts)
