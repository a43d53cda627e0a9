"""Checkpoint series: each series' scores by training step, its best checkpoint so far, and
whether the newest checkpoint is significantly worse than the best on some cell."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.analysis.compare import (
    CellKey, CompareOptions, cell_key, cell_label, compare_records, record_score, unreliable_reason,
)
from pipeline.analysis.compare.agreement import decided_by
from jobs.config import BenchmarkConfig
from pipeline.analysis.compare import CellVerdict, PairedComparison, decide_verdicts
from pipeline.errors import RepevalError
from pipeline.analysis.series import BestSoFar, SeriesCheck, best_so_far, check_newest


@dataclass(frozen=True)
class SeriesPoint:
    """One checkpoint of a series: the encoder's name and its training step."""

    encoder: str
    step: int


@dataclass
class SeriesAnalysis:
    """One series as the report and the run summary show it."""
    # ``scores`` maps each cell to its score by step; ``running`` the best so far at each
    # step; ``verdicts`` the newest checkpoint against each cell's best (where an earlier one
    # is best); ``not_compared`` the cells whose comparison was refused, with the reason;
    # ``unplaced`` the encoders of the series without a step, or with the step and the weights
    # of another member (a copy or a link: one point); ``problem`` why the series could not be
    # ordered at all (two members with one step and different weights); ``unreliable`` the
    # cells where the newest checkpoint gets no verdict because its record or the best one's
    # is not to be trusted, with the reason. ``improved`` maps each cell the newest checkpoint
    # leads to the earlier best step it was compared with (its verdict in ``verdicts``);
    # ``untrusted`` each cell's steps whose record carries an ``unreliable`` warning.

    name: str
    points: list[SeriesPoint] = field(default_factory=list)
    unplaced: list[dict[str, str]] = field(default_factory=list)
    scores: dict[CellKey, dict[int, float]] = field(default_factory=dict)
    running: dict[CellKey, list[BestSoFar]] = field(default_factory=dict)
    check: SeriesCheck | None = None
    verdicts: dict[CellKey, CellVerdict] = field(default_factory=dict)
    not_compared: list[dict[str, str]] = field(default_factory=list)
    problem: str | None = None
    unreliable: list[dict[str, str]] = field(default_factory=list)
    alpha: float = 0.05  # the false discovery rate of the verdicts
    improved: dict[CellKey, int] = field(default_factory=dict)
    untrusted: dict[CellKey, dict[int, str]] = field(default_factory=dict)

    @property
    def newest(self) -> SeriesPoint | None:
        """The checkpoint with the largest step (None for an empty series)."""
        return self.points[-1] if self.points else None

    def encoder_at(self, step: int) -> str:
        """The encoder evaluated at ``step``."""
        return next(p.encoder for p in self.points if p.step == step)

    @property
    def flagged(self) -> bool:
        """True when the newest checkpoint is significantly worse than the best on some cell."""
        return bool(self.check is not None and self.check.flagged)

    def regressions(self) -> list[dict[str, Any]]:
        """One entry per regressed cell: ``encoder`` (the newest), ``cell``, ``against`` (the
        cell's best checkpoint), their steps, the difference and the adjusted p-value, and
        how it was decided (``pipeline.analysis.compare.agreement.decided_by``: the interval, the test, its
        p-value and units, and the line saying why the two may disagree)."""
        if self.check is None or self.newest is None:
            return []
        out = []
        for cell in self.check.regressed:
            v = self.verdicts[cell]
            best = self.check.to_compare[cell]
            out.append({"series": self.name, "encoder": self.newest.encoder, "cell": cell_label(cell),
                        "against": self.encoder_at(best), "step": self.newest.step, "best_step": best,
                        "difference": v.comparison.difference, "p_adjusted": v.p_adjusted,
                        "metric": v.comparison.metric,
                        **decided_by(v.comparison, v.verdict, v.p_adjusted, self.alpha)})
        return out

    def improvements(self) -> list[dict[str, Any]]:
        """One entry per cell where the newest checkpoint is significantly better than the
        best earlier one (verdict ``better``, decided in the same family as the regressions):
        the fields of :meth:`regressions`, ``against`` the earlier best."""
        if self.newest is None:
            return []
        out = []
        for cell, earlier in self.improved.items():
            v = self.verdicts.get(cell)
            if v is None or v.verdict != "better":
                continue
            out.append({"series": self.name, "encoder": self.newest.encoder, "cell": cell_label(cell),
                        "against": self.encoder_at(earlier), "step": self.newest.step, "best_step": earlier,
                        "difference": v.comparison.difference, "p_adjusted": v.p_adjusted,
                        "metric": v.comparison.metric,
                        **decided_by(v.comparison, v.verdict, v.p_adjusted, self.alpha)})
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary for the run summary; not ``to_plain``: the summary's series entry
        holds derived values (newest, flagged, regressions, newest-is-best) and each cell's
        verdict by its label, not the analysis' fields."""
        newest = self.newest
        return {
            "series": self.name, "checkpoints": [{"encoder": p.encoder, "step": p.step} for p in self.points],
            "newest": None if newest is None else {"encoder": newest.encoder, "step": newest.step},
            "flagged": self.flagged, "regressions": self.regressions(), "improvements": self.improvements(),
            "newest_is_best": [cell_label(c) for c in (self.check.newest_is_best if self.check else ())
                               if cell_label(c) not in {u["cell"] for u in self.unreliable}],
            "verdicts": {cell_label(c): v.verdict for c, v in self.verdicts.items()},
            "unreliable": list(self.unreliable),
            "not_compared": list(self.not_compared), "unplaced": list(self.unplaced), "problem": self.problem,
        }


def series_members(cfg: BenchmarkConfig) -> dict[str, list[tuple[str, int | None]]]:
    """Series name -> (encoder, step) of its members, in config order."""
    out: dict[str, list[tuple[str, int | None]]] = {}
    for enc in cfg.encoders:
        if enc.series is not None:
            out.setdefault(enc.series, []).append((enc.name, enc.step))
    return out


def analyse_series(store, records: Iterable[Mapping[str, Any]], cfg: BenchmarkConfig,
                   options: CompareOptions = CompareOptions()) -> list[SeriesAnalysis]:
    """Every series of ``cfg``: scores by step, best so far, newest against the best."""
    by_model: dict[str, dict[CellKey, Mapping[str, Any]]] = {}
    weights: dict[str, str] = {}  # encoder -> weights fingerprint, from its records
    for rec in records:
        by_model.setdefault(str(rec.get("model")), {})[cell_key(rec)] = rec
        fingerprint = (rec.get("provenance") or {}).get("weights_fingerprint")
        if fingerprint:
            weights.setdefault(str(rec.get("model")), str(fingerprint))
    out = []
    for name, members in sorted(series_members(cfg).items()):
        analysis = SeriesAnalysis(name, alpha=options.alpha)
        steps: dict[int, str] = {}
        for encoder, step in members:
            if step is None:
                analysis.unplaced.append({"encoder": encoder, "reason": "no training step: the scan's step_pattern "
                                          "does not match its file name and its metadata has no step, global_step "
                                          "or epoch"})
            elif step in steps and weights.get(encoder) is not None and weights.get(encoder) == weights.get(
                    steps[step]):
                # a copy or a link of one checkpoint (Lightning's last.ckpt beside epoch=9-step=1200.ckpt)
                analysis.unplaced.append({"encoder": encoder, "reason": f"the same weights as {steps[step]} "
                                          f"(step {step}), which stands for both"})
            elif step in steps:
                analysis.problem = (f"{steps[step]} and {encoder} both have step {step}; a series needs one "
                                    "checkpoint per step")
            else:
                steps[step] = encoder
        analysis.points = [SeriesPoint(e, s) for s, e in sorted(steps.items())]
        out.append(analysis)
        if analysis.problem or not analysis.points:
            continue
        for point in analysis.points:
            for cell, rec in by_model.get(point.encoder, {}).items():
                score = record_score(rec)
                if score is not None:
                    analysis.scores.setdefault(cell, {})[point.step] = score
                    why = unreliable_reason(rec, {})
                    if why is not None:
                        analysis.untrusted.setdefault(cell, {})[point.step] = why
        if not analysis.scores:
            continue
        analysis.running = {c: best_so_far(s) for c, s in sorted(analysis.scores.items())}
        newest = analysis.newest
        first = check_newest(analysis.scores, newest_step=newest.step)
        comparisons: dict[CellKey, PairedComparison] = {}
        unreliable: dict[CellKey, str] = {}
        for cell in first.newest_is_best:  # "best so far" is a claim too: not from an untrusted score
            rec_new = by_model[newest.encoder][cell]
            why = unreliable_reason(rec_new, {})
            if why is not None:
                analysis.unreliable.append({"cell": cell_label(cell), "reason": why})
                continue
            running = analysis.running[cell]
            if len(running) < 2:  # the cell's first checkpoint: nothing earlier to improve on
                continue
            earlier = running[-2].best_step  # the best before the newest
            rec_earlier = by_model[analysis.encoder_at(earlier)][cell]
            try:  # an improvement is a claim like a regression: the same test, in the same family
                comparisons[cell] = compare_records(store, rec_new, rec_earlier, options)
            except RepevalError as exc:
                analysis.not_compared.append({"cell": cell_label(cell), "reason": str(exc)})
                continue
            analysis.improved[cell] = earlier
            why = unreliable_reason(rec_new, rec_earlier)
            if why is not None:  # the earlier best is untrusted: the lead stands, no tested change
                unreliable[cell] = why
        for cell, best_step in first.to_compare.items():
            rec_new, rec_best = by_model[newest.encoder][cell], by_model[analysis.encoder_at(best_step)][cell]
            try:
                comparisons[cell] = compare_records(store, rec_new, rec_best, options)
            except RepevalError as exc:  # this cell stays unchecked; the others are still compared
                analysis.not_compared.append({"cell": cell_label(cell), "reason": str(exc)})
                continue
            why = unreliable_reason(rec_new, rec_best)
            if why is not None:
                unreliable[cell] = why
                analysis.unreliable.append({"cell": cell_label(cell), "reason": why})
        analysis.verdicts = decide_verdicts(comparisons, options.alpha, unreliable) if comparisons else {}
        analysis.check = check_newest(analysis.scores, {c: v.verdict for c, v in analysis.verdicts.items()},
                                      newest_step=newest.step)
    return out
