"""Verdicts per cell with the false discovery rate controlled, and a summary per setting."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from pipeline.analysis.compare.paired import PairedComparison
from pipeline.analysis.compare.stats import benjamini_hochberg, check_probability
from pipeline.errors import DataValidationError

__all__ = ["VERDICTS", "CellVerdict", "SettingSummary", "decide_verdicts", "summarise_by_setting"]

VERDICTS = ("better", "worse", "indistinguishable", "unreliable")


@dataclass(frozen=True)
class CellVerdict:
    """One cell's comparison, its BH-adjusted p-value and the verdict for encoder A.

    Parameters
    ----------
    cell : hashable
        The cell's key (e.g. dataset, layer, setting).
    comparison : PairedComparison
        A against B on the cell.
    p_adjusted : float
        The Benjamini-Hochberg adjusted p-value (NaN for an ``unreliable`` cell, which
        is not in the family).
    verdict : str
        ``better``, ``worse``, ``indistinguishable`` or ``unreliable``.
    reason : str or None
        Why an ``unreliable`` cell has no verdict (``unreliable: <reason>``).
    """

    cell: Hashable
    comparison: PairedComparison
    p_adjusted: float
    verdict: str
    reason: str | None = None

    @property
    def text(self) -> str:
        """The verdict as shown: ``unreliable: <reason>`` for an unreliable cell.

        Returns
        -------
        str
        """
        return f"unreliable: {self.reason}" if self.verdict == "unreliable" else self.verdict

    def to_dict(self) -> dict[str, object]:
        """Plain dictionary for JSON.

        Not ``to_plain``: one flat record (the comparison's fields beside the verdict's, no
        replicates), ``p_adjusted`` None for an unreliable cell (NaN is not JSON) and
        ``reason`` only where there is one.

        Returns
        -------
        dict
            The cell (a list if it is a tuple), the comparison's fields, ``p_adjusted`` and
            ``verdict``.
        """
        cell = list(self.cell) if isinstance(self.cell, tuple) else self.cell
        p_adjusted = None if self.verdict == "unreliable" else self.p_adjusted  # not in the family
        out = {"cell": cell, **self.comparison.to_dict(), "p_adjusted": p_adjusted, "verdict": self.verdict}
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class SettingSummary:
    """Counts of verdicts over a setting's cells and the mean difference A - B.

    Parameters
    ----------
    setting : str
        The protocol setting.
    n_cells : int
        Cells compared.
    better, worse, indistinguishable : int
        Cells with each verdict for encoder A.
    mean_difference : float
        Mean of ``score_a - score_b`` over the cells with a verdict (NaN when every cell
        is unreliable).
    unreliable : int
        Cells without a verdict because a side's score is not to be trusted.
    """

    setting: str
    n_cells: int
    better: int
    worse: int
    indistinguishable: int
    mean_difference: float
    unreliable: int = 0


def decide_verdicts(
    comparisons: Mapping[Hashable, PairedComparison], alpha: float = 0.05,
    unreliable: Mapping[Hashable, str] | None = None,
) -> dict[Hashable, CellVerdict]:
    """Adjust the cells' p-values together (Benjamini-Hochberg) and give each a verdict.

    Parameters
    ----------
    comparisons : mapping of cell key to PairedComparison
        Every cell compared between the same two encoders (one family), e.g. keyed by
        ``(setting, dataset)``.
    alpha : float
        False discovery rate in (0, 1).
    unreliable : mapping of cell key to str, optional
        Cells whose score is not to be trusted on one side, with the reason: their
        verdict is ``unreliable`` and they are left out of the family.

    Returns
    -------
    dict
        Cell key to :class:`CellVerdict`, in the input order.
    """
    alpha = check_probability(alpha, "alpha")
    wrong = [k for k, c in comparisons.items() if not isinstance(c, PairedComparison)]
    if wrong:
        raise DataValidationError(f"comparisons must map cells to PairedComparison; not so for {wrong[:5]}")
    unreliable = {c: str(r) for c, r in (unreliable or {}).items() if c in comparisons}
    family = [c for c in comparisons if c not in unreliable]
    adjusted = dict(zip(family, benjamini_hochberg([comparisons[c].p_value for c in family]))) if family else {}
    out = {}
    for cell, comparison in comparisons.items():
        if cell in unreliable:
            out[cell] = CellVerdict(cell, comparison, float("nan"), "unreliable", unreliable[cell])
            continue
        p_adj = adjusted[cell]
        if p_adj <= alpha and comparison.difference != 0.0:
            verdict = "better" if comparison.difference > 0 else "worse"
        else:
            verdict = "indistinguishable"
        out[cell] = CellVerdict(cell, comparison, float(p_adj), verdict)
    return out


def summarise_by_setting(
    verdicts: Mapping[Hashable, CellVerdict],
    setting_of: Callable[[Hashable], str] = itemgetter(0),
) -> dict[str, SettingSummary]:
    """One summary line per setting: verdict counts and the mean score difference.

    Parameters
    ----------
    verdicts : mapping of cell key to CellVerdict
        The output of :func:`decide_verdicts`.
    setting_of : callable
        Maps a cell key to its setting's name; by default the key's first element, for
        keys such as ``(setting, dataset)``.

    Returns
    -------
    dict
        Setting name to :class:`SettingSummary`, settings sorted by name.
    """
    groups: dict[str, list[CellVerdict]] = {}
    for cell, verdict in verdicts.items():
        groups.setdefault(str(setting_of(cell)), []).append(verdict)
    out = {}
    for setting in sorted(groups):
        cells = groups[setting]
        counts = {v: sum(c.verdict == v for c in cells) for v in VERDICTS}
        judged = [c.comparison.difference for c in cells if c.verdict != "unreliable"]
        mean = float(np.mean(judged)) if judged else float("nan")
        out[setting] = SettingSummary(setting, len(cells), counts["better"], counts["worse"],
                                      counts["indistinguishable"], mean, counts["unreliable"])
    return out
