"""Do the protocol settings order the encoders alike? Ranks and rank agreement from records.

For each dataset and protocol setting the encoders are ranked by their ``score`` (1 is
the best, ties share the average rank). An encoder's score under a setting is that of its
best layer for the setting (as the report's best-layer table), so a setting that reads
token layers is compared with the others. Every pair of settings of a dataset is then
compared by Kendall's tau-b and Spearman's rho with bootstrap intervals over encoders and
the number of encoder pairs whose order flips (``pipeline.analysis.rank_agreement``); a pair that
cannot be compared (fewer than three shared encoders, a setting giving every encoder the
same score) is listed with the reason, not dropped.

Used by ``repeval results --ranks`` and the report's rank-agreement section.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from pipeline.errors import DataValidationError
from pipeline.plain import to_plain

__all__ = ["RankAgreement", "best_layer_scores", "rank_agreement_of", "rank_rows"]


def _score(record: Mapping[str, Any]) -> float | None:
    value = (record.get("metrics") or {}).get("score")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def best_layer_scores(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], tuple[float, str]]:
    """(model, dataset, setting) -> (score, layer) of the model's best layer for the setting.

    Parameters
    ----------
    records : iterable of mapping
        Ledger records (``model``, ``dataset``, ``setting``, ``layer``, ``metrics.score``);
        records without a finite score (e.g. the invariance audit) are left out.

    Returns
    -------
    dict
    """
    best: dict[tuple[str, str, str], tuple[float, str]] = {}
    for r in records:
        score = _score(r)
        if score is None:
            continue
        key = (str(r.get("model")), str(r.get("dataset")), str(r.get("setting")))
        if key not in best or score > best[key][0]:
            best[key] = (score, str(r.get("layer")))
    return best


def rank_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, setting, model): its score, the layer and its rank.

    Parameters
    ----------
    records : iterable of mapping
        Ledger records.

    Returns
    -------
    list of dict
        Keys dataset, setting, model, layer, score, rank; grouped by dataset and setting
        in first-seen order, best rank first.
    """
    # deferred: scipy, only when ranks are computed (the CLI imports this module at its start)
    from pipeline.analysis.rank_agreement import rank_table

    best = best_layer_scores(records)
    if not best:
        return []
    ranks = rank_table({k: v[0] for k, v in best.items()})
    rows = []
    for (dataset, setting), by_model in ranks.items():
        for model, rank in sorted(by_model.items(), key=lambda kv: (kv[1], kv[0])):
            score, layer = best[(model, dataset, setting)]
            rows.append({"dataset": dataset, "setting": setting, "model": model, "layer": layer, "score": score,
                         "rank": rank})
    return rows


@dataclass
class RankAgreement:
    """Per dataset: the settings, each pair's agreement (``to_plain`` of its ``PairAgreement``), the
    pairs not compared with why, and each model's rank per setting (for radar charts)."""

    dataset: str
    settings: list[str]
    pairs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (setting a, setting b, reason)
    ranks: dict[str, dict[str, float]] = field(default_factory=dict)  # setting -> model -> rank


def rank_agreement_of(records: Sequence[Mapping[str, Any]], n_bootstrap: int = 1000,
                      seed: int = 0) -> list[RankAgreement]:
    """Every pair of settings compared on each dataset.

    Parameters
    ----------
    records : sequence of mapping
        Ledger records.
    n_bootstrap : int
        Bootstrap resamples of the encoders (0: no intervals).
    seed : int
        Seed of the resampling.

    Returns
    -------
    list of RankAgreement
        One per dataset, in first-seen order.
    """
    # deferred: scipy, as in rank_rows
    from pipeline.analysis.rank_agreement import encoder_ranks, pair_agreement

    table: dict[str, dict[str, dict[str, float]]] = {}
    for (model, dataset, setting), (score, _) in best_layer_scores(records).items():
        table.setdefault(dataset, {}).setdefault(setting, {})[model] = score
    out = []
    for dataset, by_setting in table.items():
        agreement = RankAgreement(dataset, list(by_setting),
                                  ranks={s: encoder_ranks(v) for s, v in by_setting.items()})
        for a, b in combinations(by_setting, 2):
            try:
                pair = pair_agreement(by_setting[a], by_setting[b], n_bootstrap, seed, labels=(dataset, a, b))
            except DataValidationError as exc:
                agreement.skipped.append((a, b, str(exc)))
                continue
            agreement.pairs.append(to_plain(pair))
        out.append(agreement)
    return out
