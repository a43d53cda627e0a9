"""What a reader needs first: a leaderboard, and what changed since the previous run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pipeline.errors import DataValidationError

__all__ = ["MISSING_POLICIES", "LeaderboardRow", "RunChanges", "diff_summaries", "leaderboard"]

MISSING_POLICIES = ("exclude", "last")
CELL_STATUSES = ("ok", "failed")


@dataclass(frozen=True)
class LeaderboardRow:
    """One model's line: mean rank (None when left out), rank and score per setting."""

    model: str
    mean_rank: float | None
    ranks: dict[str, float]
    scores: dict[str, float]
    missing: tuple[str, ...]


def _finite(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
        raise DataValidationError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def leaderboard(
    table: Mapping[str, Mapping[str, float]],
    higher_is_better: bool | Mapping[str, bool] = True,
    missing: str = "exclude",
) -> list[LeaderboardRow]:
    """Mean rank over settings, with each setting's score."""
    from scipy.stats import rankdata  # here: the report and CLI modules import this one cheaply

    if missing not in MISSING_POLICIES:
        raise DataValidationError(f"Unknown missing policy {missing!r}; valid choices: {', '.join(MISSING_POLICIES)}")
    if not table:
        raise DataValidationError("the leaderboard table is empty: no model has a score")
    scores: dict[str, dict[str, float]] = {}
    for model, row in table.items():
        if not isinstance(model, str) or not isinstance(row, Mapping):
            raise DataValidationError(f"table must map model names to {{setting: score}}, got {model!r}: {row!r}")
        scores[model] = {str(s): _finite(v, f"score of {model!r} in setting {s!r}") for s, v in row.items()}
    settings = sorted({s for row in scores.values() for s in row})
    if not settings:
        raise DataValidationError(f"the leaderboard table has no setting: every model's row is empty ({sorted(scores)[:10]})")
    if isinstance(higher_is_better, Mapping):
        unknown = sorted(set(higher_is_better) - set(settings))
        if unknown:
            raise DataValidationError(f"higher_is_better names unknown setting(s) {unknown}; settings: {settings}")
        direction = {s: bool(higher_is_better.get(s, True)) for s in settings}
    else:
        direction = dict.fromkeys(settings, bool(higher_is_better))
    lacking = {m: tuple(s for s in settings if s not in row) for m, row in scores.items()}
    ranked = [m for m in scores if missing == "last" or not lacking[m]]

    ranks: dict[str, dict[str, float]] = {m: {} for m in ranked}
    for setting in settings:
        present = [m for m in ranked if setting in scores[m]]
        values = np.array([scores[m][setting] for m in present])
        order_by = -values if direction[setting] else values
        for model, rank in zip(present, rankdata(order_by, method="average") if present else []):
            ranks[model][setting] = float(rank)
        absent = [m for m in ranked if setting not in scores[m]]
        bottom = (len(present) + 1 + len(ranked)) / 2.0  # average of the ranks left over
        for model in absent:
            ranks[model][setting] = bottom

    rows = [
        LeaderboardRow(m, float(np.mean(list(ranks[m].values()))), ranks[m], scores[m], lacking[m])
        for m in ranked
    ]
    rows.sort(key=lambda r: (r.mean_rank, r.model))
    left_out = [LeaderboardRow(m, None, {}, scores[m], lacking[m]) for m in sorted(set(scores) - set(ranked))]
    return rows + left_out


@dataclass(frozen=True)
class RunChanges:
    """What changed between two run summaries (see the module docstring for their form)."""
    # ``new_cells`` are cells no encoder had before (the configuration grew);
    # ``changed_scores`` same encoder, same cell, a score that moved by more than the
    # tolerance; ``regressions`` regressions not reported by the previous run; ``failures``
    # every failed cell now, each with ``new`` saying whether it failed before;
    # ``recovered`` cells that failed before and succeed now.

    new_encoders: list[str]
    removed_encoders: list[str]
    new_cells: list[str]
    changed_scores: list[dict[str, object]]
    regressions: list[dict[str, object]]
    failures: list[dict[str, object]]
    recovered: list[dict[str, object]]

    @property
    def nothing_changed(self) -> bool:
        """True when no field lists anything (old failures still count as failures)."""
        return not any(getattr(self, f) for f in self.__dataclass_fields__)


def _cells(summary: Mapping[str, object] | None, name: str) -> dict[str, dict[str, dict[str, object]]]:
    """``{encoder: {cell: entry}}`` of a summary, checked, or {} for None."""
    if summary is None:
        return {}
    if not isinstance(summary, Mapping) or not isinstance(summary.get("encoders"), Mapping):
        raise DataValidationError(f"{name} must be a dict with an 'encoders' dict, got {type(summary).__name__}")
    out = {}
    for encoder, entry in summary["encoders"].items():
        path = f"{name}['encoders'][{encoder!r}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("cells", {}), Mapping):
            raise DataValidationError(f"{path} must be a dict with a 'cells' dict")
        cells = {}
        for cell, result in entry.get("cells", {}).items():
            where = f"{path}['cells'][{cell!r}]"
            status = result.get("status") if isinstance(result, Mapping) else None
            if status not in CELL_STATUSES:
                raise DataValidationError(f"{where}['status'] must be one of {', '.join(CELL_STATUSES)}, got {status!r}")
            if status == "ok":
                _finite(result.get("score"), f"{where}['score']")
            cells[str(cell)] = dict(result)
        out[str(encoder)] = cells
    return out


def _weights(summary: Mapping[str, object] | None, encoder: str) -> str | None:
    """The weights fingerprint a summary gives ``encoder``'s scores (None: not said)."""
    entry = (summary or {}).get("encoders", {}).get(encoder)
    weights = entry.get("weights") if isinstance(entry, Mapping) else None
    return weights if isinstance(weights, str) and weights else None


def _regressions(summary: Mapping[str, object] | None, name: str) -> list[dict[str, object]]:
    entries = [] if summary is None else summary.get("regressions", [])
    if not isinstance(entries, list):
        raise DataValidationError(f"{name}['regressions'] must be a list, got {type(entries).__name__}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not all(isinstance(entry.get(k), str) for k in ("encoder", "cell", "against")):
            raise DataValidationError(f"{name}['regressions'][{i}] must be a dict with string 'encoder', 'cell' and 'against'")
    return [dict(e) for e in entries]


def diff_summaries(
    previous: Mapping[str, object] | None, current: Mapping[str, object], tolerance: float = 0.0
) -> RunChanges:
    """What changed since the previous run: encoders, cells, scores, regressions, failures."""
    tolerance = _finite(tolerance, "tolerance")
    if tolerance < 0:
        raise DataValidationError(f"tolerance must be >= 0, got {tolerance!r}")
    before, now = _cells(previous, "previous"), _cells(current, "current")
    # an encoder whose weights differ from the previous summary's (a file rewritten in place, a
    # training script's moving alias) is new weights under an old name: new, never a "change"
    rewritten = {e for e in set(before) & set(now)
                 if None not in (_weights(previous, e), _weights(current, e))
                 and _weights(previous, e) != _weights(current, e)}
    seen_cells = {c for cells in before.values() for c in cells}
    before = {e: cells for e, cells in before.items() if e not in rewritten}
    new_cells = sorted({c for cells in now.values() for c in cells} - seen_cells)

    changed, failures, recovered = [], [], []
    for encoder in sorted(now):
        for cell in sorted(now[encoder]):
            result, old = now[encoder][cell], before.get(encoder, {}).get(cell)
            if result["status"] == "failed":
                failures.append({"encoder": encoder, "cell": cell, "error": result.get("error", ""),
                                 "new": old is None or old["status"] != "failed"})
            elif old is not None and old["status"] == "failed":
                recovered.append({"encoder": encoder, "cell": cell, "score": result["score"]})
            elif old is not None and abs(result["score"] - old["score"]) > tolerance:
                changed.append({"encoder": encoder, "cell": cell, "previous": old["score"],
                                "current": result["score"], "change": result["score"] - old["score"]})

    def key(entry: Mapping[str, object]) -> tuple[str, str, str]:
        return entry["encoder"], entry["cell"], entry["against"]

    reported = {key(e) for e in _regressions(previous, "previous")}
    regressions = sorted((e for e in _regressions(current, "current") if key(e) not in reported), key=key)
    return RunChanges(
        new_encoders=sorted(set(now) - set(before)),
        removed_encoders=sorted(set(before) - set(now)),
        new_cells=new_cells,
        changed_scores=changed,
        regressions=regressions,
        failures=failures,
        recovered=recovered,
    )
