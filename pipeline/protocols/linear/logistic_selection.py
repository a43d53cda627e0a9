"""How the logistic probe chooses C on validation: the two walks over the grid and their rules.

``seed_walk`` is Ericsson et al.'s: the grid walked from the weakest penalty up, each fit
warm-started from the last and stopped at ``tol``, a value kept only when its validation
accuracy is strictly higher. ``stable_walk`` is the default: the path from the strongest
penalty down, then the values its rule reads taken on to their optimum in float64, and
``stable_choice``: the strongest penalty within one validation row's worth of the lowest
validation log-loss.
How far the features' rounding could move that choice is measured (``logistic_sensitivity``)
and said: ``Walk.margin``, in float32 ulps; under ``FRAGILE_ULPS`` the choice is fragile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.linear.lbfgs import LBFGSMemory, Preconditioner, SolverState, minimize
from pipeline.protocols.linear.linear_loss import linear_score_blocks
from pipeline.protocols.linear.logistic_checks import refine_to_optimum
from pipeline.protocols.linear.logistic_sensitivity import adjoint, noise_spread

__all__ = ["FRAGILE_ULPS", "FEATURE_ULPS", "GridWalk", "Walk", "prior_log_loss", "seed_walk", "stable_choice",
           "stable_walk", "weaker_choice"]

#: How many float32 ulps of each stored feature a choice must withstand: another machine's
#: kernels leave stored features a few ulps apart.
FEATURE_ULPS = 4
#: A choice is fragile when its margin is under this many ulps: ``FEATURE_ULPS`` four times
#: over, since the margin is measured per standard deviation of a first-order estimate
#: (four standard deviations: a flip under ``FEATURE_ULPS`` of noise about once in 10^4).
FRAGILE_ULPS = 4 * FEATURE_ULPS
#: ``stable``: a value's fit is taken on to its optimum while the solver's model predicts a
#: decrease above this share of the objective: its validation log-loss is then fixed far
#: below the noise of any comparison the rule makes.
_EXACT_RTOL = 1e-9
#: ``stable``: the first exact fits stop sooner; a comparison their doubt leaves close is
#: taken on to ``_EXACT_RTOL``.
_FIRST_RTOL = 1e-6
#: ``stable``: the iterations the exact fits may take in all, in ``max_iter``s; a budget
#: spent before the rule's values are known is said (the choice is fragile), not hidden.
_REFINE_BUDGET = 6
#: ``stable``: the exact fits' curvature pairs are kept (the chosen one's start the refit on
#: all rows) while all of them together stay under this many bytes.
_MEMORY_BYTES = 64 << 20


@dataclass
class GridWalk:
    """What a walk over the C grid works with: the train part's loss and solver state, the
    validation rows, and the probe's solver settings."""

    loss: Any
    state: SolverState
    memory: LBFGSMemory
    precond: Preconditioner
    mask: torch.Tensor
    grid: np.ndarray
    n_train: int
    val_rows: FeatureRows
    val_labels: np.ndarray
    train_rows: FeatureRows
    train_labels: np.ndarray
    device: Any
    tol: float
    max_iter: int
    solve: Callable
    val_score: Callable

    def reg(self, position: int) -> float:
        """The per-sample penalty weight of a grid position."""
        return 1.0 / (float(self.grid[position]) * self.n_train)


@dataclass
class Walk:
    """What a walk leaves for the refit on all rows and for the record."""

    position: int
    theta: torch.Tensor
    memory: tuple
    reg: float
    scores: list
    iterations: list
    statuses: list
    selection_set: np.ndarray
    refined: np.ndarray
    log_loss: np.ndarray
    alternatives: list = field(default_factory=list)
    exact: bool = False
    margin: float = float("inf")
    coherent_margin: float = float("inf")
    fragile: str | None = None


def seed_walk(g: GridWalk) -> Walk:
    """Ericsson et al.'s path: from the weakest penalty up, each fit warm-started from the last
    and stopped at tol, a value kept only when its validation score is strictly higher (the
    weakest penalty wins a tie)."""
    grid, state, memory = g.grid, g.state, g.memory
    scores, iters, statuses = [0.0] * grid.size, [0] * grid.size, []
    best, reg_from = None, 0.0
    for position in range(grid.size - 1, -1, -1):
        reg = g.reg(position)
        memory.shift_penalty(reg - reg_from, g.mask)
        reg_from = reg
        state, it, status = g.solve(g.loss, state, memory, g.precond, reg, False)
        statuses.append((float(grid[position]), status))
        iters[position] = it
        scores[position] = g.val_score(g.val_rows, g.val_labels, state.theta, g.device)
        if best is None or scores[position] > scores[best[0]]:
            best = (position, state.theta.clone(), memory.snapshot(), reg)
    position, theta, snap, reg = best
    return Walk(position, theta, snap, reg, scores, iters, statuses, np.array([grid[position]]),
                np.zeros(grid.size, dtype=bool), np.full((grid.size, 2), np.nan))


def stable_walk(g: GridWalk) -> Walk:
    """The path from the strongest penalty down (cheap warm starts, float32), then the values
    ``stable_choice`` reads taken on to their optimum in float64: from the path's lowest
    validation log-loss towards weaker penalties while the log-loss still falls, then towards
    stronger ones until it is above the rule's threshold; then the choice and its margin."""
    grid, state, memory, n_val = g.grid, g.state, g.memory, len(g.val_labels)
    scores, iters, status_at = [], [], {}
    path_loss = np.full(grid.size, np.inf)
    reg_from, start, start_theta = 0.0, 0, None
    for position in range(grid.size):
        reg = g.reg(position)
        memory.shift_penalty(reg - reg_from, g.mask)
        reg_from = reg
        state, it, status_at[position] = g.solve(g.loss, state, memory, g.precond, reg, False)
        iters.append(it)
        if it or not scores:
            accuracy, mean, *_ = _validation(g, state.theta, torch.float32)
        scores.append(accuracy)
        path_loss[position] = mean
        if start_theta is None or mean < path_loss[start]:
            start, start_theta = position, state.theta.clone()
    refined = np.zeros(grid.size, dtype=bool)
    log_loss = np.full((grid.size, 2), np.inf)
    doubt = np.zeros(grid.size)
    kept, curvature, memories, predictions, exact_to = {}, {}, {}, {}, {}
    held, budget = [0], [_REFINE_BUDGET * g.max_iter]
    exhausted = []

    def exact(position: int, theta: torch.Tensor, rtol: float) -> None:
        reg = g.reg(position)
        own = LBFGSMemory()
        if position in memories:
            own.restore(memories[position])
        cap = min(g.max_iter, budget[0])
        spent = 0
        if position not in kept:  # float32 products to tol first: half the cost
            quick = SolverState.at(g.loss, theta, reg, fast=True)
            spent, _ = minimize(g.loss, quick, own, g.precond, g.tol, cap)
            theta = quick.theta
        fit = SolverState.at(g.loss, theta, reg, fast=False)
        more, status = minimize(g.loss, fit, own, g.precond, g.tol, max(cap - spent, 0))
        if status == "converged":
            more += refine_to_optimum(g.loss, fit, own, g.precond, max(budget[0] - spent - more, 0), rtol)
        budget[0] -= spent + more
        if budget[0] <= 0:
            exhausted.append(float(grid[position]))
        iters[position] += spent + more
        status_at[position] = status
        kept[position], curvature[position], exact_to[position] = fit.theta, fit.curvature, rtol
        size = own.buf.numel() * 8 if own.buf is not None else 0
        if size and (position in memories or held[0] + size <= _MEMORY_BYTES):
            held[0] += 0 if position in memories else size
            memories[position] = own.snapshot()  # its curvature pairs go on with it, or start the refit's steps
        scores[position], mean, spread, predictions[position], _ = _validation(g, fit.theta, torch.float64)
        log_loss[position] = mean, spread
        # how far the log-loss could still move on the way to the optimum: the quasi-Newton step
        # left, doubled (the solver's own estimate of its distance)
        step = own.direction(fit.g, g.precond) if len(own) else -g.precond(fit.g)
        ahead = _validation(g, fit.theta + 2.0 * step, torch.float64)[1]
        doubt[position] = abs(ahead - mean) + 64 * np.finfo(np.float64).eps * abs(mean)
        refined[position] = True

    exact(start, start_theta, _FIRST_RTOL)
    strongest = weakest = start
    settled = False  # the lowest log-loss known: the weaker values' were seen to rise
    while budget[0] > 0:
        # towards stronger penalties until a value is above the threshold and the path's
        # stronger values (near their optimum: strong penalties converge fast) are too
        while strongest > 0 and budget[0] > 0:
            _, _, lowest = stable_choice(log_loss, refined, n_val)
            threshold = log_loss[lowest, 0] + resolution(n_val)
            if log_loss[strongest, 0] > threshold and not np.any(path_loss[:strongest] <= threshold):
                break
            exact(strongest - 1, kept[strongest], _FIRST_RTOL)
            strongest -= 1
        # towards weaker ones while the log-loss falls (or the path says a lower one lies beyond).
        # On separable rows it falls towards 0 to the grid's end; but a chosen value within the
        # resolution of 0 stays in the set whatever the lowest (>= 0) turns out to be, and the
        # stronger values above the threshold stay above a lower one: the weakest fits, the
        # most costly, are then not needed.
        chosen, _, lowest = stable_choice(log_loss, refined, n_val)
        if settled or log_loss[chosen, 0] <= resolution(n_val):
            break
        if weakest + 1 == grid.size:
            settled = True
            break
        exact(weakest + 1, kept[weakest], _FIRST_RTOL)
        weakest += 1
        lowest_loss = float(np.min(log_loss[refined, 0]))
        settled = log_loss[weakest, 0] >= log_loss[weakest - 1, 0] and not np.any(path_loss[weakest + 1:] < lowest_loss)
    # The comparisons that decide the choice are then checked against the fits' own doubt and
    # the features' rounding; where the doubt is what leaves them close, the fits on either
    # side are taken on to their optimum and the rule asked again.
    prior = prior_log_loss(g.train_labels, g.val_labels)
    _, members, lowest = stable_choice(log_loss, refined, n_val)
    if log_loss[lowest, 0] > prior - resolution(n_val):
        # The log-loss is no lower than the class prior's by one row's worth: no fit reads
        # anything from the features that validation can see, and its strongest member (nearly
        # uniform probabilities) may predict one class once refitted. Accuracy is the only
        # criterion left: the best count among the exact fits, the lowest log-loss on ties. On
        # such a flat curve rounding can move that choice, which is said.
        exact_at = np.flatnonzero(refined)
        best = np.max(np.asarray(scores)[exact_at])
        tied = exact_at[np.asarray(scores)[exact_at] == best]
        chosen = int(tied[np.argmin(log_loss[tied, 0])])
        walk = Walk(chosen, kept[chosen], memories.get(chosen, LBFGSMemory().snapshot()), g.reg(chosen), scores,
                    iters, [(float(grid[p]), status_at[p]) for p in sorted(status_at)], grid[members], refined,
                    log_loss, exact=True)
        walk.fragile = (f"the lowest validation log-loss ({log_loss[lowest, 0]:.4g}) is not below the class "
                        f"prior's ({prior:.4g}) by ln 2 / n_val: validation cannot inform C, chosen by validation "
                        f"accuracy, which rounding can move on so flat a curve")
        return walk
    for _ in range(3):
        chosen, members, lowest = stable_choice(log_loss, refined, n_val)
        walk = Walk(chosen, kept[chosen], memories.get(chosen, LBFGSMemory().snapshot()), g.reg(chosen), scores,
                    iters, [(float(grid[p]), status_at[p]) for p in sorted(status_at)], grid[members], refined,
                    log_loss, exact=True)
        loose = _margin(g, walk, kept, curvature, predictions, lowest, doubt, settled)
        loose = [p for p in loose if exact_to[p] > _EXACT_RTOL]
        if walk.fragile is None or not loose or budget[0] <= 0:
            break
        for p in loose:
            exact(p, kept[p], _EXACT_RTOL)
    if exhausted:
        walk.fragile = (f"the exact fits spent their budget of {_REFINE_BUDGET * g.max_iter} iterations at "
                        f"C = {exhausted[0]:.3g} before the rule's values were known")
    return walk


def _validation(g: GridWalk, theta: torch.Tensor, dtype: torch.dtype) -> tuple[float, float, float, np.ndarray,
                                                                               np.ndarray]:
    """Accuracy, mean log-loss, its standard error, the predictions and the per-row log-losses
    of theta on the validation rows."""
    theta_np = theta.cpu().numpy()
    predicted, losses = [], []
    for z, start in linear_score_blocks(g.val_rows, theta_np[:, :-1], theta_np[:, -1], g.device, dtype):
        z = z.to(torch.float64)
        own = torch.from_numpy(g.val_labels[start:start + len(z)]).to(z.device)
        predicted.append(torch.argmax(z, dim=1).cpu().numpy())
        losses.append((torch.logsumexp(z, dim=1) - z.gather(1, own[:, None])[:, 0]).cpu().numpy())
    predicted, losses = np.concatenate(predicted), np.concatenate(losses)
    spread = float(losses.std(ddof=1)) / np.sqrt(losses.size) if losses.size > 1 else 0.0
    return float(np.mean(predicted == g.val_labels)), float(losses.mean()), spread, predicted, losses


def _margin(g: GridWalk, walk: Walk, kept: dict, curvature: dict, predictions: dict, lowest: int,
            doubt: np.ndarray, settled: bool) -> list[int]:
    """How many ulps of feature noise the choice withstands: the comparisons that decided it
    (the chosen value within the threshold, the next stronger penalty above it), each less
    the fits' doubts, against the first-order spread of its two sides' difference
    (``logistic_sensitivity``). ``settled`` False: the lowest is not known, the threshold
    only bounded below by ``resolution`` (the chosen value is compared with that bound).
    Sets ``walk.margin`` (and ``fragile``); returns the positions whose doubt took a
    comparison under ``FRAGILE_ULPS``."""
    chosen, loss, n_val = walk.position, walk.log_loss[:, 0], len(g.val_labels)
    threshold = loss[lowest] + resolution(n_val)
    sides = []  # (position, its distance from the threshold, the position the threshold moves with)
    if not settled:
        sides.append((chosen, resolution(n_val) - loss[chosen], None))
    elif chosen != lowest:  # (the lowest against its own threshold is no comparison)
        sides.append((chosen, threshold - loss[chosen], lowest))
    if chosen > 0 and walk.refined[chosen - 1]:
        sides.append((chosen - 1, loss[chosen - 1] - threshold, lowest))
    if not sides:
        return []
    fits = {}
    for p in {p for p, _, _ in sides} | {q for _, _, q in sides if q is not None}:
        lam = adjoint(g.train_rows, g.train_labels, g.val_rows, g.val_labels, kept[p], g.reg(p), curvature[p],
                      g.precond, g.device)
        fits[p] = (kept[p], lam)
    spreads = noise_spread(g.train_rows, g.train_labels, g.val_rows, g.val_labels, fits,
                           [(p, q) for p, _, q in sides], g.device)
    margins, loose = [], []
    for (p, gap, q), (rows, columns) in zip(sides, spreads):
        certain = gap - doubt[p] - (doubt[q] if q is not None else 0.0)
        margins.append((certain / max(rows, 1e-300), certain / max(columns, 1e-300), p))
        if certain < FRAGILE_ULPS * rows <= gap:
            loose += [p] + ([q] if q is not None else [])
    walk.margin = float(min(m[0] for m in margins))
    walk.coherent_margin = float(min(m[1] for m in margins))
    if walk.margin >= FRAGILE_ULPS:
        return []
    # the chosen value leaving the set hands the choice to the next value in it; the stronger
    # neighbour entering it takes the choice
    members = np.flatnonzero(np.isin(g.grid, walk.selection_set))
    later = members[members > chosen]
    other = chosen - 1 if min(margins)[2] != chosen else (int(later[0]) if later.size else lowest)
    if other != chosen and other in predictions:
        walk.alternatives = [(float(g.grid[other]), int(np.sum(predictions[other] != predictions[chosen])))]
    walk.fragile = (f"{max(walk.margin, 0.0):.3g} float32 ulps of noise in the features could move the choice "
                    f"(fragile under {FRAGILE_ULPS})")
    return sorted(set(loose))


def weaker_choice(walk: Walk, grid: np.ndarray, seed: bool, j: int) -> int:
    """Where a collapsed refit at grid position ``j`` moves: the walk's own rule among the
    weaker penalties (``seed``: the first of the best walking down from the weakest; else the
    next value of the selection set, or the best of the weaker values when none is left)."""
    scores, weaker = np.asarray(walk.scores), np.arange(j + 1, grid.size)
    if seed:
        return int(weaker[np.flatnonzero(scores[weaker] == scores[weaker].max())[-1]])
    members = np.flatnonzero(np.isin(grid, walk.selection_set))
    later = members[members > j]
    if later.size:
        return int(later[0])
    return int(weaker[np.flatnonzero(scores[weaker] == scores[weaker].max())[0]])


def stable_choice(log_loss: np.ndarray, exact: np.ndarray, n_val: int) -> tuple[int, np.ndarray, int]:
    """The ``stable`` selection among the values fitted to their optimum: the strongest
    penalty whose validation log-loss is within ``resolution(n_val)`` of the lowest.

    Returns (chosen, the values within that resolution, the lowest)."""
    # The log-loss is continuous in the features and in C and has no plateaus where accuracy
    # ties: a comparison with the threshold flips only where the two are closer than the
    # features' rounding can move them, which ``_margin`` measures. Among values one
    # validation row's worth apart, the best-conditioned fit (the strongest penalty) is
    # taken: on separable rows the log-loss falls towards 0 with C, and its lowest would be
    # the grid's weakest penalty. (A one-standard-error band was tried: on weakly separable
    # features the validation log-loss's standard error is wide and its strongest member
    # cost up to 6 points of accuracy.)
    positions = np.flatnonzero(exact)
    lowest = int(positions[np.argmin(log_loss[positions, 0])])
    members = positions[log_loss[positions, 0] <= log_loss[lowest, 0] + resolution(n_val)]
    return int(members[0]), members, lowest


def prior_log_loss(train_labels: np.ndarray, val_labels: np.ndarray) -> float:
    """The mean validation log-loss of the class prior (the train part's class frequencies):
    what a fit that reads nothing from the features scores; inf where a validation class has
    no train row."""
    classes, counts = np.unique(train_labels, return_counts=True)
    share = dict(zip(classes.tolist(), (counts / counts.sum()).tolist()))
    p = np.array([share.get(y, 0.0) for y in np.asarray(val_labels).tolist()])
    return float(-np.mean(np.log(p))) if np.all(p > 0) else float("inf")


def resolution(n_val: int) -> float:
    """What one validation row moved from certain to a coin flip adds to the mean
    log-loss: ln 2 / n_val."""
    return float(np.log(2.0) / n_val)
