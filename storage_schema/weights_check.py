"""``repeval verify``'s weights check: records whose feature arrays came from different weights."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from storage_schema.provenance import array_weights, record_weights, short_weights, weights_disagreement

__all__ = ["WeightsFinding", "check_record", "verify_weights"]


@dataclass(frozen=True)
class WeightsFinding:
    """One record whose weights disagree (``problem``) or cannot be checked (a warning)."""

    cell_id: str
    label: str
    reason: str
    problem: bool

    def line(self) -> str:
        """One terminal line."""
        head = "mixed weights" if self.problem else "warning   "
        return f"{head} {self.label} (cell {self.cell_id[:12]}): {self.reason}"


def _label(rec: Mapping[str, Any]) -> str:
    return "/".join(str(rec.get(k)) for k in ("model", "dataset", "layer", "setting"))


def check_record(status: Callable[[str], Any], rec: Mapping[str, Any]) -> WeightsFinding | None:
    """The finding of one record (None: its arrays agree, or it reads no stored features);
    ``status`` is the store's ``status`` (an array key -> its ArrayStatus or None)."""
    prov = rec.get("provenance") or {}
    keys = prov.get("feature_keys") if isinstance(prov, Mapping) else None
    if not isinstance(keys, Mapping) or not keys:
        return None  # a cell that reads the encoder's weights, not stored features
    fps = rec.get("fingerprints") or {}
    cid, label = str(rec.get("cell_id")), _label(rec)
    named: dict[str, str | None] = {}
    for split, key in keys.items():
        st = status(str(key))
        if st is None or st.fingerprint != fps.get(f"{split}.features"):
            return None  # replaced (or removed) since the record was made: no longer its evidence
        named[f"{split} features {key}"] = array_weights(st.attrs)
    why = weights_disagreement(named, record_weights(rec))
    if why is not None:
        return WeightsFinding(cid, label, why, True)
    unknown = [what for what, fp in named.items() if not fp]
    if unknown and record_weights(rec):
        return WeightsFinding(cid, label, f"weights unknown for {', '.join(unknown)} (the record says "
                                          f"{short_weights(record_weights(rec))}); not checked", False)
    return None


def verify_weights(store: Any, records: Iterable[Mapping[str, Any]]) -> tuple[int, list[WeightsFinding]]:
    """(records checked, findings) over ``records`` (a store's ledger)."""
    checked, findings = 0, []
    seen: dict[str, Any] = {}

    def status(key: str):  # many records read one array: its metadata read once
        if key not in seen:
            seen[key] = store.status(key)
        return seen[key]

    for rec in records:
        checked += 1
        finding = check_record(status, rec)
        if finding is not None:
            findings.append(finding)
    return checked, findings
