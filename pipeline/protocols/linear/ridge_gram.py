"""The ridge probe for many rows (n >= 2d): d x d Gram matrix, row blocks, torch float64.

Memory does not grow with n beyond the features themselves: three passes over the rows
(a fourth when the features are badly conditioned) build d x d and d x K summaries and
accumulate the leave-one-out residuals block by block; no (n x d) or (n x K) array is
ever formed. The arithmetic is the one of ``ridge`` (see its docstring), rewritten for
blocks, so the results are the same to round-off:

1. column means mu of the features, and t = mean target (the unpenalised bias);
2. G = Hc^T Hc and C = Hc^T Tc with Hc = H - 1 mu^T, Tc = T - 1 t^T (for class-index
   targets, C comes from per-class sums of the rows: no (n x K) target matrix);
3. the eigendecomposition G = V diag(s^2) V^T gives the thin SVD of Hc without U:
   Q = U^T Tc = diag(1/s) V^T C. It squares the condition number, so it is used only
   when kappa(Hc)^2 <= 1e6 (every s^2 then has a relative error near 1e-10); otherwise a
   streaming Householder QR of the augmented blocks [Hc, Tc] gives R (d x d) and
   Q_R^T Tc exactly as a full QR would, and the SVD of R gives s, V and Q = U_R^T Q_R^T Tc;
4. per block, U_b = Hc_b V / s, and for every lambda of the grid the leave-one-out
   residuals e_(i) = (t_i - (S T)_i) / (1 - S_ii) written as in ``ridge`` so that nothing
   cancels; PRESS(lambda) sums e_(i)^2 over the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.protocols.blocks import FeatureRows, block_rows

__all__ = ["GRAM_MAX_CONDITION", "RidgeFit", "gram_ridge", "ridge_targets", "select_alpha"]

#: Largest kappa(Hc)^2 for which the Gram eigendecomposition is trusted (see the docstring).
GRAM_MAX_CONDITION = 1e6
_F64 = torch.float64


@dataclass(frozen=True)
class RidgeFit:
    """A fitted ridge probe: slopes, bias, the selected lambda and the PRESS of each one."""

    coef: np.ndarray
    intercept: np.ndarray
    alpha: float
    press: np.ndarray
    loo_decision: np.ndarray | None


def ridge_targets(labels: torch.Tensor, n_classes: int, dtype: torch.dtype = _F64) -> torch.Tensor:
    """Targets in {-1, +1}: one-vs-rest from class indices (n,), or 2Y - 1 from (n, K) 0/1."""
    if labels.ndim == 2:
        return labels.to(dtype) * 2.0 - 1.0
    T = torch.full((labels.shape[0], n_classes), -1.0, dtype=dtype, device=labels.device)
    T[torch.arange(labels.shape[0], device=labels.device), labels] = 1.0
    return T


def select_alpha(press: np.ndarray, alphas: np.ndarray) -> float:
    """The alpha of least PRESS; ties go to the larger alpha (the stronger penalty)."""
    tied = np.flatnonzero(press == press.min())
    return float(alphas[tied[np.argmax(alphas[tied])]])


class _Pass:
    """The centred feature and target blocks of one pass over the rows."""

    def __init__(self, rows: FeatureRows, labels: torch.Tensor, n_classes: int, mu: torch.Tensor,
                 t_mean: torch.Tensor, device: torch.device):
        self.rows, self.labels, self.K, self.mu, self.t_mean, self.device = rows, labels, n_classes, mu, t_mean, device
        self.block = block_rows(max(rows.n_features, n_classes), device)

    def __iter__(self):
        for H, start in self.rows.blocks(self.device, _F64, rows=self.block):
            y = self.labels[start:start + H.shape[0]]
            yield H - self.mu, y, start


def _moments(rows: FeatureRows, labels: torch.Tensor, n_classes: int, fit_intercept: bool, device):
    """Column means of the features and the targets (zeros without an intercept)."""
    d, n = rows.n_features, len(rows)
    mu = torch.zeros(d, dtype=_F64, device=device)
    if not fit_intercept:
        return mu, torch.zeros(n_classes, dtype=_F64, device=device)
    for H, _ in rows.blocks(device, _F64, rows=block_rows(d, device)):
        mu += H.sum(dim=0)
    if labels.ndim == 2:
        t_mean = 2.0 * labels.to(_F64).mean(dim=0) - 1.0
    else:
        t_mean = 2.0 * torch.bincount(labels, minlength=n_classes).to(_F64) / n - 1.0
    return mu / n, t_mean


def _gram_and_cross(blocks: _Pass) -> tuple[torch.Tensor, torch.Tensor]:
    """G = Hc^T Hc (d x d) and C = Hc^T Tc (d x K) over the blocks."""
    d, K, device = blocks.rows.n_features, blocks.K, blocks.device
    G = torch.zeros((d, d), dtype=_F64, device=device)
    C = torch.zeros((d, K), dtype=_F64, device=device)
    col_sum = torch.zeros(d, dtype=_F64, device=device)
    for Hc, y, _ in blocks:
        G += Hc.T @ Hc
        if y.ndim == 2:
            C += Hc.T @ (ridge_targets(y, K) - blocks.t_mean)
        else:  # Hc^T (2 onehot - 1 - t) from per-class row sums: no (b x K) targets
            sums = torch.zeros((K, d), dtype=_F64, device=device).index_add_(0, y, Hc)
            C += 2.0 * sums.T
            col_sum += Hc.sum(dim=0)
    if blocks.labels.ndim != 2:
        C -= col_sum[:, None] * (1.0 + blocks.t_mean)[None, :]
    return G, C


def _spectrum_from_qr(blocks: _Pass, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """s, V, Q from a streaming QR of [Hc, Tc] (stable whatever the conditioning)."""
    d, K = blocks.rows.n_features, blocks.K
    R = None
    for Hc, y, _ in blocks:
        A = torch.cat([Hc, ridge_targets(y, K) - blocks.t_mean], dim=1)
        R = torch.linalg.qr(A if R is None else torch.cat([R, A]), mode="r").R
    Ur, s, Vt = torch.linalg.svd(R[:d, :d])
    keep = s > (s[0] * max(n, d) * torch.finfo(_F64).eps)
    return s[keep], Vt[keep].T, Ur[:, keep].T @ R[:d, d:]


def _loo_blocks(blocks: _Pass, s, V, Q, n: int, fit_intercept: bool, alphas: np.ndarray):
    """Yield (start, targets T_b, [E_b per alpha]) of the exact leave-one-out residuals."""
    full_rank = s.numel() == n - int(fit_intercept)
    s2 = s * s
    for Hc, y, start in blocks:
        U = (Hc @ V) / s
        Tc = ridge_targets(y, blocks.K) - blocks.t_mean
        if full_rank:  # span(1, U) is all of R^n: the lambda-free parts are exactly zero
            resid0, lev0 = torch.zeros_like(Tc), torch.zeros(U.shape[0], dtype=_F64, device=U.device)
        else:
            resid0 = Tc - U @ Q
            lev0 = (1.0 - (U * U).sum(dim=1) - (1.0 / n if fit_intercept else 0.0)).clamp_min_(0.0)
        U2 = U * U
        out = []
        for alpha in alphas:
            f = alpha / (s2 + alpha)  # shrinkage of each direction; 0 at alpha = 0
            denom = lev0 + U2 @ f  # 1 - S_ii
            E = (resid0 + U @ (f[:, None] * Q)) / denom[:, None]
            E[denom <= 0] = torch.inf  # leverage one: not predictable without itself
            out.append(E)
        yield start, Tc + blocks.t_mean, out


def gram_ridge(rows: FeatureRows, labels: np.ndarray, n_classes: int, alphas: np.ndarray, fit_intercept: bool,
               device: torch.device, store_loo: bool = False, qr_fallback: bool = True) -> RidgeFit | None:
    """Fit the ridge probe on many rows from d x d summaries (see the module docstring)."""
    n = len(rows)
    y = torch.from_numpy(np.ascontiguousarray(labels)).to(device)
    mu, t_mean = _moments(rows, y, n_classes, fit_intercept, device)
    blocks = _Pass(rows, y, n_classes, mu, t_mean, device)
    G, C = _gram_and_cross(blocks)
    w, V = torch.linalg.eigh(G)
    if w[0] > 0 and w[-1] <= GRAM_MAX_CONDITION * w[0]:
        s, V = torch.sqrt(w.flip(0)), V.flip(1)
        Q = (V.T @ C) / s[:, None]
    elif qr_fallback:
        s, V, Q = _spectrum_from_qr(blocks, n)
    else:
        return None
    grid = torch.as_tensor(alphas, dtype=_F64, device=device)
    press = torch.zeros(len(alphas), dtype=_F64, device=device)
    for _, _, errors in _loo_blocks(blocks, s, V, Q, n, fit_intercept, grid):
        press += torch.stack([(E * E).sum() for E in errors])
    press_np = press.cpu().numpy() / (n * n_classes)
    alpha = select_alpha(press_np, np.asarray(alphas, dtype=np.float64))
    loo = None
    if store_loo:
        loo = np.empty((n, n_classes))
        chosen = torch.tensor([alpha], dtype=_F64, device=device)
        for start, T, (E,) in _loo_blocks(blocks, s, V, Q, n, fit_intercept, chosen):
            loo[start:start + T.shape[0]] = (T - E).cpu().numpy()
    B = V @ ((s / (s * s + alpha))[:, None] * Q)
    b = t_mean - mu @ B
    return RidgeFit(np.ascontiguousarray(B.T.cpu().numpy()), b.cpu().numpy(), alpha, press_np, loo)
