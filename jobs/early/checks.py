"""Each early estimate against the exact figure that followed, and whether intervals hold."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from jobs.analysis.compare import record_score
from jobs.early.results import early_result
from jobs.early.subsets import Subset
from jobs.evaluation.cell import Cell
from pipeline.errors import RepevalError
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords
from storage_schema.provenance import WEIGHTS_FIELD, now_iso

__all__ = ["check_estimates"]

log = logging.getLogger(__name__)


def _exact_for(est: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    found = None
    for rec in records:
        if (rec.get("model"), rec.get("dataset"), rec.get("layer"), rec.get("protocol"), rec.get("config_hash"),
                str(rec.get("protocol_version"))) != (est["model"], est["dataset"], est["layer"], est["protocol"],
                                                     est["config_hash"], str(est["protocol_version"])):
            continue
        weights = (rec.get("provenance") or {}).get(WEIGHTS_FIELD)
        if est.get(WEIGHTS_FIELD) and weights and weights != est[WEIGHTS_FIELD]:
            continue  # the name's later weights: not what the estimate was of
        if record_score(rec) is not None and (found is None or str(rec.get("recorded")) > str(found.get("recorded"))):
            found = rec
    return found


def _cell_of(rec: Mapping[str, Any]) -> Cell:
    splits = list(rec.get("splits") or ["train", "test"])
    return Cell(model=rec["model"], dataset=rec["dataset"], layer=rec["layer"], setting=rec["setting"],
                protocol=rec["protocol"], settings=dict(rec.get("settings") or {}), train_split=splits[0],
                test_split=splits[-1], val_split=splits[1] if len(splits) == 3 else None)


def check_estimates(store: FeatureStore, records: list[Mapping[str, Any]],
                    estimates: Iterable[Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Check every estimate (or those given) whose exact figure now exists; record the checks."""
    early = EarlyRecords(store)
    todo = list(early.iter("estimates")) if estimates is None else list(estimates)
    out = []
    for est in todo:
        if est.get("status") != "estimated" or early.get("checks", est["id"]) is not None:
            continue
        exact = _exact_for(est, records)
        if exact is None:
            continue
        value, target = record_score(exact), record_score(exact)
        e = est["estimate"]
        if e["method"] == "sampling":  # its interval is of the early fit over the whole test split
            subset_rec = early.get("subsets", est["subset"], est["dataset"])
            try:
                if subset_rec is None:
                    raise RepevalError(f"subset {est['subset'][:12]} is not on record")
                target = early_result(store, _cell_of(exact), Subset.from_record(subset_rec), "store")[
                    "full_split_score"]
            except (RepevalError, ValueError, OSError) as exc:
                log.info("estimate %s of %s not checked: %s", est["id"][:12], est["model"], exc)
                continue
            if target is None:
                continue
        check = {"id": est["id"], "model": est["model"], "dataset": est["dataset"], "layer": est["layer"],
                 "setting": est["setting"], "protocol": est["protocol"], "config_hash": est["config_hash"],
                 "method": e["method"], "level": e["level"], "estimate": e["value"], "low": e["low"],
                 "high": e["high"], "exact": value, "target": target, "error": e["value"] - value,
                 "covered": bool(e["low"] is not None and e["low"] <= target <= e["high"]),
                 "exact_cell": exact.get("cell_id"), "checked": now_iso()}
        if not store.read_only:
            early.put("checks", check)
        out.append(check)
    return out
