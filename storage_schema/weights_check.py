"""``repeval verify``'s weights check: records whose feature arrays came from different weights.

A record of a feature cell names the arrays it read (``provenance.feature_keys``) and their
fingerprints then (``fingerprints``); each array records the weights fingerprint it came
from (``storage_schema.provenance.array_weights``). A record whose arrays (still the ones it
read) disagree with each other or with the record's own ``provenance.weights_fingerprint``
was computed from mixed weights: a problem. An array whose weights are unknown (written
before arrays recorded them, or imported) is a warning, not a problem. An array replaced
since the record was made (re-extracted) is not that record's evidence any more: skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from storage_schema.provenance import array_weights, record_weights, short_weights, weights_disagreement

__all__ = ["WeightsFinding", "check_record", "verify_weights"]


@dataclass(frozen=True)
class WeightsFinding:
    """One record whose weights disagree (``problem``) or cannot be checked (a warning).

    Parameters
    ----------
    cell_id : str
        The record's cell id.
    label : str
        ``model/dataset/layer/setting``.
    reason : str
        What disagrees, naming the arrays and their weights (short form).
    problem : bool
        True: mixed weights (verify fails); False: a warning (weights unknown).
    """

    cell_id: str
    label: str
    reason: str
    problem: bool

    def line(self) -> str:
        """One terminal line.

        Returns
        -------
        str
            E.g. ``mixed weights m/d/l/s (cell 05376e542abc): ...``.
        """
        head = "mixed weights" if self.problem else "warning   "
        return f"{head} {self.label} (cell {self.cell_id[:12]}): {self.reason}"


def _label(rec: Mapping[str, Any]) -> str:
    return "/".join(str(rec.get(k)) for k in ("model", "dataset", "layer", "setting"))


def check_record(status: Callable[[str], Any], rec: Mapping[str, Any]) -> WeightsFinding | None:
    """The finding of one record (None: its arrays agree, or it reads no stored features);
    ``status`` is the store's ``status`` (an array key -> its ArrayStatus or None).

    Parameters
    ----------
    status : callable
        An array key -> its ArrayStatus, or None.
    rec : mapping
        A ledger record.

    Returns
    -------
    WeightsFinding or None
    """
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
    """(records checked, findings) over ``records`` (a store's ledger).

    Parameters
    ----------
    store : FeatureStore
        The store holding the arrays.
    records : iterable of mapping
        Ledger records.

    Returns
    -------
    (int, list of WeightsFinding)
    """
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
