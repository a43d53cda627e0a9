"""The logistic probe's objective and linear scores, over feature rows read in blocks.

``LinearLoss`` is the mean softmax cross-entropy of a linear model [X, 1] theta^T (for
multi-label targets the sum over classes of the sigmoid cross-entropy), with its gradient
and per-class curvature weights for the preconditioner of ``lbfgs``. Every evaluation is
one pass over the rows: per block, the logits, the loss and the gradient contribution,
with float32 products in the fast stage (float64 in the final one) and float64 sums. No
(n x K) array is kept.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from pipeline.protocols.blocks import FeatureRows, block_rows

__all__ = ["LinearLoss", "gram_matrix", "linear_score_blocks"]


def _dtype(fast: bool) -> torch.dtype:
    return torch.float32 if fast else torch.float64


class LinearLoss:
    """Mean cross-entropy of the linear model [X, 1] theta^T over rows read in blocks.

    Parameters
    ----------
    rows : FeatureRows
        Features (already on ``device`` when read many times).
    targets : torch.Tensor
        (n,) class indices, or (n, K) 0/1 indicators for multi-label.
    n_classes : int
        K.
    device : torch.device
        Compute device.
    """

    def __init__(self, rows: FeatureRows, targets: torch.Tensor, n_classes: int, device: torch.device):
        self.rows, self.targets, self.n_classes, self.device = rows, targets, n_classes, device
        self.multilabel = targets.ndim == 2
        self.block = block_rows(max(rows.n_features + 1, n_classes), device, itemsize=4)

    def evaluate(self, theta: torch.Tensor, fast: bool) -> tuple[float, torch.Tensor, torch.Tensor]:
        """Mean loss, its gradient (K, d + 1) and curvature weights mean p(1 - p) at theta.

        Parameters
        ----------
        theta : torch.Tensor
            (K, d + 1) float64.
        fast : bool
            float32 products (float64 sums) instead of float64 ones.

        Returns
        -------
        tuple of (float, torch.Tensor, torch.Tensor)
        """
        dtype = _dtype(fast)
        W, b = theta[:, :-1].to(dtype), theta[:, -1].to(dtype)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        grad = torch.zeros_like(theta)
        curvature = torch.zeros(self.n_classes, dtype=torch.float64, device=self.device)
        for H, start in self.rows.blocks(self.device, dtype, rows=self.block):
            Z = torch.addmm(b, H, W.T)
            y = self.targets[start:start + H.shape[0]]
            if self.multilabel:
                Y = y.to(dtype)
                loss += (torch.nn.functional.softplus(Z) - Y * Z).sum(dtype=torch.float64)
                P = torch.sigmoid(Z)
                curvature += (P * (1.0 - P)).sum(dim=0, dtype=torch.float64)
                R = P.sub_(Y)
            else:
                m = Z.max(dim=1, keepdim=True).values
                z_true = Z.gather(1, y[:, None])
                E = Z.sub_(m).exp_()  # one exp serves both log-sum-exp and softmax
                total = E.sum(dim=1, keepdim=True)
                loss += (m + torch.log(total) - z_true).sum(dtype=torch.float64)
                P = E.div_(total)
                curvature += (P * (1.0 - P)).sum(dim=0, dtype=torch.float64)
                R = P
                R[torch.arange(R.shape[0], device=R.device), y] -= 1.0
            grad[:, :-1] += (R.T @ H).to(torch.float64)
            grad[:, -1] += R.sum(dim=0, dtype=torch.float64)
        n = len(self.rows)
        return float(loss) / n, grad / n, curvature / n


def gram_matrix(rows: FeatureRows, device: torch.device) -> torch.Tensor:
    """G = [X, 1]^T [X, 1] / n in float64 (float32 products per block), for the preconditioner.

    Parameters
    ----------
    rows : FeatureRows
        The features.
    device : torch.device
        Compute device.

    Returns
    -------
    torch.Tensor
        (d + 1, d + 1) float64.
    """
    d = rows.n_features
    G = torch.zeros((d + 1, d + 1), dtype=torch.float64, device=device)
    for H, _ in rows.blocks(device, torch.float32):
        G[:d, :d] += (H.T @ H).to(torch.float64)
        G[:d, d] += H.sum(dim=0, dtype=torch.float64)
    G[d, :d] = G[:d, d]
    G[d, d] = len(rows)
    return G / len(rows)


def linear_score_blocks(rows: FeatureRows, coef: np.ndarray, intercept: np.ndarray, device: torch.device,
                 dtype: torch.dtype = torch.float64) -> Iterator[tuple[torch.Tensor, int]]:
    """Yield (logits block (b, K), start) of the linear model over ``rows``.

    Parameters
    ----------
    rows : FeatureRows
        The features.
    coef, intercept : numpy.ndarray
        (K, d) and (K,) parameters.
    device : torch.device
        Compute device.
    dtype : torch.dtype
        Compute dtype.

    Yields
    ------
    tuple of (torch.Tensor, int)
    """
    W = torch.as_tensor(coef, device=device, dtype=dtype)
    b = torch.as_tensor(intercept, device=device, dtype=dtype)
    for H, start in rows.blocks(device, dtype, rows=block_rows(max(rows.n_features, W.shape[0]), device)):
        yield torch.addmm(b, H, W.T), start
