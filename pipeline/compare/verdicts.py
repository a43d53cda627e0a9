"""Verdicts per cell with the false discovery rate controlled, and a summary per setting.

All cells compared between two encoders form one family: their p-values are adjusted
together by Benjamini-Hochberg, and a cell is ``better`` (A beats B) or ``worse`` when its
adjusted p-value is at most alpha, ``indistinguishable`` otherwise. The direction is the
sign of the observed difference A - B.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from pipeline.compare.paired import PairedComparison
from pipeline.compare.stats import benjamini_hochberg, check_probability
from pipeline.errors import DataValidationError

__all__ = ["VERDICTS", "CellVerdict", "SettingSummary", "decide_verdicts", "summarise_by_setting"]

VERDICTS = ("better", "worse", "indistinguishable")


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
        The Benjamini-Hochberg adjusted p-value.
    verdict : str
        ``better``, ``worse`` or ``indistinguishable``.
    """

    cell: Hashable
    comparison: PairedComparison
    p_adjusted: float
    verdict: str

    def to_dict(self) -> dict[str, object]:
        """Plain dictionary for JSON.

        Returns
        -------
        dict
            The cell (a list if it is a tuple), the comparison's fields, ``p_adjusted`` and
            ``verdict``.
        """
        cell = list(self.cell) if isinstance(self.cell, tuple) else self.cell
        return {"cell": cell, **self.comparison.to_dict(), "p_adjusted": self.p_adjusted, "verdict": self.verdict}


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
        Mean of ``score_a - score_b`` over the cells.
    """

    setting: str
    n_cells: int
    better: int
    worse: int
    indistinguishable: int
    mean_difference: float

    def to_dict(self) -> dict[str, object]:
        """Plain dictionary for JSON.

        Returns
        -------
        dict
            Every field.
        """
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def decide_verdicts(
    comparisons: Mapping[Hashable, PairedComparison], alpha: float = 0.05
) -> dict[Hashable, CellVerdict]:
    """Adjust the cells' p-values together (Benjamini-Hochberg) and give each a verdict.

    Parameters
    ----------
    comparisons : mapping of cell key to PairedComparison
        Every cell compared between the same two encoders (one family), e.g. keyed by
        ``(setting, dataset)``.
    alpha : float
        False discovery rate in (0, 1).

    Returns
    -------
    dict
        Cell key to :class:`CellVerdict`, in the input order.
    """
    alpha = check_probability(alpha, "alpha")
    wrong = [k for k, c in comparisons.items() if not isinstance(c, PairedComparison)]
    if wrong:
        raise DataValidationError(f"comparisons must map cells to PairedComparison; not so for {wrong[:5]}")
    cells = list(comparisons)
    adjusted = benjamini_hochberg([comparisons[c].p_value for c in cells])
    out = {}
    for cell, p_adj in zip(cells, adjusted):
        comparison = comparisons[cell]
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
        mean = float(np.mean([c.comparison.difference for c in cells]))
        out[setting] = SettingSummary(setting, len(cells), counts["better"], counts["worse"],
                                      counts["indistinguishable"], mean)
    return out
