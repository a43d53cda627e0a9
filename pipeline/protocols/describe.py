"""The settings of a registered protocol as rows and text: default, valid values, flags."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.protocols.inputs.devices import DEVICE_CHOICES
from pipeline.protocols.registry import Bound, Protocol, get_protocol, list_protocols

__all__ = ["WEIGHTS_HEADING", "SettingRow", "format_number", "protocol_listing", "protocol_record", "protocol_summary",
           "range_text", "setting_rows"]

#: The heading of the protocols that read an encoder's weights in a listing.
WEIGHTS_HEADING = ("Encoder protocols (they read an encoder's weights and a dataset's images, not stored "
                   "features):")


@dataclass(frozen=True)
class SettingRow:
    """One setting of a protocol."""

    name: str
    default: Any
    valid: str


def format_number(value: float) -> str:
    """A bound or default as a person writes it: ``4294967295``, ``0.07``, ``1e-06``."""
    if float(value).is_integer() and abs(value) < 1e16:
        return str(int(value))
    return f"{value:g}"


def _bound_text(bound: Bound) -> str:
    parts = []
    if bound.low is not None:
        parts.append(f"{'>' if bound.low_open else '>='} {format_number(bound.low)}")
    if bound.high is not None:
        parts.append(f"{'<' if bound.high_open else '<='} {format_number(bound.high)}")
    return " and ".join(parts)


def _kind(default: Any) -> str:
    if isinstance(default, bool):
        return "true, false"
    if isinstance(default, int):
        return "integer"
    if isinstance(default, float):
        return "number"
    if default == "default":  # a grid setting: the built-in grid, a list, or null for one value
        return "default, a list of numbers, or null"
    if isinstance(default, (list, tuple)):
        return "a list"
    return "text"


def range_text(protocol: Protocol, setting: str) -> str:
    """The valid values of one setting, in words."""
    if setting in protocol.choices:
        return ", ".join(str(c) for c in protocol.choices[setting])
    if setting == "device":  # checked by the protocols' rule, the same everywhere
        return ", ".join(DEVICE_CHOICES)
    kind = _kind(protocol.defaults[setting])
    if setting in protocol.bounds:
        prefix = "integer " if kind == "integer" else ""
        return prefix + _bound_text(protocol.bounds[setting])
    return kind


def setting_rows(name: str) -> list[SettingRow]:
    """Every setting of protocol ``name``, in its registered order."""
    protocol = get_protocol(name)
    return [SettingRow(k, v, range_text(protocol, k)) for k, v in protocol.defaults.items()]


def _default_text(value: Any, inside: bool = False) -> str:
    if isinstance(value, (list, tuple)):  # numbers as written (np.logspace's 1e-5 is 9.999999999999999e-06)
        return "[" + ", ".join(_default_text(v, inside=True) for v in value) + "]"
    if isinstance(value, bool) or value is None or (inside and isinstance(value, str)):
        return json.dumps(value)
    return format_number(value) if isinstance(value, (int, float)) else str(value)


def _flags(protocol: Protocol) -> str:
    yes = {True: "yes", False: "no"}
    reads = {"pooled": "pooled features", "tokens": "token features (block<i>.tokens)",
             "map": f"spatial maps (block<i>.map) and {protocol.dense} targets",
             "weights": "an encoder's weights and a dataset's images"}[protocol.reads]
    return (f"streams train: {yes[protocol.streams_train]}; multi-label: {yes[protocol.multilabel]}; "
            f"reads: {reads}; metrics: {', '.join(protocol.metrics)} (primary: {protocol.primary_metric})")


def protocol_summary(name: str) -> str:
    """One protocol in full: description, flags and a table of its settings (with their
    valid values, unless a settings class checks them)."""
    protocol = get_protocol(name)
    head = [f"{protocol.name} (version {protocol.version}): {protocol.description}", _flags(protocol)]
    if protocol.ignored:
        head.append(f"  not part of a result's identity: {', '.join(protocol.ignored)}")
    if protocol.build is not None:  # its settings class checks the values: defaults only
        rows = [("setting", "default")] + [(k, _default_text(v)) for k, v in protocol.defaults.items()]
        width = max(len(a) for a, _ in rows)
        return "\n".join(head + [""] + [f"  {a:<{width}}  {b}" for a, b in rows])
    rows = [("setting", "default", "valid values")] + [
        (r.name, _default_text(r.default), r.valid) for r in setting_rows(name)]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(head + [""] + [f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows])


def _block(name: str) -> str:
    protocol = get_protocol(name)
    settings = ", ".join(f"{k}={_default_text(v)}" for k, v in protocol.defaults.items())
    return f"{name} (version {protocol.version}): {protocol.description}\n  {_flags(protocol)}\n  settings: {settings}"


def protocol_listing(names: Sequence[str] | None = None) -> str:
    """Every registered protocol (or ``names``): description, flags, settings with defaults;
    those that read stored features first, then those that read an encoder's weights."""
    names = list(names) if names is not None else list_protocols()
    features = [n for n in names if get_protocol(n).reads_features]
    weights = [n for n in names if not get_protocol(n).reads_features]
    text = "\n".join(_block(n) for n in features)
    if weights:
        text += ("\n\n" if text else "") + WEIGHTS_HEADING + "\n" + "\n".join(_block(n) for n in weights)
    return text + "\n\nrepeval protocols NAME shows one protocol's settings with their valid values"


def protocol_record(name: str) -> dict[str, Any]:
    """One protocol as JSON-able data (``repeval protocols --json``)."""
    protocol = get_protocol(name)
    if protocol.build is not None:
        settings = [{"name": k, "default": v} for k, v in protocol.defaults.items()]
    else:
        settings = [{"name": r.name, "default": r.default, "valid": r.valid} for r in setting_rows(name)]
    return {"name": name, "version": protocol.version, "description": protocol.description,
            "streams_train": protocol.streams_train, "multilabel": protocol.multilabel,
            "reads": protocol.reads, "dense": protocol.dense,
            "metrics": list(protocol.metrics), "primary_metric": protocol.primary_metric,
            "unbounded": list(protocol.unbounded), "lower_is_better": list(protocol.lower_is_better),
            "ignored": list(protocol.ignored), "settings": settings}
