"""Multinomial logistic probe, full-batch L-BFGS in torch (PROTOCOLS.md section 3).

Objective, sklearn's convention so results compare with ``LogisticRegression``:
    C * sum_i CE(W h_i + b, y_i) + 0.5 ||W||^2          (bias b not penalised)
minimised in the equivalent per-sample form f = mean_i CE + ||W||^2 / (2 C n), which is
what sklearn's lbfgs minimises too. Convergence: max_j |grad f|_j <= tol, the projected
gradient test scipy's L-BFGS-B applies for sklearn (``gtol=tol``; no bounds, so projected
gradient = gradient).

Speed. The work is two (n x d) @ (d x K) products per L-BFGS iteration: the logits of the
search direction, and the gradient at the accepted point. The line search moves along
Z + t Zd without further products, so extra trial steps cost only O(n K). The initial
inverse Hessian is (c_k G + reg I)^-1 per class, G = [X, 1]^T [X, 1] / n (one (d+1)^2
eigendecomposition), which removes the offsets, scales and correlations of raw features
that otherwise cost L-BFGS most of its iterations. Along the C grid the iterate, its
gradient and the L-BFGS memory are carried over: the loss part of each curvature pair
does not depend on C and the penalty part is corrected exactly (y_i += delta_reg * s_i),
so each fit's first step is a path-following predictor and costs no extra product.
Grid fits run in float32 (products and softmax; sums, iterate and memory in float64);
the reported model's fit is finished, and its tolerance checked, in float64.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import StratifiedShuffleSplit
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols._validation import check_labels, check_min_classes, validate_features

__all__ = ["DEFAULT_CS", "LogisticProbe"]

#: The grid of PROTOCOLS.md: lambda = 1 / C, 45 values log-spaced 1e-6 .. 1e5 (C ascending).
DEFAULT_CS: np.ndarray = 1.0 / np.logspace(5, -6, 45)

_HISTORY = 20  # L-BFGS pairs; applying them is O(m K d), small next to a product
_RESYNC = 50  # recompute the logits from the iterate every so many steps (bounds drift)
_C1, _C2, _MAX_LS = 1e-4, 0.9, 30  # strong Wolfe constants and trial budget
_STAGNATION = 30  # float32 iterations without a new smallest gradient before float64


class _Preconditioner:
    """Initial inverse Hessian for L-BFGS: per class k, (c_k G + reg I)^-1.

    The Hessian of the mean cross-entropy has diagonal blocks sum_i p_ik (1 - p_ik)
    h_i h_i^T / n ~ c_k G with G = [X, 1]^T [X, 1] / n, so this matrix undoes the
    feature scales, offsets and correlations that make plain L-BFGS slow on raw features.
    It only shapes the steps: the stopping test is always on the true gradient.
    """

    def __init__(self, H: torch.Tensor):
        G = (H.T @ H).to(torch.float64) / H.shape[0]
        evals, self.V = torch.linalg.eigh(G)
        self.evals = evals.clamp_min(0.0)
        self.inv = torch.ones(1, dtype=torch.float64, device=H.device)
        self.version = 0

    def update(self, P: torch.Tensor, reg: float) -> None:
        """Curvature weights c_k from the softmax P at the current iterate."""
        c = (P * (1.0 - P)).mean(dim=0, dtype=torch.float64).clamp_min(1e-8)
        floor = 1e-10 * float(c.max()) * float(self.evals[-1])  # null directions of G
        self.inv = 1.0 / (c[:, None] * self.evals[None, :] + reg + floor)
        self.version += 1

    def __call__(self, q: torch.Tensor) -> torch.Tensor:
        return ((q @ self.V) * self.inv) @ self.V.T


class _Memory:
    """L-BFGS curvature pairs (s_i, y_i) in a ring buffer; two-loop recursion with a
    preconditioned initial matrix H0 = gamma M^-1 (Nocedal & Wright, Algorithm 7.4)."""

    def __init__(self, size: int = _HISTORY):
        self.size = size
        self.buf: torch.Tensor | None = None  # rows [0, m): s_i, rows [m, 2m): y_i
        self.rho = np.zeros(size)  # 1 / s_i^T y_i
        self.order: list[int] = []  # slots, oldest first
        self._yMy: tuple = (None, 0.0)  # cached y^T M^-1 y of the newest pair

    def __len__(self) -> int:
        return len(self.order)

    def clear(self) -> None:
        self.order = []

    def snapshot(self) -> tuple:
        return (None if self.buf is None else self.buf.clone()), self.rho.copy(), list(self.order)

    def restore(self, snap: tuple) -> None:
        self.buf, self.rho, self.order = snap[0], snap[1].copy(), list(snap[2])

    def push(self, s: torch.Tensor, y: torch.Tensor) -> None:
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
        """Move the pairs to a penalty weight changed by ``delta``: y_i += delta * mask * s_i
        (exact for the quadratic penalty; the loss curvature is unchanged)."""
        if not self.order or delta == 0.0:
            return
        m = self.size
        # mask: (d + 1,) over the columns of each (K, d + 1) pair
        self.buf[m:] += delta * (self.buf[:m].view(m, -1, mask.numel()) * mask).view(m, -1)
        sy = (self.buf[:m] * self.buf[m:]).sum(dim=1).cpu().numpy()
        yy = (self.buf[m:] ** 2).sum(dim=1).cpu().numpy()
        self.order = [j for j in self.order if sy[j] > 1e-10 * yy[j]]
        self.rho[self.order] = 1.0 / sy[self.order]

    def direction(self, g: torch.Tensor, precond: _Preconditioner) -> torch.Tensor:
        """-H g; -M^-1 g while the memory is empty."""
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
class _Problem:
    """f(theta) = mean_i CE(theta [h_i, 1], y_i) + reg / 2 ||W||^2 with theta = [W, b].

    ``fast`` selects float32 for the products and the elementwise softmax (sums are
    accumulated in float64); otherwise everything is float64. The iterate and the
    gradient handed to L-BFGS are float64 either way.
    """

    H: torch.Tensor  # (n, d + 1) augmented features [X, 1], float32 or float64
    y: torch.Tensor  # (n,) class indices
    reg: float  # 1 / (C n)
    precond: _Preconditioner | None = None  # built from H when first needed
    _copies: dict = field(default_factory=dict)  # H in the other precision, when needed

    def matrix(self, fast: bool) -> torch.Tensor:
        dtype = torch.float32 if fast else torch.float64
        if self.H.dtype == dtype:
            return self.H
        if dtype not in self._copies:
            self._copies[dtype] = self.H.to(dtype)
        return self._copies[dtype]

    def preconditioner(self) -> _Preconditioner:
        if self.precond is None:
            self.precond = _Preconditioner(self.H)
        return self.precond

    def logits(self, theta: torch.Tensor, fast: bool) -> torch.Tensor:
        H = self.matrix(fast)
        return H @ theta.to(H.dtype).T

    def grad(self, P: torch.Tensor, theta: torch.Tensor, fast: bool) -> torch.Tensor:
        """(P - Y)^T [H, 1] / n + reg * [W, 0], from the softmax P at theta."""
        R = P.clone()
        R[torch.arange(R.shape[0], device=R.device), self.y] -= 1.0
        G = (R.T @ self.matrix(fast)).to(torch.float64) / R.shape[0]
        G[:, :-1] += self.reg * theta[:, :-1]
        return G


def _along(problem: _Problem, Z, Zd, theta, D, t: float):
    """f, df/dt and the softmax P at theta + t D, from the logits Z and direction logits Zd
    (no product: the logits are linear in t)."""
    n, y = Z.shape[0], problem.y[:, None]
    Zt = torch.add(Z, Zd, alpha=t)
    z_true = Zt.gather(1, y)
    m = Zt.max(dim=1, keepdim=True).values
    E = Zt.sub_(m).exp_()  # one exp serves both log-sum-exp and softmax
    total = E.sum(dim=1, keepdim=True)
    ce = (m + torch.log(total) - z_true).sum(dtype=torch.float64)
    P = E.div_(total)
    slope = (P * Zd).sum(dtype=torch.float64) - Zd.gather(1, y).sum(dtype=torch.float64)
    W, DW = theta[:, :-1] + t * D[:, :-1], D[:, :-1]
    f = float(ce) / n + 0.5 * problem.reg * float(torch.sum(W * W))
    df = float(slope) / n + problem.reg * float(torch.sum(W * DW))
    return f, df, P


def _line_search(problem, Z, Zd, theta, D, f0: float, df0: float, t: float):
    """Strong Wolfe step for a convex f along D (bracketing on the monotone slope).

    Near the optimum the decrease c1 t |df0| drops below the resolution of f; there the
    approximate Wolfe test of Hager & Zhang (2005) stands in for sufficient decrease:
    f(t) <= f0 + (round-off of f) and a slope at most 0.8 |df0|, which for a convex f
    bounds f(t) - f0 by the trapezoid of the slopes. This lets the gradient test reach
    tolerances far below sqrt(eps). Returns (t, f, P), or None when no step qualifies.
    """
    f_noise = (1e-6 if Z.dtype == torch.float32 else 1e-13) * max(1.0, abs(f0))
    lo, dlo, hi, dhi = 0.0, df0, math.inf, math.nan
    for _ in range(_MAX_LS):
        f, df, P = _along(problem, Z, Zd, theta, D, t)
        armijo = f <= f0 + _C1 * t * df0 or (f <= f0 + f_noise and df <= -0.8 * df0)
        if not (math.isfinite(f) and armijo):
            hi, dhi = t, df  # overshot: not enough decrease
        elif df < _C2 * df0:
            lo, dlo = t, df  # still descending steeply: step too short
        elif df > -_C2 * df0:
            hi, dhi = t, df  # slope turned up too much: step too long
        else:
            return t, f, P
        if math.isinf(hi):
            t *= 4.0
        else:
            width = hi - lo
            if math.isfinite(dhi) and dhi > dlo:  # secant on the slope, kept inside
                t = lo - dlo * width / (dhi - dlo)
                t = min(max(t, lo + 0.1 * width), hi - 0.1 * width)
            else:
                t = lo + 0.5 * width
    if lo > 0:  # sufficient decrease without the curvature condition: still a step
        f, _, P = _along(problem, Z, Zd, theta, D, lo)
        return lo, f, P
    return None


@dataclass
class _State:
    """An iterate with its logits, objective, softmax and gradient (at penalty ``reg``)."""

    theta: torch.Tensor
    Z: torch.Tensor
    f: float
    P: torch.Tensor
    g: torch.Tensor
    reg: float
    fast: bool

    @classmethod
    def at(cls, problem: _Problem, theta: torch.Tensor, fast: bool) -> _State:
        theta = theta.clone()
        Z = problem.logits(theta, fast)
        f, _, P = _along(problem, Z, torch.zeros_like(Z), theta, torch.zeros_like(theta), 0.0)
        return cls(theta, Z, f, P, problem.grad(P, theta, fast), problem.reg, fast)

    def move_penalty(self, reg: float) -> None:
        """Same data, new penalty weight: only the quadratic term changes, no product."""
        W, delta = self.theta[:, :-1], reg - self.reg
        self.f += 0.5 * delta * float(torch.sum(W * W))
        self.g[:, :-1] += delta * W
        self.reg = reg


def _lbfgs(
    problem: _Problem, state: _State, memory: _Memory, tol: float, max_iter: int
) -> tuple[int, str]:
    """Run L-BFGS on ``problem`` from ``state`` (updated in place) until max|grad| <= tol.

    Returns (iterations, status) with status ``converged``, ``max_iter`` or ``stalled``
    (no step qualifies: the working precision is exhausted before reaching tol).
    """
    fast, theta, Z = state.fast, state.theta, state.Z
    precond = problem.preconditioner()
    precond.update(state.P, problem.reg)
    best, best_it = math.inf, 0
    for it in range(max_iter):
        g_max = float(state.g.abs().max())
        if g_max <= tol:
            return it, "converged"
        if g_max < best:
            best, best_it = g_max, it
        elif fast and it - best_it >= _STAGNATION:
            # float32 round-off of the gradient is near tol (large feature values):
            # hand over to float64 rather than spin until max_iter
            return it, "stalled"
        D = memory.direction(state.g, precond)
        df0 = float(torch.sum(state.g * D))
        if not df0 < 0:  # the memory no longer gives a descent direction: restart it
            memory.clear()
            D = -precond(state.g)
            df0 = float(torch.sum(state.g * D))
        t0 = 1.0  # a (quasi-)Newton step; the line search extrapolates when it is short
        Zd = problem.logits(D, fast)
        step = _line_search(problem, Z, Zd, theta, D, state.f, df0, t0)
        if step is None:
            return it, "stalled"
        t, state.f, state.P = step
        s = t * D
        theta += s
        if (it + 1) % _RESYNC == 0:
            Z.copy_(problem.logits(theta, fast))
            state.f, _, state.P = _along(problem, Z, torch.zeros_like(Z), theta, torch.zeros_like(theta), 0.0)
        else:
            Z += t * Zd
        g = problem.grad(state.P, theta, fast)
        memory.push(s, g - state.g)
        state.g = g
    return max_iter, "converged" if float(state.g.abs().max()) <= tol else "max_iter"


class LogisticProbe(ClassifierMixin, BaseEstimator):
    """Multinomial L2 logistic regression with an optional validated grid over C.

    Parameters
    ----------
    C : inverse L2 weight (sklearn's C), used when ``Cs`` is None.
    Cs : None (fit ``C``), ``"default"`` (``DEFAULT_CS``: 45 values, lambda = 1/C
        log-spaced 1e-6..1e5) or an array of C values. The grid is fitted on a stratified
        split of the train data, from the largest lambda down, each fit warm-started from
        the previous one; ``C_`` maximises validation accuracy (ties: the smaller C, i.e.
        the stronger regularisation); the final model is refitted on all of the train data.
    val_fraction : share of the train data held out for selection when ``Cs`` is given.
    tol : stop when max |gradient| of mean CE + ||W||^2 / (2 C n) <= tol; sklearn's
        default (its lbfgs applies the same test to the same function).
    max_iter : L-BFGS iterations per fit. 1000 (Ericsson et al. use 1000; sklearn's 100
        is often too few for unnormalised features). Hitting it sets ``converged_`` False
        and emits a ConvergenceWarning, never silently.
    random_state : seed of the validation split.
    device : torch device for the fit ("cpu" when None, "cuda", "cuda:1", ...).

    Attributes
    ----------
    classes_, coef_ (K, d), intercept_ (K,), C_, Cs_ (grid tried, ascending),
    val_scores_ (validation accuracy per ``Cs_``; empty without a grid), n_iter_ (1,)
    iterations of the final fit, grid_n_iter_ (per ``Cs_``), converged_ (every fit —
    grid and final — reached tol), n_features_in_.

    Grid fits use float32 products (tolerance checked on that gradient); the final fit
    continues in float64 until max|grad| <= tol holds in float64. With two classes the
    multinomial objective equals sklearn's binomial one at 2C (the penalty splits over two
    weight vectors); ``decision_function`` then returns z_1 - z_0 (n,).
    """

    _parameter_constraints: dict[str, list[Any]] = {
        "C": [Interval(Real, 0, None, closed="neither")],
        "Cs": [StrOptions({"default"}), "array-like", None],
        "val_fraction": [Interval(Real, 0, 1, closed="neither")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
        "device": [str, torch.device, None],
    }

    def __init__(
        self,
        C: float = 1.0,
        Cs: Any = None,
        val_fraction: float = 0.2,
        tol: float = 1e-4,
        max_iter: int = 1000,
        random_state: Any = 0,
        device: str | torch.device | None = None,
    ):
        self.C = C
        self.Cs = Cs
        self.val_fraction = val_fraction
        self.tol = tol
        self.max_iter = max_iter
        self.random_state = random_state
        self.device = device

    def _torch_device(self) -> torch.device:
        try:
            device = torch.device("cpu" if self.device is None else self.device)
        except RuntimeError as exc:
            raise ConfigError(f"device={self.device!r} is not a torch device: {exc}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"device={self.device!r} asked for CUDA, but torch.cuda.is_available() is False"
            )
        return device

    def _grid(self) -> np.ndarray | None:
        if self.Cs is None:
            return None
        grid = DEFAULT_CS if isinstance(self.Cs, str) else np.asarray(self.Cs, dtype=np.float64).ravel()
        if grid.size == 0 or not np.all(np.isfinite(grid) & (grid > 0)):
            raise ConfigError(f"Cs must be 'default' or a non-empty array of finite C > 0, got {self.Cs!r}")
        return np.unique(grid)  # ascending C: from the strongest penalty down

    def _split(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        splitter = StratifiedShuffleSplit(1, test_size=self.val_fraction, random_state=self.random_state)
        try:
            return next(splitter.split(np.zeros((y.size, 1)), y))
        except ValueError as exc:
            counts = np.bincount(np.searchsorted(self.classes_, y))
            raise DataValidationError(
                f"Cannot draw a stratified {self.val_fraction:g} validation split from "
                f"{y.size} samples of {counts.size} classes (smallest class: {counts.min()} "
                f"samples): {exc}. Use Cs=None with a fixed C, or the ridge probe (exact LOO) "
                "for low-shot data."
            ) from None

    def _minimize(
        self, problem: _Problem, state: _State, memory: _Memory, final: bool
    ) -> tuple[_State, int, str]:
        """float32 products to tol, then (final fit, or a float32 stall) float64 ones until
        max|grad| <= tol holds in float64; both stages share the max_iter budget."""
        if state.reg != problem.reg:
            state.move_penalty(problem.reg)
        it, status = _lbfgs(problem, state, memory, self.tol, self.max_iter)
        if status == "stalled" or (final and status == "converged"):
            state = _State.at(problem, state.theta, fast=False)
            it2, status = _lbfgs(problem, state, memory, self.tol, max(self.max_iter - it, 0))
            it += it2
        return state, it, status

    def fit(self, X: Any, y: Any, val_mask: Any = None) -> LogisticProbe:
        """Fit on features ``X`` (n, d) and integer labels ``y`` (n,).

        ``val_mask`` (bool, n): rows of a dataset-defined validation split, used instead of
        a stratified ``val_fraction`` draw to select C; the final fit uses every row.
        """
        self._validate_params()
        X = validate_features(self, X, reset=True)
        y = check_labels(y, n_samples=X.shape[0])
        if val_mask is not None:
            val_mask = np.asarray(val_mask)
            if val_mask.dtype != bool or val_mask.shape != y.shape:
                raise DataValidationError(
                    f"val_mask must be a boolean array of shape {y.shape}, got {val_mask.dtype} {val_mask.shape}"
                )
            if val_mask.all() or not val_mask.any():
                raise DataValidationError(
                    f"val_mask marks {int(val_mask.sum())} of {y.size} rows; both splits need rows"
                )
        self.classes_ = check_min_classes(y)
        grid = self._grid()
        device = self._torch_device()
        K = self.classes_.size
        # [X, 1] in X's own precision: float32 features are not copied to float64 unless
        # a float64 stage needs them (the conversion is exact)
        H = torch.from_numpy(np.hstack([X, np.ones((X.shape[0], 1), dtype=X.dtype)])).to(device)
        yi = torch.from_numpy(np.searchsorted(self.classes_, y)).to(device)
        theta = torch.zeros((K, H.shape[1]), dtype=torch.float64, device=device)
        memory = _Memory()
        mask = torch.ones(H.shape[1], dtype=torch.float64, device=device)
        mask[-1] = 0.0
        statuses: list[tuple[float, str]] = []
        reg_from = 0.0  # penalty weight the memory's curvature pairs were taken at

        if grid is None:
            C = float(self.C)
            self.Cs_, self.val_scores_ = np.array([C]), np.array([])
            self.grid_n_iter_ = np.array([], dtype=int)
        else:
            if val_mask is None:
                tr, va = self._split(y)
            else:
                tr, va = np.flatnonzero(~val_mask), np.flatnonzero(val_mask)
            problem = _Problem(H[tr], yi[tr], reg=0.0)
            state = _State.at(problem, theta, fast=True)
            H_val, y_val = H[va].to(torch.float32), yi[va]
            scores, iters, best = [], [], None
            for C in grid:
                reg = 1.0 / (C * len(tr))
                memory.shift_penalty(reg - problem.reg, mask)
                problem.reg = reg
                state, it, status = self._minimize(problem, state, memory, final=False)
                statuses.append((float(C), status))
                iters.append(it)
                if it or not scores:  # an unmoved iterate keeps its validation score
                    pred = torch.argmax(H_val @ state.theta.to(torch.float32).T, dim=1)
                    score = float((pred == y_val).double().mean())
                scores.append(score)
                if best is None or scores[-1] > scores[best[0]]:
                    # strictly better only: ties keep the smaller C (stronger penalty)
                    best = (len(scores) - 1, state.theta.clone(), memory.snapshot(), reg)
            self.Cs_, self.val_scores_ = grid, np.array(scores)
            self.grid_n_iter_ = np.array(iters)
            j, theta, snap, reg_from = best
            C = float(grid[j])
            memory.restore(snap)

        # Final model on all of the train data, from the selected grid solution. The kept
        # curvature pairs came from 80 % of the data: a preconditioner only, the
        # convergence test is on the float64 gradient of the full objective.
        # 80 % of the data estimate G well enough to precondition the final fit
        final = _Problem(
            H, yi, reg=1.0 / (C * H.shape[0]), precond=None if grid is None else problem.precond
        )
        memory.shift_penalty(final.reg - reg_from, mask)
        state, it, status = self._minimize(final, _State.at(final, theta, fast=True), memory, final=True)
        theta = state.theta
        statuses.append((C, status))
        self.C_ = C
        self.n_iter_ = np.array([it])
        self.converged_ = all(s == "converged" for _, s in statuses)
        theta_np = theta.cpu().numpy()
        self.coef_ = np.ascontiguousarray(theta_np[:, :-1])
        self.intercept_ = theta_np[:, -1].copy()
        if not self.converged_:
            bad = [(c, s) for c, s in statuses if s != "converged"]
            warnings.warn(
                f"LogisticProbe: {len(bad)} of {len(statuses)} fit(s) stopped before "
                f"max|grad| <= tol={self.tol:g} ({', '.join(f'C={c:.3g}: {s}' for c, s in bad[:5])}); "
                f"converged_ is False. Scale the features (e.g. standardize), raise "
                f"max_iter={self.max_iter} or loosen tol.",
                ConvergenceWarning,
                stacklevel=2,
            )
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        """Logits (n, K); z_1 - z_0 (n,) for two classes."""
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        Z = X.astype(np.float64, copy=False) @ self.coef_.T + self.intercept_
        return Z[:, 1] - Z[:, 0] if self.classes_.size == 2 else Z

    def predict_proba(self, X: Any) -> np.ndarray:
        """Softmax of the logits, (n, K)."""
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        Z = X.astype(np.float64, copy=False) @ self.coef_.T + self.intercept_
        Z -= Z.max(axis=1, keepdims=True)
        P = np.exp(Z)
        return P / P.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """Most probable class (the first on exact ties)."""
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        Z = X.astype(np.float64, copy=False) @ self.coef_.T + self.intercept_
        return self.classes_[np.argmax(Z, axis=1)]
