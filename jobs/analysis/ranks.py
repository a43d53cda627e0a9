"""Do the protocol settings order the encoders alike? Ranks and rank agreement from records."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from pipeline.errors import DataValidationError
from pipeline.plain import to_plain
from pipeline.protocols.registry import headline_value

__all__ = ["RankAgreement", "best_layer_scores", "rank_agreement_of", "rank_rows"]


def _score(record: Mapping[str, Any]) -> float | None:
    value = headline_value(record)
    return value if value is not None and math.isfinite(value) else None


def best_layer_scores(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], tuple[float, str]]:
    """(model, dataset, setting) -> (score, layer) of the model's best layer for the setting."""
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
    """One row per (dataset, setting, model): its score, the layer and its rank."""
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
    """Every pair of settings compared on each dataset."""
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
