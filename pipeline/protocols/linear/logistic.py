"""Multinomial (or one-vs-rest multi-label) L2 logistic probe on the L-BFGS solver of ``lbfgs``.

Objective, scikit-learn's convention so results compare with ``LogisticRegression``:
    C * sum_i CE(W h_i + b, y_i) + 0.5 ||W||^2          (bias b not penalised)
minimised in the equivalent per-sample form f = mean_i CE + ||W||^2 / (2 C n), which is
what scikit-learn's lbfgs minimises too. Multi-label targets (an (n, K) 0/1 array) use
the sum over classes of the binary cross-entropy of sigmoid(z_ik): K independent binary
logistic regressions at the same C, solved together.

Memory: the features are held once, in their own dtype (float16 included), and read
block by block; every pass computes a block's logits, its loss and its gradient
contribution with float32 products (float64 in the final stage), sums accumulated in
float64 (see ``linear_loss``; the l2 transform scales the logits, not a copy of the
rows). No (n x K) array is kept, so memory does not grow with the number of classes
times rows.

Speed: each L-BFGS trial point costs one pass (two products per block: logits and
gradient); with the preconditioner of ``lbfgs`` the first trial step is almost always
accepted. Along the C grid the iterate, its gradient and the curvature pairs carry over
(see ``lbfgs``). Grid fits run in float32 products; the reported model's fit is finished,
and its tolerance checked, in float64.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.blocks import FeatureRows, RowsPredictMixin
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.linear.lbfgs import LBFGSMemory, Preconditioner, SolverState, minimize
from pipeline.protocols.linear.linear_loss import LinearLoss, gram_matrix, linear_score_blocks
from pipeline.protocols.linear.logistic_checks import F_RTOL, majority_rate, refine_to_optimum, refit_collapse
from pipeline.protocols.linear.logistic_selection import GridWalk, seed_walk, stable_walk, weaker_choice
from pipeline.protocols.metrics import mean_average_precision
from pipeline.protocols.inputs.features import validate_features
from pipeline.protocols.inputs.labels import encode_targets, validation_split
from pipeline.protocols.inputs.parameters import check_grid, check_number

__all__ = ["DEFAULT_CS", "SELECTIONS", "LogisticProbe"]

#: The C grid of the logistic protocol: lambda = 1 / C, 45 values log-spaced 1e-6 .. 1e5 (C ascending).
DEFAULT_CS: np.ndarray = 1.0 / np.logspace(5, -6, 45)
#: How C is chosen on validation: ``stable`` (exact fits, the strongest penalty within the
#: validation set's noise of the best) or ``seed`` (Ericsson et al.'s path and rule).
SELECTIONS = ("stable", "seed")


class LogisticProbe(RowsPredictMixin, ClassifierMixin, BaseEstimator):
    """Multinomial L2 logistic regression with an optional validated grid over C.

    Parameters
    ----------
    C : float
        Inverse L2 weight (scikit-learn's C), used when ``Cs`` is None.
    Cs : None, "default" or array-like
        None: fit ``C``. ``"default"``: ``DEFAULT_CS`` (45 values, lambda = 1/C
        log-spaced 1e-6..1e5). The grid is fitted on the train part of a split and ``C_``
        chosen on validation by the ``selection`` rule (multi-label targets: by mean
        average precision, the ``seed`` rule); the final model is refitted on all rows. A
        refit that collapses (see ``selection_moves_``) moves the choice to the weaker
        penalties.
    val_fraction : float
        Share of the rows held out for selection when ``Cs`` is given and no
        validation rows are: a stratified draw (a plain random one for multi-label).
    tol : float
        Stop when max |gradient| of mean CE + ||W||^2 / (2 C n) <= tol; scikit-learn's
        default (its lbfgs applies the same test to the same function).
    max_iter : int
        L-BFGS iterations per fit. 1000 (Ericsson et al. use 1000; scikit-learn's 100
        is often too few for unnormalised features). Hitting it sets ``converged_``
        False and emits a ConvergenceWarning, never silently.
    refine_rtol : float
        The final fit, once at tol, goes on while the quasi-Newton model predicts a
        decrease above this fraction of the objective (``logistic_checks.refine_to_optimum``);
        ``1e-9`` ends it at its optimum within float rounding, so its predictions do not
        move with the features' last bits (another machine's kernels).
    refine_grid : bool
        Take every fit of the path on to its optimum too, in float64 (default False: a
        path fit stops where tol first holds, so on a flat loss, where a warm-started fit
        whose gradient already meets tol does not move, the validation curve follows the
        path; ``stable`` refines the values near the top in any case).
    selection : {"stable", "seed"}
        How C is chosen. ``stable``: the path from the strongest penalty down, the values
        the rule reads taken on to their optimum, then the strongest penalty whose
        validation log-loss is within one standard error (at least ln 2 / n_val) of the
        lowest; its margin against the features' rounding is measured.
        ``seed``: Ericsson et al.'s walk from the weakest penalty up, warm-started, a
        value kept only when its validation score is strictly higher.
    random_state : int, RandomState or None
        Seed of the validation draw.
    device : str, torch.device or None
        Compute device: ``auto``/None (CUDA when available), ``cpu``, ``cuda[:i]``.

    Attributes
    ----------
    classes_ : numpy.ndarray
        The labels as given (sorted); ``arange(K)`` for multi-label targets.
    coef_ : numpy.ndarray of shape (K, d)
    intercept_ : numpy.ndarray of shape (K,)
    C_ : float
        The C of the final model.
    Cs_ : numpy.ndarray
        The grid tried, ascending.
    val_scores_ : numpy.ndarray
        Validation score per ``Cs_`` (empty without a grid).
    train_index_, val_index_ : numpy.ndarray or None
        Sorted row positions of the selection split (None without a grid).
    n_val_ : int
        Rows the grid's C values were scored on (0 without a grid).
    n_iter_ : numpy.ndarray of shape (1,)
        Iterations of the final fit.
    grid_n_iter_ : numpy.ndarray
        Iterations per ``Cs_``.
    selection_moves_ : list of tuple
        (C left, C taken, why) for each time the refit on all rows of a single-label
        grid choice collapsed (one class for nearly every row, or less than half of the
        validated margin over the majority rate kept on its own rows); the choice then
        moves to the weaker penalties and the seed's rule picks among them. Empty
        normally.
    selection_set_, refined_, selection_alternatives_
        The walk's ``selection_set`` (the values within the noise of the lowest validation
        log-loss), ``refined`` (the values fitted to their optimum) and ``alternatives``
        (where a fragile choice could go, with the validation rows predicted otherwise).
    selection_margin_, selection_coherent_margin_ : float
        ``stable``: how many float32 ulps of relative noise in every feature (independent
        per value; shared by every row of a feature) the choice withstands, per standard
        deviation of its first-order change (inf: nothing to compare, or ``seed``).
    selection_fragile_ : str or None
        Why the choice could move with the features' rounding (``selection_margin_`` under
        ``logistic_selection.FRAGILE_ULPS``, or the exact fits' budget spent); None when it
        holds.
    val_log_loss_, val_log_loss_se_ : numpy.ndarray
        Mean validation log-loss per grid value and its standard error (refined values).
    selection_fit_ : numpy.ndarray of shape (K, d + 1) or None
        ``stable``: the chosen value's fit on the train part ([W, b]), at its optimum.
    converged_ : bool
        Every fit, grid and final, reached tol.
    multilabel_ : bool
        Whether the targets were (n, K) indicators.
    device_ : str
        The device the fit ran on.

    Notes
    -----
    With two classes the multinomial objective equals scikit-learn's binomial one at 2C
    (the penalty splits over two weight vectors); ``decision_function`` then returns
    z_1 - z_0 (n,).
    """

    def __init__(self, C: float = 1.0, Cs: Any = None, val_fraction: float = 0.2, tol: float = 1e-4,
                 max_iter: int = 1000, random_state: Any = 0, device: Any = None, refine_rtol: float = F_RTOL,
                 refine_grid: bool = False, selection: str = "stable"):
        self.C = C
        self.Cs = Cs
        self.val_fraction = val_fraction
        self.tol = tol
        self.max_iter = max_iter
        self.random_state = random_state
        self.device = device
        self.refine_rtol = refine_rtol
        self.refine_grid = refine_grid
        self.selection = selection

    # -- parameters --------------------------------------------------------------------
    def _check_params(self) -> np.ndarray | None:
        check_number(self.C, "C", 0, low_open=True)
        check_number(self.val_fraction, "val_fraction", 0, 1, low_open=True, high_open=True)
        check_number(self.tol, "tol", 0)
        check_number(self.max_iter, "max_iter", 1, integer=True)
        check_number(self.refine_rtol, "refine_rtol", 0, low_open=True)
        if not isinstance(self.refine_grid, (bool, np.bool_)):
            raise ConfigError(f"refine_grid must be true or false, got {self.refine_grid!r}")
        if self.selection not in SELECTIONS:
            raise ConfigError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if not (self.random_state is None or isinstance(self.random_state, np.random.RandomState)):
            check_number(self.random_state, "random_state", 0, 2**32 - 1, integer=True)
        if self.Cs is None:
            return None
        if isinstance(self.Cs, str):
            if self.Cs != "default":
                raise ConfigError(f"Cs must be None, 'default' or an array of C > 0, got {self.Cs!r}")
            return np.unique(DEFAULT_CS)
        return check_grid(self.Cs, "Cs", low_open=True)  # ascending C: from the strongest penalty down

    def _split(self, labels: np.ndarray, multilabel: bool) -> tuple[np.ndarray, np.ndarray]:
        return validation_split(labels, self.val_fraction, self.random_state, stratify=not multilabel,
                                hint="Use Cs=None with a fixed C, or the ridge probe (exact LOO) for low-shot data.")

    # -- fitting -----------------------------------------------------------------------
    def fit(self, X: Any, y: Any, val_mask: Any = None) -> LogisticProbe:
        """Fit on features ``X`` and labels ``y``.

        Parameters
        ----------
        X : array-like of shape (n, d)
            Features (float16/32/64 are used as they are, without a copy).
        y : array-like of shape (n,) or (n, K)
            Class labels of any sortable kind, or 0/1 multi-label indicators.
        val_mask : array-like of bool, shape (n,), or None
            Rows of a dataset-defined validation split, used instead of a
            ``val_fraction`` draw to select C; the final fit uses every row.

        Returns
        -------
        LogisticProbe
            self.
        """
        X = validate_features(self, X, reset=True)
        val_index = None
        if val_mask is not None:
            val_mask = np.asarray(val_mask)
            if val_mask.dtype != bool or val_mask.shape != (X.shape[0],):
                raise DataValidationError(f"val_mask must be a boolean array of shape ({X.shape[0]},), "
                                          f"got {val_mask.dtype} {val_mask.shape}")
            val_index = np.flatnonzero(val_mask)
        return self.fit_rows(FeatureRows.of(X), y, val_index=val_index)

    def fit_rows(self, rows: FeatureRows, y: Any, val_index: Any = None) -> LogisticProbe:
        """Fit on ``FeatureRows`` (features read in blocks, never copied whole).

        Parameters
        ----------
        rows : FeatureRows
            The features, in memory (they are read once per solver step).
        y : array-like of shape (n,) or (n, K)
            Labels of the rows, or 0/1 multi-label indicators.
        val_index : array-like of int or None
            Positions of a dataset-defined validation split (see ``fit``).

        Returns
        -------
        LogisticProbe
            self.
        """
        grid = self._check_params()
        n = len(rows)
        self.classes_, labels, multilabel = encode_targets(y, n)
        if val_index is not None:
            val_index = np.unique(np.asarray(val_index, dtype=np.int64))
            if val_index.size in (0, n) or val_index[0] < 0 or val_index[-1] >= n:
                raise DataValidationError(f"the validation split marks {val_index.size} of {n} rows (positions "
                                          "0 .. n-1); both splits need rows")
        self.multilabel_, self.n_features_in_ = multilabel, rows.n_features
        device = resolve_device(self.device)
        self.device_ = str(device)
        rows = rows.on_device(device)
        targets = torch.from_numpy(np.ascontiguousarray(labels)).to(device)
        K, d = self.classes_.size, rows.n_features
        theta = torch.zeros((K, d + 1), dtype=torch.float64, device=device)
        memory = LBFGSMemory()
        mask = torch.ones(d + 1, dtype=torch.float64, device=device)
        mask[-1] = 0.0
        statuses: list[tuple[float, str]] = []
        reg_from, precond = 0.0, None  # the penalty the memory's pairs were taken at

        self.train_index_ = self.val_index_ = None
        self.n_val_ = 0
        if grid is None:
            C = float(self.C)
            self.Cs_, self.val_scores_ = np.array([C]), np.array([])
            self.grid_n_iter_ = np.array([], dtype=int)
            self.selection_set_, self.refined_ = np.array([]), np.array([], dtype=bool)
            self.val_log_loss_ = self.val_log_loss_se_ = np.array([])
            self.selection_fit_ = None
            self.selection_alternatives_ = []
            self.selection_margin_ = self.selection_coherent_margin_ = float("inf")
            self.selection_fragile_ = None
        else:
            if val_index is None:
                tr, va = self._split(labels, multilabel)
            else:
                va = val_index
                tr = np.setdiff1d(np.arange(n), va)
            self.train_index_, self.val_index_ = tr, va
            self.n_val_ = int(len(va))
            train_rows = rows.select(tr)
            loss = LinearLoss(train_rows, targets[torch.from_numpy(tr).to(device)], K, device)
            precond = Preconditioner(gram_matrix(train_rows, device))
            state = SolverState.at(loss, theta, 0.0, fast=True)
            val_rows, val_labels = rows.select(va), labels[va]
            # multi-label scores are mean average precisions, not counts: the seed's path
            seed = self.selection == "seed" or multilabel
            walk = (seed_walk if seed else stable_walk)(GridWalk(
                loss, state, memory, precond, mask, grid, len(tr), val_rows, val_labels, train_rows, labels[tr],
                device, self.tol, self.max_iter, self._solve, self._val_score))
            statuses += walk.statuses
            self.Cs_, self.val_scores_ = grid, np.array(walk.scores)
            self.grid_n_iter_ = np.array(walk.iterations)
            self.selection_set_, self.refined_ = walk.selection_set, walk.refined
            self.val_log_loss_, self.val_log_loss_se_ = walk.log_loss[:, 0], walk.log_loss[:, 1]
            self.selection_alternatives_ = walk.alternatives
            self.selection_margin_, self.selection_coherent_margin_ = walk.margin, walk.coherent_margin
            self.selection_fragile_ = walk.fragile
            j, theta, reg_from = walk.position, walk.theta, walk.reg
            C = float(grid[j])
            # the chosen value's fit on the train part, at its optimum (``stable``): what a
            # calibration on the validation rows needs, without fitting it again
            self.selection_fit_ = theta.cpu().numpy().copy() if walk.exact else None
            memory.restore(walk.memory)
            val_chance = majority_rate(val_labels) if not multilabel else None
            loss = None  # its block buffers go before the final loss makes its own

        # Final model on all rows, from the selected grid solution. The kept curvature
        # pairs and the preconditioner came from the train part only: they shape the
        # steps; the convergence test is on the float64 gradient of the full objective.
        final = LinearLoss(rows, targets, K, device)
        precond = precond or Preconditioner(gram_matrix(rows, device))
        reg = 1.0 / (C * n)
        memory.shift_penalty(reg - reg_from, mask)
        state = SolverState.at(final, theta, reg, fast=True)
        state, it, status = self._solve(final, state, memory, precond, reg, final=True)
        self.selection_moves_ = []
        while grid is not None and not multilabel:
            # A validated model can collapse when refitted: near-zero weights (strong
            # penalties tie on a small validation split) leave the intercepts, which the
            # refit's unequal class counts set apart, to decide every prediction.
            why = refit_collapse(self._predict_labels(rows, state.theta, device), labels, self.val_scores_[j],
                                 val_chance)
            weaker = np.arange(j + 1, grid.size)
            if why is None or weaker.size == 0:
                break
            # the selection's rule among the weaker penalties; followed there along the grid
            nxt = weaker_choice(walk, grid, seed, j)
            self.selection_moves_.append((C, float(grid[nxt]), why))
            self.selection_fit_ = None  # that fit is another C's now
            for k in range(j + 1, nxt + 1):
                reg_next = 1.0 / (float(grid[k]) * n)
                memory.shift_penalty(reg_next - reg, mask)
                reg = reg_next
                state, it_k, status = self._solve(final, state, memory, precond, reg, final=k == nxt)
                it += it_k
            j, C = nxt, float(grid[nxt])
        statuses.append((C, status))
        self.C_, self.n_iter_ = C, np.array([it])
        self.converged_ = all(s == "converged" for _, s in statuses)
        theta_np = state.theta.cpu().numpy()
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

    def _solve(self, loss: LinearLoss, state: SolverState, memory: LBFGSMemory, precond: Preconditioner,
               reg: float, final: bool) -> tuple[SolverState, int, str]:
        """float32 products to tol, then (final fit, or a float32 stall) float64 ones until
        max|grad| <= tol holds in float64; both stages share the max_iter budget. The final
        fit (every fit with ``refine_grid``) is then taken on to its optimum."""
        if state.reg != reg:
            state.move_penalty(reg)
        refined = final or self.refine_grid
        it, status = minimize(loss, state, memory, precond, self.tol, self.max_iter)
        if status == "stalled" or (refined and status == "converged"):
            state = SolverState.at(loss, state.theta, reg, fast=False)
            it2, status = minimize(loss, state, memory, precond, self.tol, max(self.max_iter - it, 0))
            it += it2
        if refined and status == "converged":
            it += refine_to_optimum(loss, state, memory, precond, max(self.max_iter - it, 0), self.refine_rtol)
        return state, it, status

    def _val_score(self, rows: FeatureRows, labels: np.ndarray, theta: torch.Tensor, device) -> float:
        """Validation accuracy (mean average precision for multi-label) of theta."""
        if self.multilabel_:
            theta_np = theta.cpu().numpy()
            blocks = linear_score_blocks(rows, theta_np[:, :-1], theta_np[:, -1], device, torch.float32)
            return mean_average_precision(labels, np.concatenate([z.cpu().numpy() for z, _ in blocks]))
        return float(np.mean(self._predict_labels(rows, theta, device) == labels))

    @staticmethod
    def _predict_labels(rows: FeatureRows, theta: torch.Tensor, device) -> np.ndarray:
        """Class positions (0 .. K-1) that theta predicts for ``rows`` (float32 products)."""
        theta_np = theta.cpu().numpy()
        blocks = linear_score_blocks(rows, theta_np[:, :-1], theta_np[:, -1], device, torch.float32)
        return np.concatenate([torch.argmax(z, dim=1).cpu().numpy() for z, _ in blocks])

    # -- prediction --------------------------------------------------------------------
    def score_blocks(self, rows: FeatureRows) -> Iterator[tuple[torch.Tensor, int]]:
        """Yield (logits (b, K) float64, start) over ``rows`` on the fit's device.

        Parameters
        ----------
        rows : FeatureRows
            Features of the width seen in fit.

        Yields
        ------
        tuple of (torch.Tensor, int)
        """
        check_is_fitted(self)
        yield from linear_score_blocks(rows, self.coef_, self.intercept_, resolve_device(self.device))

    def _logits(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        return np.concatenate([z.cpu().numpy() for z, _ in self.score_blocks(FeatureRows.of(X))])

    def decision_function(self, X: Any) -> np.ndarray:
        """Logits.

        Parameters
        ----------
        X : array-like of shape (n, d)

        Returns
        -------
        numpy.ndarray
            (n, K); z_1 - z_0 of shape (n,) for two (single-label) classes.
        """
        Z = self._logits(X)
        return Z[:, 1] - Z[:, 0] if self.classes_.size == 2 and not self.multilabel_ else Z

    def predict_proba(self, X: Any) -> np.ndarray:
        """Softmax of the logits (per-class sigmoids for multi-label).

        Parameters
        ----------
        X : array-like of shape (n, d)

        Returns
        -------
        numpy.ndarray of shape (n, K)
        """
        Z = self._logits(X)
        if self.multilabel_:
            return 1.0 / (1.0 + np.exp(-Z))
        Z -= Z.max(axis=1, keepdims=True)
        P = np.exp(Z)
        return P / P.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """Most probable class (the first on exact ties); 0/1 indicators for multi-label.

        Parameters
        ----------
        X : array-like of shape (n, d)

        Returns
        -------
        numpy.ndarray
            (n,) labels from ``classes_``, or (n, K) indicators (logit > 0).
        """
        Z = self._logits(X)
        if self.multilabel_:
            return (Z > 0).astype(np.int64)
        return self.classes_[np.argmax(Z, axis=1)]

