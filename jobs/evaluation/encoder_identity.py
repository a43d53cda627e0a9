"""Which stored records belong to a config's encoder: found by what it is, not its name."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.errors import RepevalError
from pipeline.plain import to_plain
from storage_schema import keys, record_keys
from storage_schema.backend import local_root, portable_path, portable_paths
from storage_schema.provenance import canonical_json, now_iso, stable_hash

__all__ = ["IDENTITY_FIELDS", "array_identity", "belongs", "config_identities", "dataset_identity",
           "encoder_identity", "identity_of_spec", "name_clash_lines", "names_of_several", "note_owner",
           "owner_of", "owners",
           "pointed_record", "point_identity", "record_identity", "unit_identity"]

# what decides an encoder's weights and its input; not its name, layers, dtype or series
IDENTITY_FIELDS = ("arch", "weights", "seed", "input_size", "checkpoint_key", "strip_prefixes")
_WEIGHT_WORDS = ("random", "pretrained")


def identity_of_spec(spec: Mapping[str, Any] | None, base: str | None = None) -> str | None:
    """The identity of an encoder spec as plain fields (a config's, or an array's recorded
    ``encoder_spec``); None when there is none (imported features, an older store)."""
    if not spec or not spec.get("arch"):
        return None
    fields = {name: to_plain(spec.get(name)) for name in IDENTITY_FIELDS}
    weights = str(fields["weights"] or "random")
    if weights not in _WEIGHT_WORDS and not weights.startswith("timm:"):  # a checkpoint file
        weights = portable_path(weights, base)
    fields["weights"] = weights
    fields["strip_prefixes"] = list(fields["strip_prefixes"] or [])
    fields["seed"] = int(fields["seed"] or 0)
    return stable_hash(fields, length=16)


def encoder_identity(encoder: Any, base: str | None = None) -> str | None:
    """The identity of a config's encoder entry (``EncoderConfig``); None for ``source: store``."""
    if not getattr(encoder, "extracted", True):
        return None
    return identity_of_spec({name: getattr(encoder, name, None) for name in IDENTITY_FIELDS}, base)


def dataset_identity(dataset: Any, base: str | None = None) -> str:
    """The identity of a config's dataset entry (``DatasetConfig``): its adapter and
    parameters (paths, made absolute by the config's loading, relative to ``base``), not
    its name or splits."""
    return stable_hash({"adapter": dataset.adapter, "params": portable_paths(to_plain(dataset.params), base)}, length=16)


def unit_identity(encoder: Any, dataset: Any, base: str | None = None) -> str | None:
    """The identity of what an encoder's arrays on a dataset hold (``Cell.identity``);
    None for a ``source: store`` encoder."""
    enc = encoder_identity(encoder, base)
    return None if enc is None else stable_hash([enc, dataset_identity(dataset, base)], length=16)


def config_identities(cfg: Any) -> dict[tuple[str, str], str | None]:
    """(encoder name, dataset name) -> identity, for every pair of a (planned) config."""
    base = local_root(cfg.store)
    return {(e.name, d.name): unit_identity(e, d, base) for e in cfg.encoders for d in cfg.datasets}


def array_identity(attrs: Mapping[str, Any] | None, base: str | None = None) -> str | None:
    """The identity of the encoder that extracted an array (an alias: its own name's), from
    its attributes' ``encoder_spec``; None when it has none (imported, older store)."""
    return identity_of_spec((attrs or {}).get("encoder_spec"), base)


def record_identity(record: Mapping[str, Any]) -> str | None:
    """The identity a ledger record was evaluated for; None for a record of an older store."""
    prov = record.get("provenance")
    return prov.get("config_identity") if isinstance(prov, Mapping) else None


def note_owner(store: Any, identity: str | None, keys_fps: Mapping[str, str]) -> None:
    """Note that ``identity`` extracted (or found up to date) each array at its fingerprint."""
    if identity is None:
        return
    for key, fp in keys_fps.items():
        note = record_keys.array_owner_key(key, identity)
        raw = store.backend.read(note)
        if raw is None or json.loads(raw).get("fingerprint") != fp:
            store.backend.write_atomic(note, canonical_json({"fingerprint": fp, "noted": now_iso()}).encode())


def owners(store: Any, key: str) -> dict[str, str]:
    """Identity -> fingerprint of every note on the array at ``key``."""
    out = {}
    folder = record_keys.array_owners_dir(key)
    for name in store.backend.list(folder):
        if name.endswith(".json"):
            raw = store.backend.read(f"{folder}/{name}")
            if raw is not None:
                out[name.removesuffix(".json")] = str(json.loads(raw).get("fingerprint"))
    return out


def belongs(status: Any, notes: Mapping[str, str], identity: str | None, encoder: str | None,
            base: str | None = None) -> bool:
    """Whether the array of ``status`` holds what ``identity`` extracts."""
    if identity is None:
        return True
    if identity in notes:
        return notes[identity] == status.fingerprint
    if status.fingerprint in notes.values():
        return False  # another config's extraction holds it; this one never extracted it here
    held = array_identity(status.attrs, base)
    return held is None or encoder is None or held == encoder


def owner_of(status: Any, notes: Mapping[str, str]) -> str | None:
    """The identity whose note names the array's current fingerprint (the first, sorted), or None."""
    return next((i for i, fp in sorted(notes.items()) if fp == status.fingerprint), None)


def point_identity(store: Any, identity: str | None, cell: Any, cid: str) -> None:
    """Remember that the cell of ``identity`` (and these names) uses record ``cid``; a
    listing finds it again once the name's arrays hold another config's weights."""
    if identity is None:
        return
    key = record_keys.identity_cell_key(identity, cell.dataset, cell.layer, cell.setting)
    raw = store.backend.read(key)
    if raw is not None and json.loads(raw).get("cell_id") == cid:
        return  # already there: a cached cell writes nothing
    body = {"cell_id": cid, "protocol": cell.protocol, "model": cell.model, "updated": now_iso()}
    store.backend.write_atomic(key, canonical_json(body).encode())


def pointed_record(store: Any, ledger: Any, identity: str | None, cell: Any, config_hash: str) -> str | None:
    """The record the cell of ``identity`` last used, if it is of the cell's current settings."""
    if identity is None:
        return None
    try:
        raw = store.backend.read(record_keys.identity_cell_key(identity, cell.dataset, cell.layer, cell.setting))
    except RepevalError:  # a name that is no key component: no pointer
        return None
    cid = json.loads(raw).get("cell_id") if raw is not None else None
    rec = ledger.get(cid) if cid and ledger.has(cid) else None
    if rec is None or rec.get("protocol") != cell.protocol or rec.get("config_hash") != config_hash:
        return None
    return cid  # written by a run of this identity: its record (identical weights elsewhere included)


def name_clash_lines(store: Any, cells: Iterable[Any]) -> list[str]:
    """One line per (encoder, dataset) whose stored arrays hold another config's weights or
    images under these names: this run extracts its own again, each config keeps its own
    records, and distinct names stop two configs replacing each other's arrays every run."""
    if store is None:
        return []
    lines, seen = [], set()
    for cell in cells:
        if (cell.model, cell.dataset) in seen or cell.identity is None or not cell.entry.reads_features:
            continue
        seen.add((cell.model, cell.dataset))
        try:
            key = keys.feature_key(cell.model, cell.dataset, cell.test_split, cell.layer)
            st = store.status(key)
            if st is None or belongs(st, owners(store, key), cell.identity, cell.encoder_identity):
                continue
        except RepevalError:
            continue
        spec = st.attrs.get("encoder_spec") or {}
        lines.append(f"encoder {cell.model!r} on {cell.dataset!r}: the store's features of these names were "
                     f"extracted for other weights or images ({spec.get('arch')}, weights {spec.get('weights')}, "
                     f"seed {spec.get('seed')}): another config gives these names to other encoders or data; this "
                     "run extracts its own again and each config keeps its own records; give one of them other "
                     "names to stop them replacing each other's features")
    return lines


def names_of_several(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per encoder name whose records in ``records`` were evaluated for more than
    one identity (two configs giving the name to other weights or images): a listing of the
    whole store by names shows whichever was recorded last, and ``--config`` shows one
    config's own."""
    seen: dict[str, set[str]] = {}
    for rec in records:
        ident = record_identity(rec)
        if ident is not None:
            seen.setdefault(str(rec.get("model")), set()).add(ident)
    return [f"encoder {name!r} names the weights or images of {len(ids)} configs in this store: by name alone "
            "the latest record of each cell is shown; give --config to see one config's own"
            for name, ids in sorted(seen.items()) if len(ids) > 1]
