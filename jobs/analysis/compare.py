"""Two encoders compared cell by cell from their stored evidence (``repeval compare``, and
the newest checkpoint of a series against its best)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.analysis.compare import (
    CellVerdict, PairedComparison, SettingSummary, check_paired, compare_episodes, compare_predictions,
    compare_scores, compare_values, decide_verdicts, labels_fingerprint, summarise_by_setting,
)
from pipeline.analysis.compare.pixels import compare_pixel_counts
from pipeline.analysis.compare.repeated import compare_repeated
from pipeline.errors import DataValidationError, RepevalError, StaleArrayError
from pipeline.plain import to_plain
from pipeline.protocols.evidence import headline_rows
from pipeline.protocols.fit_warnings import unreliable_reasons
from pipeline.protocols.registry import headline_value
from storage_schema.evidence import read_evidence

CellKey = tuple[str, str, str]  # (setting, dataset, layer)


@dataclass(frozen=True)
class CompareOptions:
    """How cells are compared: false discovery rate, resamples, permutations, seed, and the
    intervals' level (``confidence``; None: ``1 - alpha``, the level the verdicts are held to)."""

    alpha: float = 0.05
    n_resamples: int = 1000
    n_permutations: int = 9999
    confidence: float | None = None
    seed: int = 0
    mid_p: bool = False

    def __post_init__(self) -> None:
        if self.confidence is None:  # frozen: set once, here
            object.__setattr__(self, "confidence", 1.0 - float(self.alpha))


@dataclass
class EncoderComparison:
    """Encoder ``a`` against ``b``: each compared cell's verdict for ``a``, one summary per
    setting, and the cells that could not be compared with the reason."""

    a: str
    b: str
    alpha: float
    verdicts: dict[CellKey, CellVerdict] = field(default_factory=dict)
    settings: dict[str, SettingSummary] = field(default_factory=dict)
    not_compared: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary for ``--json``; not ``to_plain``: the verdicts, keyed by
        (setting, dataset, layer) tuples that JSON cannot key, become a list of flat cells,
        and a setting without a mean difference (no cell with a verdict) has null there."""
        cells = []
        for (setting, dataset, layer), v in self.verdicts.items():
            cells.append({"setting": setting, "dataset": dataset, "layer": layer,
                          **{k: val for k, val in v.to_dict().items() if k != "cell"}})
        settings = [to_plain(s) for s in self.settings.values()]
        for s in settings:  # no cell with a verdict: no mean (null, not NaN, which JSON has not)
            if not math.isfinite(s["mean_difference"]):
                s["mean_difference"] = None
        return {"a": self.a, "b": self.b, "alpha": self.alpha, "cells": cells,
                "settings": settings, "not_compared": self.not_compared}


def cell_key(rec: Mapping[str, Any]) -> CellKey:
    """(setting, dataset, layer) of a record."""
    return str(rec.get("setting")), str(rec.get("dataset")), str(rec.get("layer"))


def cell_label(cell: CellKey) -> str:
    """``setting/dataset/layer``: how summaries and reports name a cell."""
    return "/".join(cell)


def record_score(rec: Mapping[str, Any]) -> float | None:
    """A record's headline score (its entry's primary metric); None when it has no finite number there."""
    return headline_value(rec)


def unreliable_reason(rec_a: Mapping[str, Any], rec_b: Mapping[str, Any]) -> str | None:
    """Why no verdict may be drawn from a pair of records: each side's ``unreliable``
    warnings, named by encoder; None when both scores can be trusted."""
    parts = [f"{rec.get('model')} {'; '.join(reasons)}" for rec in (rec_a, rec_b)
             for reasons in [unreliable_reasons(rec)] if reasons]
    return " | ".join(parts) or None


def why_not_paired(rec_a: Mapping[str, Any], rec_b: Mapping[str, Any]) -> str | None:
    """Why two records of the same cell key cannot be compared; None when they can."""
    for field_ in ("protocol", "config_hash", "protocol_version"):
        if rec_a.get(field_) != rec_b.get(field_):
            return (f"different {field_.replace('_', ' ')} ({rec_a.get(field_)} vs {rec_b.get(field_)}): "
                    "evaluated under different settings")
    la, lb = (r.get("fingerprints", {}).get(f"{r.get('splits', ['test'])[-1]}.labels") for r in (rec_a, rec_b))
    if la != lb:
        return "different test labels (the dataset changed between the two evaluations)"
    for name, rec in (("A", rec_a), ("B", rec_b)):
        if not isinstance(rec.get("evidence"), Mapping):
            kept = "keeps no evidence" if rec.get("protocol") == "invariance" else "was recorded without evidence"
            return f"the cell of {name} ({rec.get('model')}) {kept}; re-evaluate it to compare"
    if rec_a["evidence"].get("kind") != rec_b["evidence"].get("kind"):
        return f"different kinds of evidence ({rec_a['evidence'].get('kind')} vs {rec_b['evidence'].get('kind')})"
    return None


def _labels(store, entry: Mapping[str, Any], fingerprint: str, what: str) -> np.ndarray:
    key = entry.get("labels")
    if not key:
        raise DataValidationError(f"the evidence of {what} does not name its test labels; re-evaluate the cell")
    y = store.open_array(str(key)).read()
    if labels_fingerprint(y) != fingerprint:
        raise StaleArrayError(f"the test labels {key} changed since {what} was evaluated (stale fingerprint); "
                              "re-evaluate the cell")
    return y


def compare_records(store, rec_a: Mapping[str, Any], rec_b: Mapping[str, Any],
                    options: CompareOptions = CompareOptions()) -> PairedComparison:
    """Compare the stored evidence of two records of the same cell (A minus B)."""
    reason = why_not_paired(rec_a, rec_b)
    if reason:
        raise DataValidationError(reason)
    ea, eb = rec_a["evidence"], rec_b["evidence"]
    kind = ea["kind"]
    what = f"{rec_a.get('model')} on {cell_label(cell_key(rec_a))}"
    if kind == "episodes":
        check_paired(ea.get("episodes_fingerprint"), eb.get("episodes_fingerprint"), "episodes")
        return compare_episodes(read_evidence(store, ea, what), read_evidence(store, eb, what),
                                n_resamples=options.n_resamples, confidence=options.confidence, seed=options.seed)
    if kind == "values":  # one value per unit (a query's AP@R): the same queries and gallery
        check_paired(ea.get("values_fingerprint"), eb.get("values_fingerprint"), "queries and gallery")
        return compare_values(read_evidence(store, ea, what), read_evidence(store, eb, what), ea["metric"],
                              n_resamples=options.n_resamples, confidence=options.confidence, seed=options.seed)
    if kind == "pixel_counts":  # dense cells: the same test targets, image by image
        check_paired(ea.get("targets_fingerprint"), eb.get("targets_fingerprint"), "test targets")
        return compare_pixel_counts(read_evidence(store, ea, what), read_evidence(store, eb, what), ea["metric"],
                                    n_resamples=options.n_resamples, n_permutations=options.n_permutations,
                                    confidence=options.confidence, seed=options.seed)
    check_paired(ea.get("labels_fingerprint"), eb.get("labels_fingerprint"), "test labels")
    y = _labels(store, ea, ea["labels_fingerprint"], what)
    va, vb = read_evidence(store, ea, what), read_evidence(store, eb, what)
    run = {"n_resamples": options.n_resamples, "confidence": options.confidence, "seed": options.seed}
    if kind == "scores":
        return compare_scores(y, va, vb, n_permutations=options.n_permutations, **run)
    if kind == "predictions":
        return compare_predictions(y, va, vb, ea.get("metric", "top1"), n_permutations=options.n_permutations,
                                   mid_p=options.mid_p, **run)
    if kind == "fits":
        if (ea.get("fits"), ea.get("headline")) != (eb.get("fits"), eb.get("headline")):
            raise DataValidationError(f"the low-shot fits differ ({ea.get('headline')}: {len(ea.get('fits', []))} "
                                      f"fits vs {eb.get('headline')}: {len(eb.get('fits', []))})")
        rows = headline_rows(ea["fits"], ea["headline"])
        if rows.size == 1:  # one fit (N = all): the exact McNemar test
            return compare_predictions(y, va[rows[0]], vb[rows[0]], "top1", mid_p=options.mid_p, **run)
        return compare_repeated(y, va[rows], vb[rows], **run)
    raise DataValidationError(f"unknown evidence kind {kind!r} in the record of {what}")


def _by_cell(records: Iterable[Mapping[str, Any]], model: str) -> dict[CellKey, Mapping[str, Any]]:
    return {cell_key(r): r for r in records if r.get("model") == model}


def compare_encoders(store, records: Iterable[Mapping[str, Any]], a: str, b: str,
                     options: CompareOptions = CompareOptions(), settings: Iterable[str] | None = None,
                     ) -> EncoderComparison:
    """Every cell both encoders have, compared; verdicts with the FDR controlled over them."""
    records = list(records)
    models = {str(r.get("model")) for r in records}
    for name in (a, b):
        if name not in models:
            raise DataValidationError(f"no records of encoder {name!r}; encoders with records: "
                                      f"{', '.join(sorted(models)) or '(none)'}")
    if a == b:
        raise DataValidationError(f"compare two different encoders, got {a!r} twice")
    wanted = set(settings) if settings else None
    cells_a, cells_b = _by_cell(records, a), _by_cell(records, b)
    out = EncoderComparison(a, b, options.alpha)
    comparisons: dict[CellKey, PairedComparison] = {}
    unreliable: dict[CellKey, str] = {}
    for cell in sorted(set(cells_a) | set(cells_b)):
        if wanted is not None and cell[0] not in wanted:
            continue
        if cell not in cells_a or cell not in cells_b:
            only = a if cell in cells_a else b
            out.not_compared.append({"cell": cell_label(cell), "reason": f"only {only} has a record"})
            continue
        try:
            comparisons[cell] = compare_records(store, cells_a[cell], cells_b[cell], options)
        except RepevalError as exc:  # one cell refused: the others are still compared
            out.not_compared.append({"cell": cell_label(cell), "reason": str(exc)})
            continue
        why = unreliable_reason(cells_a[cell], cells_b[cell])
        if why is not None:
            unreliable[cell] = why
    if wanted is not None and not comparisons and not out.not_compared:
        raise DataValidationError(f"no cell of setting(s) {', '.join(sorted(wanted))}; settings with records: "
                                  f"{', '.join(sorted({c[0] for c in cells_a}))}")
    if comparisons:
        out.verdicts = decide_verdicts(comparisons, options.alpha, unreliable)
        out.settings = summarise_by_setting(out.verdicts)
    return out
