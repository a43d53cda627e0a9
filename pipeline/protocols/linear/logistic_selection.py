"""How the logistic probe chooses C on validation: the two walks over the grid and their rules.

``seed_walk`` is Ericsson et al.'s: the grid walked from the weakest penalty up, each fit
warm-started from the last and stopped at ``tol``, a value kept only when its validation
accuracy is strictly higher. ``stable_walk`` is the default: the path from the strongest
penalty down, then the values near its top fitted again in float64 and taken closer to their
optimum while what they could still change matters to ``stable_choice`` (the undecided
validation rows of ``decided``, the log-loss doubt; ``unsure`` names them), within a budget;
``alternatives`` says what the rows left undecided could still move the choice to.
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

__all__ = ["GridWalk", "Walk", "count_noise", "decided", "log_loss_threshold", "seed_walk", "stable_choice",
           "stable_walk", "weaker_choice"]

#: ``stable``: how many times a grid fit's gradient tolerance is cut tenfold while what it could
#: still change matters to the choice.
_TIGHTEN = 12
#: ``stable``: the iterations the fits near the top may take beyond the path in all, in
#: ``max_iter``s, and one fit at a time once they are all at tol (a share of ``max_iter``): a
#: flat, ill-conditioned curve (random-init features) would otherwise take max_iter per fit.
#: On the demo's 36 linear cells one ``max_iter`` left half of them with validation rows
#: undecided (``selection_fragile``); four decided every one, for about a third more time.
_REFINE_BUDGET, _REFINE_STEP = 4, 0.1
#: ``stable``: how many float32 ulps of each feature a validation row's prediction must
#: withstand to count as decided by the features (another machine's kernels leave stored
#: features a few ulps apart; a row whose two best logits are closer than that is decided by
#: rounding, whatever the fit's precision).
FEATURE_ULPS = 4
#: ``stable``: the refined fits' curvature pairs are kept (the chosen one's start the refit on
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
    """The path from the strongest penalty down (cheap warm starts), then every value near its
    top fitted again in float64 and taken closer to its optimum while that matters to
    ``stable_choice``, which then chooses."""
    grid, state, memory, n_val = g.grid, g.state, g.memory, len(g.val_labels)
    scores, iters, status_at, kept = [], [], {}, {}
    reg_from, best = 0.0, -np.inf
    for position in range(grid.size):
        reg = g.reg(position)
        memory.shift_penalty(reg - reg_from, g.mask)
        reg_from = reg
        state, it, status_at[position] = g.solve(g.loss, state, memory, g.precond, reg, False)
        iters.append(it)
        scores.append(g.val_score(g.val_rows, g.val_labels, state.theta, g.device) if it or not scores
                      else scores[-1])
        best = max(best, scores[-1])
        if scores[-1] >= best - _band(best, n_val):
            kept[position] = state.theta.clone()  # a candidate so far (the band only rises)
    refined = np.zeros(grid.size, dtype=bool)
    predictions, undecided, rounding = {}, {}, {}
    log_loss, doubt = np.full((grid.size, 2), np.inf), np.zeros(grid.size)
    gradient, memories, held = {}, {}, [0]
    # what the refinement may spend in all: the fits near the top of a flat, ill-conditioned
    # curve can each take max_iter; what is still undecided then is said, not hidden
    budget = [_REFINE_BUDGET * g.max_iter]

    def refine(position: int, tol: float, first: bool) -> None:
        reg = g.reg(position)
        own, spent = LBFGSMemory(), 0
        start = kept[position]
        cap = min(g.max_iter if first else max(1, int(_REFINE_STEP * g.max_iter)), budget[0])
        if first:  # float32 products to tol (half the cost), as the path
            quick = SolverState.at(g.loss, start, reg, fast=True)
            spent, _ = minimize(g.loss, quick, own, g.precond, tol, cap)
            start = quick.theta
        exact = SolverState.at(g.loss, start, reg, fast=False)
        more, status = minimize(g.loss, exact, own, g.precond, tol, max(cap - spent, 0))
        if first or status == "converged":
            status_at[position] = status
        budget[0] -= spent + more
        iters[position] += spent + more
        kept[position] = exact.theta
        size = own.buf.numel() * 8 if own.buf is not None else 0
        if size and (position in memories or held[0] + size <= _MEMORY_BYTES):
            held[0] += 0 if position in memories else size
            memories[position] = own.snapshot()  # its curvature pairs start the refit's steps
        (predictions[position], undecided[position], *log_loss[position], doubt[position],
         rounding[position]) = decided(g.val_rows, g.val_labels, exact, own, g.precond, g.device)
        scores[position] = float(np.mean(predictions[position] == g.val_labels))
        refined[position] = True
        gradient[position] = float(exact.g.abs().max())

    for position in [p for p in kept if scores[p] >= best - _band(best, n_val)]:
        refine(position, g.tol, first=True)
    # Then the fits whose undecided rows or log-loss could still change the choice are taken
    # closer to their optimum, their gradient tolerance cut tenfold at a time: a strong
    # penalty's logits are tiny, so its predictions need a fit precise to their scale, not
    # the objective's; a weak penalty's path iterate stops far from its optimum.
    # A row the features' last bits decide is left to ``_alternatives``: no fit can settle it.
    # The rounds stop when one settles nothing (a stalled, ill-conditioned fit would spend the
    # whole budget on the same rows).
    open_before = None
    for _ in range(_TIGHTEN):
        settle = {p: undecided[p] & ~rounding[p] for p in undecided}
        unsure = _unsure(np.asarray(scores), refined, n_val, log_loss, doubt, settle, predictions, g.val_labels)
        unsure = [p for p in unsure if status_at[p] == "converged"]
        still_open = sum(int(settle[p].sum()) for p in settle) + float(np.sum(doubt))
        if not unsure or budget[0] <= 0 or (open_before is not None and still_open >= open_before):
            break
        open_before = still_open
        for position in unsure:
            if budget[0] > 0:
                refine(position, gradient[position] / 10.0, first=False)
    # what neither the fit nor the features' last bits decide: refining could only settle the first
    open_rows = {p: undecided[p] | rounding[p] for p in undecided}
    sure = _sure_scores(np.asarray(scores), open_rows, predictions, g.val_labels)
    chosen, members = stable_choice(np.asarray(scores), refined, n_val, log_loss, sure)
    found = _alternatives(np.asarray(scores), refined, n_val, chosen, log_loss, open_rows, predictions,
                          g.val_labels, grid, sure)
    statuses = [(float(grid[p]), status_at[p]) for p in sorted(status_at)]
    return Walk(chosen, kept[chosen], memories.get(chosen, LBFGSMemory().snapshot()), g.reg(chosen), scores, iters,
                statuses, grid[members], refined, log_loss, found, exact=True)


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


def _band(best: float, n_val: int) -> float:
    # which path values are fitted again: two standard errors of the best score and two rows,
    # generous beside the one standard error that selects
    return 2.0 * count_noise(round(best * n_val), n_val) / n_val + 2.0 / n_val


def decided(rows: FeatureRows, labels: np.ndarray, state: SolverState, memory: LBFGSMemory,
            precond: Preconditioner, device: Any) -> tuple[np.ndarray, np.ndarray, float, float, float, np.ndarray]:
    """A fit's predictions on ``rows`` (float64); which of them its remaining distance to the
    optimum could still change (the quasi-Newton step left, the solver's estimate of that
    distance, doubled, against each row's margin between its two largest logits); the rows'
    mean log-loss, its standard error, and how far that step could move it; and which
    predictions ``FEATURE_ULPS`` float32 ulps of each feature could change (the margin against
    ulps x sum_i |x_i| (|w_top,i| + |w_second,i|))."""
    step = memory.direction(state.g, precond) if len(memory) else -precond(state.g)
    theta = state.theta.cpu().numpy()
    ahead = theta + 2.0 * step.cpu().numpy()
    predicted, margins, moves, losses, losses_ahead, reach = [], [], [], [], [], []
    here = linear_score_blocks(rows, theta[:, :-1], theta[:, -1], device)
    there = linear_score_blocks(rows, ahead[:, :-1], ahead[:, -1], device)
    # sum_i |x_i| |w_ci| per row and class: how far a relative change of each feature moves a logit
    spread_of = linear_score_blocks(rows.with_map(_absolute(rows.row_map)), np.abs(theta[:, :-1]),
                                    np.zeros(theta.shape[0]), device)
    for (z, start), (z2, _), (a, _) in zip(here, there, spread_of):
        top = torch.topk(z, min(2, z.shape[1]), dim=1)
        predicted.append(top.indices[:, 0].cpu().numpy())
        margins.append((top.values[:, 0] - top.values[:, -1]).cpu().numpy())
        reach.append(a.gather(1, top.indices).sum(dim=1).cpu().numpy())
        moves.append((z2 - z).abs().max(dim=1).values.cpu().numpy())
        own = torch.from_numpy(labels[start:start + len(z)]).to(z.device)
        losses.append((torch.logsumexp(z, dim=1) - z.gather(1, own[:, None])[:, 0]).cpu().numpy())
        losses_ahead.append((torch.logsumexp(z2, dim=1) - z2.gather(1, own[:, None])[:, 0]).cpu().numpy())
    margins, moves, losses = np.concatenate(margins), np.concatenate(moves), np.concatenate(losses)
    rounding = margins <= FEATURE_ULPS * np.finfo(np.float32).eps * np.concatenate(reach)
    # rounding of the float64 logits themselves: a few ulps of their size
    floor = 64 * np.finfo(np.float64).eps * max(float(np.max(np.abs(margins), initial=0.0)), 1.0)
    spread = float(losses.std(ddof=1)) / np.sqrt(losses.size) if losses.size > 1 else 0.0
    mean = float(losses.mean())
    doubt = abs(float(np.concatenate(losses_ahead).mean()) - mean) + 64 * np.finfo(np.float64).eps * abs(mean)
    return np.concatenate(predicted), margins <= 2.0 * moves + floor, mean, spread, doubt, rounding


def _absolute(row_map: Callable[[Any, int], Any] | None) -> Callable[[Any, int], Any]:
    # the rows as the fit sees them (after its preprocessing), in absolute value
    def absolute(block: Any, start: int) -> Any:
        return abs(row_map(block, start) if row_map is not None else block)
    return absolute


def stable_choice(scores: np.ndarray, exact: np.ndarray, n_val: int, log_loss: np.ndarray,
                  sure: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """The ``stable`` selection among the values fitted to their optimum."""
    # First the values whose validation accuracy is within one standard error of the best
    # (``count_noise``: the validation split's own resolution), read as counts. Among them, the strongest penalty whose validation log-loss is within the
    # noise of their lowest (``log_loss_threshold``). Accuracy stays the criterion the seed selects by; the
    # log-loss, continuous in C, breaks the plateaus of a small split where accuracy ties (so
    # no float order decides, and the probabilities stay calibrated: the strongest penalty of
    # a plateau alone would give nearly uniform ones); both steps are "one standard error"
    # rules, so among equals the best-conditioned fit is taken.
    positions = np.flatnonzero(exact)
    best = float((scores if sure is None else np.minimum(sure, scores))[positions].max())
    # counts, so that the threshold is not moved by how a score was summed
    counts = np.rint(scores * n_val)
    floor = np.rint(best * n_val) - count_noise(round(best * n_val), n_val)
    members = positions[counts[positions] >= floor - 1e-9]
    lowest = members[np.argmin(log_loss[members, 0])]
    near = members[log_loss[members, 0] <= log_loss_threshold(log_loss[lowest], n_val)]
    return int(near[0]), members


def _sure_scores(scores: np.ndarray, undecided: dict, predictions: dict, labels: np.ndarray) -> np.ndarray:
    # the validation accuracy each refined fit has decided: its undecided rows counted wrong
    sure = scores.copy()
    for position, rows in undecided.items():
        sure[position] = float(np.mean((predictions[position] == labels) & ~rows))
    return sure


def count_noise(correct: int, n_val: int) -> float:
    """One standard error of a count of ``correct`` rows of ``n_val``, in rows:
    sqrt(n p (1 - p)) at p = (correct + 1) / (n + 2), so that a split all right (or all wrong)
    still has a row's worth of noise, not none."""
    p = (correct + 1.0) / (n_val + 2.0)
    return float(np.sqrt(n_val * p * (1.0 - p)))


def log_loss_threshold(lowest: np.ndarray, n_val: int) -> float:
    """The highest validation log-loss within the noise of the lowest: one standard error,
    and at least ln 2 / n, one validation row moved from certain to a coin flip (the rows'
    own spread understates the noise when every row is nearly certain, as on separable
    data, where the log-loss falls towards 0 with C)."""
    return float(lowest[0] + max(lowest[1], np.log(2.0) / n_val))


def _unsure(scores: np.ndarray, exact: np.ndarray, n_val: int, log_loss: np.ndarray, doubt: np.ndarray,
            undecided: dict, predictions: dict, labels: np.ndarray) -> list[int]:
    """The fits to take closer to their optimum before ``stable_choice``'s answer holds."""
    # Counts first: a fit's undecided validation rows (see ``decided``) give its
    # count a range; while some fit could fall on either side of the one-standard-error floor,
    # that fit and those that could be the best are returned. Then the log-losses: none when no
    # log-loss, within its doubt, can fall on the other side of the rule's threshold (itself
    # known only within the doubts of the fits that could be the lowest); else those near the
    # threshold and those that could be the lowest.
    positions = np.flatnonzero(exact)
    correct = {p: predictions[p] == labels for p in positions}
    low = {p: int(np.sum(correct[p] & ~undecided[p])) for p in positions}
    high = {p: int(np.sum(correct[p] | undecided[p])) for p in positions}
    best_low, best_high = max(low.values()), max(high.values())

    def floor(best: int) -> float:
        return best - count_noise(best, n_val)

    floors = [floor(b) for b in range(best_low, best_high + 1)]
    # only a fit whose log-loss could come within the noise of the lowest can be chosen (or set
    # the threshold): its membership matters, and then the fits that could set the floor
    loss = log_loss[:, 0]
    reach = min(log_loss_threshold(log_loss[p], n_val) + doubt[p] for p in positions)
    either = [p for p in positions if loss[p] - doubt[p] <= reach
              and high[p] >= min(floors) - 1e-9 and low[p] < max(floors) - 1e-9]
    if either:
        return sorted(set(either) | {p for p in positions if high[p] >= best_low and high[p] > low[p]})

    chosen, members = stable_choice(scores, exact, n_val, log_loss,
                                    _sure_scores(scores, undecided, predictions, labels))
    lowest = members[np.argmin(loss[members])]
    could_be_lowest = [p for p in members if loss[p] - doubt[p] <= loss[lowest] + doubt[lowest]]
    noise = {p: log_loss_threshold(log_loss[p], n_val) - loss[p] for p in could_be_lowest}
    low_t = min(loss[p] - doubt[p] + noise[p] for p in could_be_lowest)
    high_t = max(loss[p] + doubt[p] + noise[p] for p in could_be_lowest)
    near = [p for p in members if p <= chosen and loss[p] - doubt[p] <= high_t and loss[p] + doubt[p] >= low_t]
    if near == [chosen] and loss[chosen] + doubt[chosen] <= low_t:  # below every threshold it could be
        near = []
    if not near:
        return []
    tiny = 1e-12 * max(abs(high_t), 1.0)  # as decided as float64 makes it
    return [p for p in sorted(set(near) | set(could_be_lowest)) if doubt[p] > tiny]


def _alternatives(scores: np.ndarray, exact: np.ndarray, n_val: int, chosen: int, log_loss: np.ndarray,
                  undecided: dict, predictions: dict, labels: np.ndarray,
                  grid: np.ndarray, sure: np.ndarray | None = None) -> list[tuple[float, int]]:
    """The other choices ``stable_choice`` could make if the validation rows each fit has not
    decided (see ``decided``) went the other way, each with the number of
    validation rows on which its predictions differ from the chosen fit's."""
    out: dict[int, int] = {}
    for position, rows in undecided.items():
        if not rows.any():
            continue
        # the worst cases: every undecided row of this fit right, or every one wrong
        wrong = predictions[position][rows] != labels[rows]
        for change in (int(wrong.sum()), -int((~wrong).sum())):
            moved = scores.copy()
            moved[position] += change / n_val
            # the fit then has every row decided: what it counts, it may also set the bar with
            moved_sure = None if sure is None else sure.copy()
            if moved_sure is not None:
                moved_sure[position] = moved[position]
            other, _ = stable_choice(moved, exact, n_val, log_loss, moved_sure)
            if other != chosen and other not in out:
                out[other] = int(np.sum(predictions[other] != predictions[chosen]))
    return [(float(grid[p]), n) for p, n in sorted(out.items())]
