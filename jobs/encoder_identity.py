"""Which stored records belong to a config's encoder: found by what it is, not its name.

Two configs sharing one store may each name an encoder ``ra`` for other weights (a seed
0 and a seed 7 model, two checkpoint files). Feature arrays are stored under the name, so
the name's arrays hold whichever config extracted last, and a cell id computed from them
is the other config's record: the wrong number. An encoder's *identity* is a hash of the
config fields that decide its weights and its input (architecture, weights source, the
checkpoint's absolute path, seed, input size, checkpoint key, prefixes stripped), known
from the config alone (no torch, no file read): the same for the config and for the
arrays it extracted (their recorded ``encoder_spec``).

- A cell whose arrays carry the config's identity is found from the arrays, as always.
- A cell whose arrays carry another identity is found from the pointer its identity's
  last evaluation left (``storage_schema.keys.identity_cell_key``), or is not recorded.
- Arrays of an older store without a recorded spec, and ``source: store`` encoders
  (imported features), have no identity: they match by name ("identity unknown").

A record keeps the identity it was evaluated for in ``provenance.encoder_identity``.
``results``, ``compare``, ``report`` and the series all take their records from
``jobs.evaluation.identity.recorded_cells``, which applies this rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import RepevalError
from pipeline.plain import to_plain
from storage_schema import keys
from storage_schema.provenance import canonical_json, now_iso, stable_hash

__all__ = ["IDENTITY_FIELDS", "array_identity", "config_identities", "encoder_identity", "identity_of_spec",
           "name_clash_lines", "pointed_record", "point_identity", "record_identity"]

# what decides an encoder's weights and its input; not its name, layers, dtype or series
IDENTITY_FIELDS = ("arch", "weights", "seed", "input_size", "checkpoint_key", "strip_prefixes")
_WEIGHT_WORDS = ("random", "pretrained")


def identity_of_spec(spec: Mapping[str, Any] | None) -> str | None:
    """The identity of an encoder spec as plain fields (a config's, or an array's recorded
    ``encoder_spec``); None when there is none (imported features, an older store).

    Parameters
    ----------
    spec : mapping, optional
        ``EncoderSpec`` fields; a checkpoint's ``weights`` a path (made absolute here).

    Returns
    -------
    str or None
        16 hexadecimal digits.
    """
    if not spec or not spec.get("arch"):
        return None
    fields = {name: to_plain(spec.get(name)) for name in IDENTITY_FIELDS}
    weights = str(fields["weights"] or "random")
    if weights not in _WEIGHT_WORDS and not weights.startswith("timm:"):  # a checkpoint file
        weights = str(Path(weights).expanduser().resolve())
    fields["weights"] = weights
    fields["strip_prefixes"] = list(fields["strip_prefixes"] or [])
    fields["seed"] = int(fields["seed"] or 0)
    return stable_hash(fields, length=16)


def encoder_identity(encoder: Any) -> str | None:
    """The identity of a config's encoder entry (``EncoderConfig``); None for ``source: store``.

    Parameters
    ----------
    encoder : EncoderConfig

    Returns
    -------
    str or None
    """
    if not getattr(encoder, "extracted", True):
        return None
    return identity_of_spec({name: getattr(encoder, name, None) for name in IDENTITY_FIELDS})


def config_identities(encoders: Iterable[Any]) -> dict[str, str | None]:
    """Encoder name -> identity, for every encoder of a (planned) config."""
    return {e.name: encoder_identity(e) for e in encoders}


def array_identity(attrs: Mapping[str, Any] | None) -> str | None:
    """The identity of the encoder that extracted an array (an alias: its own name's), from
    its attributes' ``encoder_spec``; None when it has none (imported, older store)."""
    return identity_of_spec((attrs or {}).get("encoder_spec"))


def record_identity(record: Mapping[str, Any]) -> str | None:
    """The identity a ledger record was evaluated for; None for a record of an older store."""
    prov = record.get("provenance")
    return prov.get("encoder_identity") if isinstance(prov, Mapping) else None


def point_identity(store: Any, identity: str | None, cell: Any, cid: str) -> None:
    """Remember that the cell of ``identity`` (and these names) uses record ``cid``; a
    listing finds it again once the name's arrays hold another config's weights.

    Parameters
    ----------
    store : FeatureStore
        A writable store.
    identity : str, optional
        The encoder's identity; nothing is written without one.
    cell : Cell
    cid : str
        Its cell id.
    """
    if identity is None:
        return
    key = keys.identity_cell_key(identity, cell.dataset, cell.layer, cell.setting)
    raw = store.backend.read(key)
    if raw is not None and json.loads(raw).get("cell_id") == cid:
        return  # already there: a cached cell writes nothing
    body = {"cell_id": cid, "protocol": cell.protocol, "model": cell.model, "updated": now_iso()}
    store.backend.write_atomic(key, canonical_json(body).encode())


def pointed_record(store: Any, ledger: Any, identity: str | None, cell: Any, config_hash: str) -> str | None:
    """The record the cell of ``identity`` last used, if it is of the cell's current settings.

    Parameters
    ----------
    store : FeatureStore
    ledger : Ledger
    identity : str, optional
        The config's encoder identity (None: no pointer).
    cell : Cell
    config_hash : str
        The hash of the cell's current settings (``jobs.config.protocol_checks.settings_hash``).

    Returns
    -------
    str or None
        The cell id.
    """
    if identity is None:
        return None
    try:
        raw = store.backend.read(keys.identity_cell_key(identity, cell.dataset, cell.layer, cell.setting))
    except RepevalError:  # a name that is no key component: no pointer
        return None
    cid = json.loads(raw).get("cell_id") if raw is not None else None
    rec = ledger.get(cid) if cid and ledger.has(cid) else None
    if rec is None or rec.get("protocol") != cell.protocol or rec.get("config_hash") != config_hash:
        return None
    return cid  # written by a run of this identity: its record (identical weights elsewhere included)


def name_clash_lines(store: Any, cells: Iterable[Any]) -> list[str]:
    """One line per encoder whose name's stored features are another encoder's (another
    config's weights under the same name): this run extracts them again, each config keeps
    its own records, and a distinct name stops the two configs replacing each other's
    features on every run.

    Parameters
    ----------
    store : FeatureStore, optional
        The config's store (None: nothing stored yet).
    cells : iterable of Cell
        The plan's cells (one feature array per encoder is read).

    Returns
    -------
    list of str
    """
    if store is None:
        return []
    lines, seen = [], set()
    for cell in cells:
        if cell.model in seen or cell.identity is None or not cell.entry.reads_features:
            continue
        seen.add(cell.model)
        try:
            st = store.status(keys.feature_key(cell.model, cell.dataset, cell.test_split, cell.layer))
        except RepevalError:
            continue
        held = array_identity(st.attrs) if st is not None else None
        if held is not None and held != cell.identity:
            spec = st.attrs.get("encoder_spec") or {}
            lines.append(f"encoder {cell.model!r}: the store's features of this name were extracted for other "
                         f"weights ({spec.get('arch')}, weights {spec.get('weights')}, seed {spec.get('seed')}), "
                         "another config's encoder of the same name; this run extracts its own again and each "
                         "config keeps its own records; give one of them another name to stop them replacing "
                         "each other's features")
    return lines
