"""How a registered protocol's settings are checked, completed and keyed."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pipeline.errors import ConfigError
from pipeline.plain import to_plain

__all__ = ["resolve", "result_settings", "setting_at"]


def _type_ok(default: Any, value: Any) -> bool:
    if default is None:
        return True  # None defaults accept any type the protocol then validates
    if value is None:
        return default == "default"  # a grid setting: None means no grid, the single value
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):  # counts, seeds, iterations: 5.0 or 2.5 would fail deep inside numpy
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if default == "default":  # a grid (ridge alphas, logistic Cs): the built-in one or a list of numbers
        return value == "default" or (isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple)) or (isinstance(value, str) and value == "default")
    return isinstance(value, type(default)) or (isinstance(default, str) and isinstance(value, (list, tuple)))


def resolve(protocol: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The protocol's defaults overlaid with ``settings``; unknown names and bad values fail."""
    name = protocol.name
    if not isinstance(settings, Mapping):
        raise ConfigError(f"settings of protocol {name!r} must be a mapping, got {settings!r}")
    unknown = sorted(set(settings) - set(protocol.defaults))
    if unknown:
        raise ConfigError(f"settings.{unknown[0]}: unknown setting of protocol {name!r}; "
                          f"valid settings: {', '.join(protocol.defaults)}")
    if protocol.build is not None:
        return _built(protocol, settings)
    full = {**protocol.defaults, **settings}
    for key, value in settings.items():
        if not _type_ok(protocol.defaults[key], value):
            raise ConfigError(f"settings.{key}: {value!r} has the wrong type for protocol {name!r} "
                              f"(default {protocol.defaults[key]!r})")
        if key in protocol.choices and value not in protocol.choices[key]:
            raise ConfigError(f"settings.{key}: {value!r} is not one of "
                              f"{', '.join(map(repr, protocol.choices[key]))} (protocol {name!r})")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"settings.{key}: {value!r} is not a finite number (protocol {name!r})")
        if number and key in protocol.bounds and not protocol.bounds[key].contains(value):
            raise ConfigError(f"settings.{key}: {value!r} is out of range; must be {protocol.bounds[key]} "
                              f"(protocol {name!r})")
    if protocol.check is not None:
        try:
            protocol.check(full)
        except ConfigError as exc:
            raise ConfigError(f"settings: {exc} (protocol {name!r})") from None
    return full


def _built(protocol: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings checked by the entry's settings class (``build``), as plain values."""
    try:
        built = protocol.build(settings)
    except ConfigError as exc:
        raise ConfigError(f"settings: {exc}{_yaml_hint(settings)}") from None
    except TypeError as exc:  # a value of a type the settings class cannot take
        raise ConfigError(f"settings of protocol {protocol.name!r}: {exc}") from None
    return to_plain({**protocol.defaults, **built})


def _yaml_hint(settings: Mapping[str, Any]) -> str:
    """YAML 1.1 reads ``1e-4`` as text; say so when a text value would be a number."""
    def numeric_text(v: Any) -> bool:
        if isinstance(v, (list, tuple)):
            return any(numeric_text(x) for x in v)
        if not isinstance(v, str):
            return False
        try:
            float(v)
        except ValueError:
            return False
        return True

    bad = [k for k, v in settings.items() if numeric_text(v)]
    return (f" (settings.{bad[0]} holds text that looks like a number: YAML reads 1e-4 as text, write 1.0e-4)"
            if bad else "")


def setting_at(settings: Mapping[str, Any], path: str) -> Any:
    """The value of a dotted setting (``perceptual.weights``), or None where it is absent."""
    value: Any = settings
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def result_settings(protocol: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved ``settings`` without those that cannot change a result (see the module doc)."""
    added = protocol.added_settings
    out = {k: v for k, v in settings.items()
           if k not in protocol.ignored and not (k in added and v == added[k])}
    for path in protocol.files:  # the file's contents count (its fingerprint), not where it lies
        head, _, leaf = path.rpartition(".")
        parent = setting_at(out, head) if head else out
        if isinstance(parent, Mapping) and leaf in parent:
            _drop(out, head.split(".") if head else [], leaf)
    return out


def _drop(settings: dict[str, Any], parents: list[str], leaf: str) -> None:
    """Remove ``leaf`` under the nested ``parents`` of ``settings``, copying what it changes."""
    if not parents:
        settings.pop(leaf, None)
        return
    child = dict(settings[parents[0]])
    _drop(child, parents[1:], leaf)
    settings[parents[0]] = child
