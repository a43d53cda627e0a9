"""Preconditioned L-BFGS for L2-penalised linear models, in torch on any device.

The solver minimises f(theta) = loss(theta) + reg / 2 ||W||^2 over theta = [W, b]
(K x (d + 1)), the bias b not penalised, where ``loss`` is any smooth convex mean loss
supplied by an ``Objective``: one call returns its value, its gradient and per-class
curvature weights at theta, computed however the objective likes (the logistic probe
reads its features block by block). Stopping test: max_j |grad f|_j <= tol, the
projected-gradient test scipy's L-BFGS-B applies for scikit-learn (no bounds, so the
projected gradient is the gradient).

Preconditioning. The Hessian of a linear model's mean loss has diagonal blocks
sum_i w_ik h_i h_i^T / n ~ c_k G with G = [X, 1]^T [X, 1] / n. The initial inverse
Hessian (c_k G + reg I)^-1 per class (one (d + 1)^2 eigendecomposition) removes the
offsets, scales and correlations of raw features that otherwise cost L-BFGS most of its
iterations. It only shapes the steps: the stopping test is always on the true gradient.

Warm starts along a penalty path: the loss part of each curvature pair does not depend
on reg, and the penalty part is corrected exactly (y_i += delta_reg * s_i), so the
iterate, its gradient and the memory carry over from one penalty to the next.

Line search: strong Wolfe on the convex f, bracketing on the monotone slope, each trial
one evaluation of the objective (value and gradient together). Near the optimum, where
the decrease drops below the resolution of f, the approximate Wolfe test of Hager &
Zhang (2005) stands in for sufficient decrease, so tolerances far below sqrt(eps) are
reachable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

__all__ = ["LBFGSMemory", "Objective", "Preconditioner", "SolverState", "minimize"]

HISTORY = 20  # curvature pairs; applying them is O(m K d), small next to a pass over the data
_C1, _C2, _MAX_LS = 1e-4, 0.9, 30  # strong Wolfe constants and trial budget
_STAGNATION = 30  # float32 iterations without a new smallest gradient before float64


class Objective(Protocol):
    """A smooth convex mean loss of a linear model with parameters theta (K, d + 1)."""
    # ``evaluate(theta, fast)`` returns (value, gradient (K, d + 1) float64, curvature
    # weights c (K,) float64); ``fast`` allows float32 arithmetic (sums in float64).

    def evaluate(self, theta: torch.Tensor, fast: bool) -> tuple[float, torch.Tensor, torch.Tensor]:
        """Value, gradient and curvature weights of the loss at ``theta``."""


class Preconditioner:
    """Initial inverse Hessian for L-BFGS: per class k, (c_k G + reg I)^-1."""

    def __init__(self, gram: torch.Tensor):
        evals, self.V = torch.linalg.eigh(gram.to(torch.float64))
        self.evals = evals.clamp_min(0.0)
        self.inv = torch.ones(1, dtype=torch.float64, device=gram.device)
        self.version = 0

    def update(self, curvature: torch.Tensor, reg: float) -> None:
        """Set the per-class curvature weights c_k (at the current iterate) and the penalty."""
        c = curvature.to(torch.float64).clamp_min(1e-8)
        floor = 1e-10 * float(c.max()) * float(self.evals[-1])  # null directions of G
        self.inv = 1.0 / (c[:, None] * self.evals[None, :] + reg + floor)
        self.version += 1

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        """M^-1 q for q of shape (K, d + 1)."""
        return ((q @ self.V) * self.inv) @ self.V.T


class LBFGSMemory:
    """Curvature pairs (s_i, y_i) in a ring buffer; the two-loop recursion with a
    preconditioned initial matrix H0 = gamma M^-1 (Nocedal & Wright, Algorithm 7.4)."""

    def __init__(self, size: int = HISTORY):
        self.size = size
        self.buf: torch.Tensor | None = None  # rows [0, m): s_i, rows [m, 2m): y_i
        self.rho = np.zeros(size)  # 1 / s_i^T y_i
        self.order: list[int] = []  # slots, oldest first
        self._yMy: tuple = (None, 0.0)  # cached y^T M^-1 y of the newest pair

    def __len__(self) -> int:
        return len(self.order)

    def clear(self) -> None:
        """Forget every pair."""
        self.order = []

    def snapshot(self) -> tuple:
        """A copy of the pairs, for ``restore``."""
        return (None if self.buf is None else self.buf.clone()), self.rho.copy(), list(self.order)

    def restore(self, snap: tuple) -> None:
        """Return to a ``snapshot``."""
        self.buf, self.rho, self.order = snap[0], snap[1].copy(), list(snap[2])

    def push(self, s: torch.Tensor, y: torch.Tensor) -> None:
        """Add the pair (step, gradient change) unless its curvature is not positive."""
        sy = float(torch.dot(s.ravel(), y.ravel()))
        if not sy > 1e-10 * float(torch.dot(y.ravel(), y.ravel())):
            return  # keeps H positive definite; Wolfe steps rarely fail this
        if self.buf is None:
            self.buf = torch.zeros((2 * self.size, s.numel()), dtype=torch.float64, device=s.device)
        if len(self.order) == self.size:
            slot = self.order.pop(0)
        else:
            slot = min(set(range(self.size)) - set(self.order))
        self.buf[slot] = s.ravel()
        self.buf[self.size + slot] = y.ravel()
        self.rho[slot] = 1.0 / sy
        self.order.append(slot)

    def shift_penalty(self, delta: float, mask: torch.Tensor) -> None:
        """Move the pairs to a penalty weight changed by ``delta``: y_i += delta * mask * s_i."""
        # Exact for the quadratic penalty (the loss curvature is unchanged).
        if not self.order or delta == 0.0:
            return
        m, width = self.size, mask.numel()
        S, Y = self.buf[:m], self.buf[m:]
        Y.view(m, -1, width).addcmul_(S.view(m, -1, width), mask, value=delta)  # in place: no (m x K(d+1)) copies
        sy = torch.bmm(S[:, None, :], Y[:, :, None]).ravel().cpu().numpy()
        yy = torch.bmm(Y[:, None, :], Y[:, :, None]).ravel().cpu().numpy()
        self.order = [j for j in self.order if sy[j] > 1e-10 * yy[j]]
        self.rho[self.order] = 1.0 / sy[self.order]

    def direction(self, g: torch.Tensor, precond: Preconditioner) -> torch.Tensor:
        """The search direction -H g (-M^-1 g while the memory is empty)."""
        m, shape = self.size, g.shape
        q = g.ravel().clone()
        alphas = []
        for j in reversed(self.order):
            a = self.rho[j] * float(torch.dot(self.buf[j], q))
            q -= a * self.buf[m + j]
            alphas.append(a)
        r = precond(q.view(shape)).ravel()
        if self.order:  # gamma: the newest pair's curvature in the M metric
            newest = self.order[-1]
            key = (newest, float(self.rho[newest]), precond.version)
            if self._yMy[0] != key:  # one application per new pair or preconditioner
                y = self.buf[m + newest]
                self._yMy = (key, float(torch.dot(y, precond(y.view(shape)).ravel())))
            r *= 1.0 / (self.rho[newest] * self._yMy[1])
        for j, a in zip(self.order, reversed(alphas)):
            r += (a - self.rho[j] * float(torch.dot(self.buf[m + j], r))) * self.buf[j]
        return -r.view(shape)


@dataclass
class SolverState:
    """An iterate with its objective value, gradient and curvature weights at penalty ``reg``."""

    theta: torch.Tensor
    f: float
    g: torch.Tensor
    curvature: torch.Tensor
    reg: float
    fast: bool

    @classmethod
    def at(cls, objective: Any, theta: torch.Tensor, reg: float, fast: bool) -> SolverState:
        """Evaluate ``objective`` at ``theta`` (copied) with penalty ``reg``."""
        theta = theta.clone()
        f, g, c = _penalised(objective, theta, reg, fast)
        return cls(theta, f, g, c, reg, fast)

    def move_penalty(self, reg: float) -> None:
        """Same data, new penalty weight: only the quadratic term changes, no data pass."""
        W, delta = self.theta[:, :-1], reg - self.reg
        self.f += 0.5 * delta * float(torch.sum(W * W))
        self.g[:, :-1] += delta * W
        self.reg = reg


def _penalised(objective: Any, theta: torch.Tensor, reg: float, fast: bool):
    loss, grad, curvature = objective.evaluate(theta, fast)
    W = theta[:, :-1]
    grad = grad.clone()
    grad[:, :-1] += reg * W
    return loss + 0.5 * reg * float(torch.sum(W * W)), grad, curvature


def _line_search(objective: Any, state: SolverState, D: torch.Tensor, df0: float, t: float):
    """Strong Wolfe step along D; returns (t, f, g, curvature) or None when no step qualifies."""
    f0 = state.f
    f_noise = (1e-6 if state.fast else 1e-13) * max(1.0, abs(f0))
    lo, dlo, hi, dhi = 0.0, df0, math.inf, math.nan
    best = None  # the last point with sufficient decrease
    for _ in range(_MAX_LS):
        f, g, c = _penalised(objective, state.theta + t * D, state.reg, state.fast)
        df = float(torch.sum(g * D))
        armijo = f <= f0 + _C1 * t * df0 or (f <= f0 + f_noise and df <= -0.8 * df0)
        if not (math.isfinite(f) and armijo):
            hi, dhi = t, df  # overshot: not enough decrease
        elif df < _C2 * df0:
            lo, dlo, best = t, df, (t, f, g, c)  # still descending steeply: step too short
        elif df > -_C2 * df0:
            hi, dhi = t, df  # slope turned up too much: step too long
        else:
            return t, f, g, c
        if math.isinf(hi):
            t *= 4.0
        else:
            width = hi - lo
            if math.isfinite(dhi) and dhi > dlo:  # secant on the slope, kept inside
                t = lo - dlo * width / (dhi - dlo)
                t = min(max(t, lo + 0.1 * width), hi - 0.1 * width)
            else:
                t = lo + 0.5 * width
    return best  # sufficient decrease without the curvature condition: still a step


def minimize(objective: Any, state: SolverState, memory: LBFGSMemory, precond: Preconditioner,
             tol: float, max_iter: int) -> tuple[int, str]:
    """Run L-BFGS from ``state`` (updated in place) until max|grad| <= tol."""
    precond.update(state.curvature, state.reg)
    best, best_it = math.inf, 0
    for it in range(max_iter):
        g_max = float(state.g.abs().max())
        if g_max <= tol:
            return it, "converged"
        if g_max < best:
            best, best_it = g_max, it
        elif state.fast and it - best_it >= _STAGNATION:
            # float32 round-off of the gradient is near tol (large feature values):
            # hand over to float64 rather than spin until max_iter
            return it, "stalled"
        D = memory.direction(state.g, precond)
        df0 = float(torch.sum(state.g * D))
        if not df0 < 0:  # the memory no longer gives a descent direction: restart it
            memory.clear()
            D = -precond(state.g)
            df0 = float(torch.sum(state.g * D))
        step = _line_search(objective, state, D, df0, 1.0)  # a quasi-Newton step first
        if step is None:
            return it, "stalled"
        t, state.f, g, state.curvature = step
        s = t * D
        state.theta += s
        memory.push(s, g - state.g)
        state.g = g
    return max_iter, "converged" if float(state.g.abs().max()) <= tol else "max_iter"
