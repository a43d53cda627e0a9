"""Best-so-far bookkeeping over a checkpoint series."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np

from pipeline.analysis.compare.verdicts import VERDICTS
from pipeline.errors import DataValidationError
from pipeline.terminal import short


@dataclass(frozen=True)
class BestSoFar:
    """At ``step``: the cell's ``score`` there and the best checkpoint up to it.

    Parameters
    ----------
    step : int
        The checkpoint's step.
    score : float
        The cell's score at that step.
    best_step, best_score : int, float
        The best checkpoint up to ``step`` and its score.
    """

    step: int
    score: float
    best_step: int
    best_score: float


def _checked_scores(scores_by_step: Mapping[int, float], cell: Hashable = None) -> list[tuple[int, float]]:
    where = "" if cell is None else f" of cell {cell!r}"
    out = []
    for step, score in scores_by_step.items():
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataValidationError(f"steps{where} must be integers >= 0, got {short(step)}")
        if isinstance(score, bool) or not isinstance(score, (int, float, np.number)) or not math.isfinite(score):
            raise DataValidationError(f"score at step {step}{where} must be a finite number, got {short(score)}")
        out.append((int(step), float(score)))
    return sorted(out)


def best_so_far(scores_by_step: Mapping[int, float], higher_is_better: bool = True) -> list[BestSoFar]:
    """Running best of one cell's scores over increasing steps.

    Parameters
    ----------
    scores_by_step : mapping of int to float
        The cell's score at each evaluated step (missing steps simply absent).
    higher_is_better : bool
        False for metrics where lower is better (e.g. calibration error).

    Returns
    -------
    list of BestSoFar
        One entry per step, in increasing step order; ties keep the earlier checkpoint.
    """
    out, best = [], None
    for step, score in _checked_scores(scores_by_step):
        if best is None or (score > best[1] if higher_is_better else score < best[1]):
            best = (step, score)
        out.append(BestSoFar(step, score, best[0], best[1]))
    return out


def best_checkpoints(
    scores: Mapping[Hashable, Mapping[int, float]], upto: int | None = None, higher_is_better: bool = True
) -> dict[Hashable, BestSoFar]:
    """Each cell's best checkpoint among the steps up to ``upto``.

    Parameters
    ----------
    scores : mapping of cell key to (mapping of step to score)
        Every cell's scores by step.
    upto : int or None
        Last step considered; None takes every step.
    higher_is_better : bool
        False for metrics where lower is better.

    Returns
    -------
    dict
        Cell key to the :class:`BestSoFar` of its last step up to ``upto``; cells without a
        score up to then are left out.
    """
    out = {}
    for cell, by_step in scores.items():
        _checked_scores(by_step, cell)
        kept = {s: v for s, v in by_step.items() if upto is None or s <= upto}
        running = best_so_far(kept, higher_is_better)
        if running:
            out[cell] = running[-1]
    return out


@dataclass(frozen=True)
class SeriesCheck:
    """The newest checkpoint against each cell's best so far.

    ``to_compare`` maps the cells where an earlier checkpoint is best to that step (the
    pairs to compare); ``regressed`` lists those whose verdict is ``worse``;
    ``unchecked`` those still without a verdict; ``newest_is_best`` the cells the newest
    checkpoint leads; ``missing`` the cells the newest checkpoint has no score for.

    Parameters
    ----------
    newest_step : int
        The newest checkpoint's step.
    to_compare : dict
        Cell -> the earlier step that is best there.
    regressed, unchecked, newest_is_best, missing : tuple
        Cells in each state (see above).
    """

    newest_step: int
    to_compare: dict[Hashable, int]
    regressed: tuple[Hashable, ...]
    unchecked: tuple[Hashable, ...]
    newest_is_best: tuple[Hashable, ...]
    missing: tuple[Hashable, ...]

    @property
    def flagged(self) -> bool:
        """True when the newest checkpoint is significantly worse than the best on some cell."""
        return bool(self.regressed)


def check_newest(
    scores: Mapping[Hashable, Mapping[int, float]],
    verdicts: Mapping[Hashable, str] | None = None,
    newest_step: int | None = None,
    higher_is_better: bool = True,
) -> SeriesCheck:
    """Compare the newest checkpoint with each cell's best so far, given paired verdicts.

    Call it once without ``verdicts`` to learn which pairs to compare (``to_compare``), then
    again with the verdict of each comparison (newest as A, best as B).

    Parameters
    ----------
    scores : mapping of cell key to (mapping of step to score)
        Every cell's scores by step.
    verdicts : mapping of cell key to str, optional
        ``better`` / ``worse`` / ``indistinguishable`` of the newest checkpoint against the
        cell's best (from :func:`pipeline.analysis.compare.decide_verdicts`).
    newest_step : int or None
        The newest checkpoint's step; None takes the largest step in ``scores``.
    higher_is_better : bool
        False for metrics where lower is better.

    Returns
    -------
    SeriesCheck
        Pairs to compare, regressions, unchecked and missing cells.
    """
    verdicts = dict(verdicts or {})
    unknown = [c for c in verdicts if c not in scores]
    if unknown:
        raise DataValidationError(f"verdicts given for cells without scores: {unknown[:5]}; known cells: {list(scores)[:10]}")
    wrong = {c: v for c, v in verdicts.items() if v not in VERDICTS}
    if wrong:
        raise DataValidationError(f"unknown verdict(s) {wrong}; valid choices: {', '.join(VERDICTS)}")
    all_steps = [s for by_step in scores.values() for s in by_step]
    if newest_step is None:
        if not all_steps:
            raise DataValidationError("scores hold no step at all; nothing to check")
        newest_step = max(all_steps)
    best = best_checkpoints(scores, upto=newest_step, higher_is_better=higher_is_better)
    to_compare, regressed, unchecked, newest_best, missing = {}, [], [], [], []
    for cell, by_step in scores.items():
        if newest_step not in by_step:
            missing.append(cell)
        elif best[cell].best_step == newest_step:
            newest_best.append(cell)
        else:
            to_compare[cell] = best[cell].best_step
            if cell not in verdicts:
                unchecked.append(cell)
            elif verdicts[cell] == "worse":
                regressed.append(cell)
    return SeriesCheck(int(newest_step), to_compare, tuple(regressed), tuple(unchecked), tuple(newest_best), tuple(missing))
