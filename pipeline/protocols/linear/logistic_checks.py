"""What keeps the logistic probe's reported model honest: a refit that collapsed is caught,
and a fit on a flat loss is taken on to its optimum.

Both guard the step after C is selected on validation (``LogisticProbe.fit_rows``): the
refit on all rows. ``refit_collapse`` says when that refit no longer keeps what validation
saw in the chosen C (near-zero weights whose predictions the intercepts decide);
``refine_to_optimum`` continues a converged fit while the loss is so flat that the
gradient test passed far from the optimum.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.protocols.fit_warnings import class_share_collapsed
from pipeline.protocols.linear.lbfgs import LBFGSMemory, Preconditioner, SolverState, minimize

__all__ = ["F_RTOL", "majority_rate", "refine_to_optimum", "refit_collapse", "tie_rule_choice"]

#: A reported fit runs on while the solver's model of the objective expects to lower it by
#: more than this share of its value: its optimum within float rounding.
F_RTOL = 1e-9


def majority_rate(labels: np.ndarray) -> float:
    """Share of the rows in the most frequent class (what a constant prediction scores)."""
    return float(np.bincount(labels).max()) / len(labels) if len(labels) else float("nan")


def tie_rule_choice(scores: np.ndarray, iterations: np.ndarray, start: int = 0) -> int:
    """The grid position Ericsson et al.'s rule keeps among ``start`` and the weaker penalties."""
    # Walking C upwards (ascending grid), a value replaces the choice when its validation
    # score is higher, or equal and its warm-started fit moved (0 iterations: the previous
    # value's model under a nominally weaker penalty).
    best = start
    for k in range(start + 1, len(scores)):
        if scores[k] > scores[best] or (scores[k] == scores[best] and iterations[k] > 0):
            best = k
    return best


def refit_collapse(predicted: np.ndarray, labels: np.ndarray, val_score: float, val_chance: float) -> str | None:
    """Why a refitted model does not keep what validation saw in it; None when it does."""
    # Only a model that validated above chance is judged. On the very rows it was fitted
    # on, the refit must not give (nearly) one class to every row, and must keep at least
    # half of the validated margin over the majority rate: a healthy fit does far better on
    # its own rows than on held-out ones.
    if not val_score > val_chance:
        return None
    own, chance = float(np.mean(predicted == labels)), majority_rate(labels)
    if class_share_collapsed(predicted, labels):
        share = np.bincount(predicted).max() / len(predicted)
        return f"it predicts one class for {share:.0%} of the rows it was fitted on"
    if own - chance < 0.5 * (val_score - val_chance):
        return (f"its accuracy on the rows it was fitted on ({own:.3f}) keeps less than half of the validated "
                f"margin over chance ({val_score:.3f} against {val_chance:.3f})")
    return None


def refine_to_optimum(loss, state: SolverState, memory: LBFGSMemory, precond: Preconditioner, budget: int,
                      rtol: float = F_RTOL) -> int:
    """Iterations spent taking a converged fit on to its optimum where tol is loose."""
    # A weak penalty barely curves a flat loss (separable rows): max|grad| <= tol then holds
    # far from the optimum, wherever the path entered the flat region, and the predictions
    # depend on the start. While the quasi-Newton model predicts a decrease -g.H g / 2 above
    # ``rtol`` of the objective, the gradient tolerance is cut tenfold and the fit goes on
    # (never beyond ``budget`` iterations; a step that leaves a larger max|grad| is undone).
    # On a curved loss the first test passes: nothing changes.
    spent, target = 0, float(state.g.abs().max())
    while spent < budget:
        direction = memory.direction(state.g, precond)
        if -0.5 * float(torch.sum(state.g * direction)) <= rtol * abs(state.f):
            break
        kept = state.theta.clone(), state.f, state.g.clone(), state.curvature
        target /= 10.0
        it, status = minimize(loss, state, memory, precond, target, budget - spent)
        spent += it
        if float(state.g.abs().max()) > float(kept[2].abs().max()):  # L-BFGS gradients are not monotone
            state.theta, state.f, state.g, state.curvature = kept
            break
        if status != "converged" or it == 0:
            break
    return spent
