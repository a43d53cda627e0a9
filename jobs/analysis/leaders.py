"""The top of one setting on one dataset: the best score and every cell the test images
cannot tell from it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jobs.analysis.compare import CompareOptions, compare_records, record_score, why_not_paired
from pipeline.analysis.compare import benjamini_hochberg
from pipeline.errors import DataValidationError
from pipeline.protocols.fit_warnings import unreliable_reasons

__all__ = ["TopGroup", "percent_at_precision", "top_group"]

#: How a line names the paired test behind the group (``PairedComparison.test``).
TEST_NAMES = {"mcnemar-exact": "McNemar's test", "mcnemar-mid-p": "McNemar's mid-p test",
              "randomization": "a randomization test", "paired-t": "a paired t test"}


def percent_at_precision(score: float, n: int) -> str:
    """``score`` in percent with the decimals its binomial standard error supports."""
    # The last printed digit is that of the standard error's first significant digit
    # (``sqrt(p (1 - p) / n)``, at least ``1 / n``): 93 % of 450 images (standard error
    # 1.2 points) prints ``93``, of 45,000 images ``93.1``.
    se = 100 * max(math.sqrt(score * (1 - score) / n), 1 / n)
    decimals = max(0, -math.floor(math.log10(se)))
    return f"{100 * score:.{decimals}f}"


@dataclass(frozen=True)
class TopGroup:
    """The best cell of a setting on a dataset and the cells not distinguishable from it."""

    setting: str
    dataset: str
    best: str
    score: float
    n: int
    tied: tuple[tuple[str, str], ...]
    left_out: tuple[str, ...]
    alpha: float
    test: str = "mcnemar-exact"

    def line(self) -> str:
        """One printed line: the score at its precision, and who reaches it only as far as
        the tests tell: one layer, one encoder's layers, or no single encoder (the group's
        members are in :meth:`to_dict`; printed, a member at the edge of significance would
        come and go with the last bits of the features)."""
        test = f"by {TEST_NAMES.get(self.test, self.test)}, BH {100 * self.alpha:g} %"
        encoders = {model for model, _ in self.tied}
        if len(self.tied) == 1:
            who = f"({self.best}; every other layer is significantly below it {test})"
        elif len(encoders) == 1:
            *most, last = [layer for _, layer in self.tied]
            layers = f"{', '.join(most)} and {last}"
            who = (f"({encoders.pop()}, its layers {layers} tied; every other encoder's layers are significantly "
                   f"below {test})")
        else:
            who = f"(no single encoder is best: layers of several are within noise of the top {test})"
        tail = f"; {len(self.left_out)} unreliable cell(s) left out" if self.left_out else ""
        return (f"best {self.setting} accuracy on {self.dataset}: {percent_at_precision(self.score, self.n)} % "
                f"of {self.n} test images {who}{tail}")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a figures file."""
        return {"encoder": self.best, "accuracy": self.score, "n": self.n, "tied": [f"{m} {layer}" for m, layer in self.tied],
                "left_out": list(self.left_out), "alpha": self.alpha, "test": self.test}


def _name(rec: Mapping[str, Any]) -> str:
    return f"{rec['model']} {rec['layer']}"


def top_group(store, records: Iterable[Mapping[str, Any]], setting: str, dataset: str,
              options: CompareOptions = CompareOptions()) -> TopGroup | None:
    """The best cell of ``setting`` on ``dataset`` among ``records`` and the cells tied with it."""
    cells = sorted((r for r in records if r.get("setting") == setting and r.get("dataset") == dataset
                    and record_score(r) is not None), key=_name)
    left_out = tuple(f"{_name(r)}: {'; '.join(reasons)}" for r in cells for reasons in [unreliable_reasons(r)] if reasons)
    trusted = [r for r in cells if not unreliable_reasons(r)]
    if not trusted:
        return None
    best = max(trusted, key=record_score)  # the first by name among equal scores
    others = [r for r in trusted if r is not best]
    for rec in others:
        reason = why_not_paired(best, rec)
        if reason:
            raise DataValidationError(f"{_name(rec)} cannot be compared with the best cell {_name(best)}: {reason}")
    comparisons = [compare_records(store, best, rec, options) for rec in others]
    adjusted = benjamini_hochberg([c.p_value for c in comparisons]) if comparisons else []
    tied = [best] + [rec for rec, c, p in zip(others, comparisons, adjusted)
                     if not (p <= options.alpha and c.difference > 0)]
    n = comparisons[0].n if comparisons else int(store.open_array(str(best["evidence"]["labels"])).shape[0])
    return TopGroup(setting, dataset, _name(best), float(record_score(best)), n,
                    tuple(sorted((str(r["model"]), str(r["layer"])) for r in tied)), left_out, options.alpha,
                    comparisons[0].test if comparisons else "mcnemar-exact")
