"""Provenance attributes of feature arrays and the fingerprint that identifies them."""

from __future__ import annotations

import hashlib
import json
import platform
from datetime import datetime, timezone
from importlib import metadata
from collections.abc import Mapping
from typing import Any

# Bump when the way features are computed changes (pooling, layer naming...): every
# stored array then counts as stale and is re-extracted.
FEATURE_CODE_VERSION = 1

_LIBRARIES = ("repeval", "torch", "torchvision", "timm", "numpy", "zarr")


def library_versions() -> dict[str, str]:
    """Versions of Python and of the libraries that shape the features.

    Returns
    -------
    dict
        Library -> version (``not installed`` when absent).
    """
    out = {"python": platform.python_version()}
    for lib in _LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = "not installed"
    return out


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no spaces: equal objects give equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def stable_hash(obj: Any, length: int = 32) -> str:
    """SHA-256 of the canonical JSON of ``obj``, as hexadecimal.

    Parameters
    ----------
    obj : object
        A JSON-able object.
    length : int
        Hexadecimal digits kept.

    Returns
    -------
    str
        The hash prefix.
    """
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def array_fingerprint(
    *, weights_fingerprint: str, data_config: dict, layer: str, pooling: str,
    dataset_fingerprint: str, split: str, dtype: str, arch: str, compute_precision: str = "float32",
    decode: str = "pil",
) -> str:
    """What the features depend on. Anything else (time, host, file names) is left out so
    that identical weights under another file name reuse the features.

    Parameters
    ----------
    weights_fingerprint : str
        The encoder's weights fingerprint.
    data_config : dict
        The resolved preprocessing.
    layer, pooling : str
        The layer and how it is pooled.
    dataset_fingerprint : str
        The split's fingerprint.
    split : str
        The split's name.
    dtype : str
        The stored dtype.
    arch : str
        The architecture.
    compute_precision : str
        ``float32``, ``float16-autocast`` or ``bfloat16-autocast``, with
        ``+channels_last`` when that memory format was used.
    decode : str
        Where images were decoded and resized: ``pil`` (the default, left out of the
        hash so that earlier fingerprints stand) or ``device`` (torchvision on tensors).

    Returns
    -------
    str
        The array fingerprint (32 hexadecimal digits).
    """
    fields = {
        "code": FEATURE_CODE_VERSION, "weights": weights_fingerprint, "arch": arch,
        "data_config": data_config, "layer": layer, "pooling": pooling,
        "dataset": dataset_fingerprint, "split": split, "dtype": dtype,
        "precision": compute_precision,  # float16 autocast features differ from float32 ones
    }
    if decode != "pil":  # tensor resizing rounds differently from PIL's
        fields["decode"] = decode
    return stable_hash(fields)


def now_iso() -> str:
    """The current UTC time, ISO 8601 to the microsecond."""
    # Records are ordered by it (the latest record of a cell is the one in use): two records of
    # one cell written within a second must still sort in the order they were made.
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def weights_summary(record: Mapping[str, Any]) -> str:
    """One line saying what was done to a checkpoint's tensors, from the features' provenance
    (``encoder.weights``, written by :meth:`pipeline.encoders.checkpoints.fitting.CheckpointFit.record`)."""
    parts = []
    if record.get("checkpoint_key"):
        how = "checkpoint_key" if record.get("checkpoint_key_from") == "config" else "found"
        parts.append(f"under {record['checkpoint_key']!r} ({how})")
    if record.get("prefix_stripped"):
        parts.append(f"prefix {record['prefix_stripped']!r} stripped")
    dropped = record.get("dropped") or {}
    if dropped.get("count"):
        groups = ", ".join(f"{g} {n}" for g, n in list((dropped.get("groups") or {}).items())[:6])
        parts.append(f"{dropped['count']} tensors dropped ({groups})")
    resampled = [f"{r['tensor']} {tuple(r['from'])} -> {tuple(r['to'])}" for r in record.get("resampled") or []]
    if resampled:
        parts.append(f"resampled {', '.join(resampled)} by {record.get('converted_by')}")
    elif record.get("converted_by"):
        parts.append(f"converted by {record['converted_by']}")
    return "; ".join(parts)


# -- which weights a feature array came from ----------------------------------------------
# Every feature array records the fingerprint of the tensors its extraction actually loaded
# (pipeline.encoders.checkpoints.reading.weights_fingerprint of the built model), so a cell
# can refuse arrays of different weights: a checkpoint rewritten between the train and the
# test split's extraction must not give one record.
WEIGHTS_FIELD = "weights_fingerprint"
UNKNOWN_WEIGHTS = "unknown"
SHORT_WEIGHTS = 12  # hexadecimal digits shown by `repeval ls`, the report and messages


def array_weights(attrs: Mapping[str, Any]) -> str | None:
    """The weights fingerprint a feature array came from, from its attributes."""
    # The array's own ``weights_fingerprint`` attribute; an array written before that
    # attribute existed falls back to its encoder provenance's (computed from the same
    # loaded model); None when neither is there (imported features: unknown).
    own = attrs.get(WEIGHTS_FIELD)
    if own:
        return str(own)
    enc = attrs.get("encoder")
    fallback = enc.get(WEIGHTS_FIELD) if isinstance(enc, Mapping) else None
    return str(fallback) if fallback else None


def record_weights(record: Mapping[str, Any]) -> str | None:
    """The weights fingerprint a ledger record says its cell was computed from (None: not said)."""
    prov = record.get("provenance")
    fp = prov.get(WEIGHTS_FIELD) if isinstance(prov, Mapping) else None
    return str(fp) if fp else None


def short_weights(fingerprint: str | None) -> str:
    """A weights fingerprint as shown to people: its first 12 hexadecimal digits, or ``unknown``."""
    return str(fingerprint)[:SHORT_WEIGHTS] if fingerprint else UNKNOWN_WEIGHTS


def weights_disagreement(arrays: Mapping[str, str | None], record: str | None = None) -> str | None:
    """One line saying how the weights of a cell's arrays (and its record) disagree, or None."""
    # An unknown fingerprint (None) disagrees with nothing: old and imported arrays stay usable.
    known = [(what, fp) for what, fp in arrays.items() if fp]
    if known:
        first_what, first = known[0]
        for what, fp in known[1:]:
            if fp != first:
                return (f"{first_what} come from weights {short_weights(first)}, {what} from weights "
                        f"{short_weights(fp)}")
        if record and record != first:
            return f"the record says weights {short_weights(record)}, its {first_what} come from {short_weights(first)}"
    return None
