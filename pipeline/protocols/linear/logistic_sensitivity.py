"""How far noise in the features' last bits moves a fitted logistic probe's validation log-loss.

The ``stable`` selection compares validation log-losses of fits at their optimum; a
comparison decided by less than what rounding of the features can move it is fragile. For
a relative perturbation x_ij -> x_ij (1 + eps u_ij) of every feature (train and validation
rows), the change of the validation log-loss L_val(theta*(X_train), X_val) is, to first
order, sum_ij a_ij x_ij eps u_ij, where a = dL_val/dX is the total derivative: directly
through the validation rows, and through the optimum theta* of the train objective, by the
adjoint of the implicit function theorem (one solve H lambda = grad_theta L_val, H the
train objective's Hessian at theta*). Two noise models are measured:

- ``rows``: u_ij independent, uniform in [-1, 1] (rounding of each stored value, another
  machine's kernels on the stored features): variance sum (a x)^2 / 3;
- ``columns``: u_ij = v_j shared by every row of a feature (a channel's scale moved the
  same way in every image, as another extraction of the same weights leaves it): variance
  sum_j (sum_i a_ij x_ij)^2 / 3.

Both are returned per unit of eps, so a margin divided by them is in float32 ulps (eps =
float32's machine epsilon, one ulp of a value in [1, 2)).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.linear.lbfgs import Preconditioner

__all__ = ["ULP", "adjoint", "feature_response", "noise_spread"]

#: One float32 ulp, relative.
ULP = float(np.finfo(np.float32).eps)
#: The adjoint solve stops at this residual relative to its right-hand side: a spread known
#: to a few per cent is all a margin needs.
_CG_RTOL, _CG_MAX = 1e-3, 200


def _blocks(rows: FeatureRows, device: Any) -> Iterator[tuple[torch.Tensor, int]]:
    # the rows as the fit sees them (after its preprocessing), in float64
    yield from rows.blocks(device, torch.float64)


def _softmax_residual(H: torch.Tensor, W: torch.Tensor, b: torch.Tensor, y: torch.Tensor):
    P = torch.softmax(torch.addmm(b, H, W.T), dim=1)
    R = P.clone()
    R[torch.arange(len(y), device=R.device), y] -= 1.0
    return P, R


def _hessian_product(rows: FeatureRows, labels: torch.Tensor, theta: torch.Tensor, reg: float,
                     V: torch.Tensor, device: Any) -> torch.Tensor:
    """H V for the train objective mean CE + reg / 2 ||W||^2 at theta (one pass)."""
    W, b = theta[:, :-1], theta[:, -1]
    out_W = torch.zeros_like(W)
    out_b = torch.zeros_like(b)
    for H, start in _blocks(rows, device):
        P = torch.softmax(torch.addmm(b, H, W.T), dim=1)
        dz = torch.addmm(V[:, -1], H, V[:, :-1].T)
        dP = P * dz - P * (P * dz).sum(dim=1, keepdim=True)
        out_W += dP.T @ H
        out_b += dP.sum(dim=0)
    n = len(rows)
    out = torch.cat([out_W / n, out_b[:, None] / n], dim=1)
    out[:, :-1] += reg * V[:, :-1]
    return out


def _solve(rows: FeatureRows, labels: torch.Tensor, theta: torch.Tensor, reg: float, rhs: torch.Tensor,
           precond: Preconditioner, device: Any) -> torch.Tensor:
    """H^-1 rhs by conjugate gradients, preconditioned by the solver's own (c_k G + reg I)^-1."""
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    z = precond(r)
    p = z.clone()
    rz = float(torch.sum(r * z))
    target = _CG_RTOL * float(torch.linalg.norm(rhs))
    for _ in range(_CG_MAX):
        if float(torch.linalg.norm(r)) <= target:
            break
        Hp = _hessian_product(rows, labels, theta, reg, p, device)
        alpha = rz / float(torch.sum(p * Hp))
        x += alpha * p
        r -= alpha * Hp
        z = precond(r)
        rz, rz_old = float(torch.sum(r * z)), rz
        p = z + (rz / rz_old) * p
    return x


def adjoint(train: FeatureRows, train_labels: np.ndarray, val: FeatureRows, val_labels: np.ndarray,
            theta: torch.Tensor, reg: float, curvature: torch.Tensor, precond: Preconditioner,
            device: Any) -> torch.Tensor:
    """lambda = H^-1 grad_theta L_val at a fit's optimum ``theta`` of penalty ``reg``: how the
    validation log-loss reads a move of the optimum."""
    theta = theta.to(torch.float64)
    W, b = theta[:, :-1], theta[:, -1]
    y_val = torch.from_numpy(np.asarray(val_labels)).to(device)
    grad_W, grad_b = torch.zeros_like(W), torch.zeros_like(b)
    for H, start in _blocks(val, device):
        _, R = _softmax_residual(H, W, b, y_val[start:start + len(H)])
        grad_W += R.T @ H
        grad_b += R.sum(dim=0)
    m = len(val)
    rhs = torch.cat([grad_W / m, grad_b[:, None] / m], dim=1)
    precond.update(curvature, reg)
    y_train = torch.from_numpy(np.asarray(train_labels)).to(device)
    return _solve(train, y_train, theta, reg, rhs, precond, device)


def feature_response(train: FeatureRows, train_labels: np.ndarray, val: FeatureRows, val_labels: np.ndarray,
                     fits: dict[int, tuple[torch.Tensor, torch.Tensor]],
                     device: Any) -> Iterator[tuple[str, int, dict[int, torch.Tensor]]]:
    """Yield ("train" or "val", start, {key: a x}) over the rows' blocks: for each fit of
    ``fits`` (key -> (theta, its ``adjoint``)), dL_val/dX * X, the first-order change of
    its validation log-loss per unit relative change of each feature."""
    n, m = len(train), len(val)
    for name, part, labels, scale in (("train", train, train_labels, 1.0 / n), ("val", val, val_labels, 1.0 / m)):
        y = torch.from_numpy(np.asarray(labels)).to(device)
        for H, start in _blocks(part, device):
            ax = {}
            for key, (theta, lam) in fits.items():
                theta = theta.to(torch.float64)
                W, b = theta[:, :-1], theta[:, -1]
                P, R = _softmax_residual(H, W, b, y[start:start + len(H)])
                if name == "val":  # directly: dL/dx_j = W^T r_j / m
                    ax[key] = (R @ W) * H * scale
                else:  # through the optimum: -(Lambda_W^T r_i + W^T J_i (Lambda_W x_i + lambda_b)) / n
                    U = torch.addmm(lam[:, -1], H, lam[:, :-1].T)
                    JU = P * U - P * (P * U).sum(dim=1, keepdim=True)
                    ax[key] = -(R @ lam[:, :-1] + JU @ W) * H * scale
            yield name, start, ax


def noise_spread(train: FeatureRows, train_labels: np.ndarray, val: FeatureRows, val_labels: np.ndarray,
                 fits: dict[int, tuple[torch.Tensor, torch.Tensor]], pairs: list[tuple[int, int | None]],
                 device: Any) -> list[tuple[float, float]]:
    """Standard deviation, per ulp, of the change of L_p - L_q (L_p alone where q is None)
    under the ``rows`` and the ``columns`` noise models, for each (p, q) of ``pairs``;
    ``fits`` as ``feature_response``'s. One pass over the rows."""
    rows_var = [0.0] * len(pairs)
    columns: list[Any] = [0.0] * len(pairs)
    for _, _, ax in feature_response(train, train_labels, val, val_labels, fits, device):
        for k, (p, q) in enumerate(pairs):
            diff = ax[p] if q is None else ax[p] - ax[q]
            rows_var[k] += float(torch.sum(diff * diff))
            columns[k] = columns[k] + diff.sum(dim=0)
    return [(ULP * float(np.sqrt(r / 3.0)), ULP * float(np.sqrt(float(torch.sum(torch.as_tensor(c) ** 2)) / 3.0)))
            for r, c in zip(rows_var, columns)]
