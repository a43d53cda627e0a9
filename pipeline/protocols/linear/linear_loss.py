"""The logistic probe's objective and linear scores, over feature rows read in blocks.

``LinearLoss`` is the mean softmax cross-entropy of a linear model [X, 1] theta^T (for
multi-label targets the sum over classes of the sigmoid cross-entropy), with its gradient
and per-class curvature weights for the preconditioner of ``lbfgs``. Every evaluation is
one pass over the rows: per block, the logits, the loss and the gradient contribution,
with float32 products in the fast stage (float64 in the final one); per-block sums in the
block's dtype, accumulated over blocks in float64. No (n x K) array is kept, and a pass
allocates nothing per block: the block matrices live in buffers kept across passes.

The l2 transform scales each row by s_i = 1 / ||h_i||, so z_i = W (s_i h_i) + b =
s_i (W h_i) + b and the gradient is sum_i (s_i r_i) h_i^T: the scales (from row norms
computed once) multiply the (b x K) logits and residuals instead of the (b x d) rows,
which are read as they are stored.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from pipeline.protocols.blocks import FeatureRows, block_rows
from pipeline.protocols.transforms.transformers import row_scales_of

__all__ = ["LinearLoss", "gram_matrix", "linear_score_blocks", "split_row_scale"]


def _dtype(fast: bool) -> torch.dtype:
    return torch.float32 if fast else torch.float64


def split_row_scale(rows: FeatureRows, device: torch.device,
                    block: int | None = None) -> tuple[FeatureRows, torch.Tensor | None]:
    """``rows`` without a row map that only scales rows (the l2 transform), and its scales."""
    # A linear model applies such a map to its logits, (W h) s, and to the residuals of its
    # gradient, instead of reading a scaled copy of every block at every pass.
    scales_of = row_scales_of(rows.row_map)
    if scales_of is None:
        return rows, None
    raw = rows.with_map(None)
    scale = torch.empty(len(raw), dtype=torch.float64, device=device)
    for H, start in raw.blocks(device, rows=block):
        scale[start:start + H.shape[0]] = scales_of(H, start)
    return raw, scale


class LinearLoss:
    """Mean cross-entropy of the linear model [X, 1] theta^T over rows read in blocks."""
    # The l2 transform's row scale, when it is the rows' map, is applied to the logits and
    # the residuals (from row norms computed once); per-block matrices live in buffers kept
    # across passes; per-block sums are taken in the block's dtype and accumulated over the
    # blocks in float64.

    def __init__(self, rows: FeatureRows, targets: torch.Tensor, n_classes: int, device: torch.device):
        self.targets, self.n_classes, self.device = targets, n_classes, device
        self.multilabel = targets.ndim == 2
        self.block = block_rows(max(rows.n_features + 1, n_classes), device, itemsize=4)
        self.rows, scale = split_row_scale(rows, device, self.block)
        self.scales = None if scale is None else {t: scale.to(t)[:, None] for t in (torch.float32, torch.float64)}
        self._buffers: dict[torch.dtype, tuple[torch.Tensor, ...]] = {}

    def _buffers_of(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """(features, logits, scratch, gradient) buffers of ``dtype``, made once."""
        if dtype not in self._buffers:
            b, K, d = self.block, self.n_classes, self.rows.n_features
            self._buffers[dtype] = tuple(torch.empty(shape, dtype=dtype, device=self.device)
                                         for shape in ((b, d), (b, K), (b, K), (K, d)))
        return self._buffers[dtype]

    def evaluate(self, theta: torch.Tensor, fast: bool) -> tuple[float, torch.Tensor, torch.Tensor]:
        """Mean loss, its gradient (K, d + 1) and curvature weights mean p(1 - p) at theta."""
        dtype = _dtype(fast)
        W, b = theta[:, :-1].to(dtype), theta[:, -1].to(dtype)
        H_buf, Z_buf, T_buf, G_buf = self._buffers_of(dtype)
        scale = None if self.scales is None else self.scales[dtype]
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        grad_W = torch.zeros((self.n_classes, self.rows.n_features), dtype=torch.float64, device=self.device)
        grad_b = torch.zeros(self.n_classes, dtype=torch.float64, device=self.device)
        curvature = torch.zeros(self.n_classes, dtype=torch.float64, device=self.device)
        for H, start in self.rows.blocks(self.device, dtype, rows=self.block, buffer=H_buf):
            rows = H.shape[0]
            s = None if scale is None else scale[start:start + rows]
            if s is None:
                Z = torch.addmm(b, H, W.T, out=Z_buf[:rows])
            else:
                Z = torch.mm(H, W.T, out=Z_buf[:rows]).mul_(s).add_(b)
            y = self.targets[start:start + rows]
            T = T_buf[:rows]
            if self.multilabel:
                Y = y.to(dtype)
                loss += (torch.nn.functional.softplus(Z) - Y * Z).sum(dtype=torch.float64)
                P = Z.sigmoid_()
                curvature += torch.neg(P, out=T).add_(1.0).mul_(P).sum(dim=0)
                R = P.sub_(Y)
            else:
                m = Z.amax(dim=1, keepdim=True)
                z_true = Z.gather(1, y[:, None])
                E = Z.sub_(m).exp_()  # one exp serves both log-sum-exp and softmax
                total = E.sum(dim=1, keepdim=True)
                loss += (m + torch.log(total) - z_true).sum(dtype=torch.float64)
                P = E.div_(total)
                curvature += torch.neg(P, out=T).add_(1.0).mul_(P).sum(dim=0)
                R = P
                R[torch.arange(rows, device=R.device), y] -= 1.0
            grad_b += R.sum(dim=0)
            if s is not None:
                R = R.mul_(s)
            grad_W += torch.mm(R.T, H, out=G_buf)
        n = len(self.rows)
        return float(loss) / n, torch.cat([grad_W, grad_b[:, None]], dim=1) / n, curvature / n


def gram_matrix(rows: FeatureRows, device: torch.device) -> torch.Tensor:
    """G = [X, 1]^T [X, 1] / n in float64 (float32 products per block), for the preconditioner."""
    d = rows.n_features
    G = torch.zeros((d + 1, d + 1), dtype=torch.float64, device=device)
    block = block_rows(d, device, itemsize=4)
    scales_of = row_scales_of(rows.row_map)
    raw = rows if scales_of is None else rows.with_map(None)
    H_buf = torch.empty((block, d), dtype=torch.float32, device=device)
    G_buf = torch.empty((d, d), dtype=torch.float32, device=device)
    for H, start in raw.blocks(device, torch.float32, rows=block, buffer=H_buf):
        if scales_of is not None:  # the scaled rows, in the buffer
            H = torch.mul(H, scales_of(H, start).to(torch.float32)[:, None], out=H_buf[:H.shape[0]])
        G[:d, :d] += torch.mm(H.T, H, out=G_buf)
        G[:d, d] += H.sum(dim=0)  # in float32 per block, accumulated in float64
    G[d, :d] = G[:d, d]
    G[d, d] = len(rows)
    return G / len(rows)


def linear_score_blocks(rows: FeatureRows, coef: np.ndarray, intercept: np.ndarray, device: torch.device,
                        dtype: torch.dtype = torch.float64) -> Iterator[tuple[torch.Tensor, int]]:
    """Yield (logits block (b, K), start) of the linear model over ``rows``."""
    W = torch.as_tensor(coef, device=device, dtype=dtype)
    b = torch.as_tensor(intercept, device=device, dtype=dtype)
    scales_of = row_scales_of(rows.row_map)  # the l2 transform: the logits scaled, not the rows
    raw = rows if scales_of is None else rows.with_map(None)
    for H, start in raw.blocks(device, dtype, rows=block_rows(max(rows.n_features, W.shape[0]), device)):
        if scales_of is None:
            yield torch.addmm(b, H, W.T), start
        else:
            yield torch.mm(H, W.T).mul_(scales_of(H, start).to(dtype)[:, None]).add_(b), start
