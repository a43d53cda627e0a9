"""Build typed dataclasses from plain dicts (YAML), with errors that name the field path."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Union

from jobs.config.mistakes import Mistakes
from pipeline.errors import ConfigError, InvalidNameError
from pipeline.names import validate_name
from pipeline.terminal import printable, short

_MISSING = dataclasses.MISSING


def check_name(value: str, path: str) -> None:
    """Refuse a name that cannot be part of a store key, as a ConfigError naming the field."""
    try:
        validate_name(value, path)
    except InvalidNameError as exc:
        raise ConfigError(str(exc)) from None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {short(value)} matches none of "
                          f"{' | '.join(_type_name(a) for a in args)}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path}: {short(value)} is not one of {', '.join(map(repr, args))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__} {short(value)}")
        item = args[0] if args else Any
        mistakes, out = Mistakes(), []
        for i, v in enumerate(value):
            with mistakes.collect():
                out.append(_convert(item, v, f"{path}[{i}]"))
        mistakes.raise_any()
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__} {short(value)}")
        vt = args[1] if len(args) == 2 else Any
        mistakes, mapping = Mistakes(), {}
        for k, v in value.items():
            with mistakes.collect():
                mapping[str(k)] = _convert(vt, v, f"{path}.{printable(k)}")
        mistakes.raise_any()
        return mapping
    if dataclasses.is_dataclass(tp):
        return from_plain(tp, value, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {type(value).__name__} {short(value)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected int, got {type(value).__name__} {short(value)}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ConfigError(f"{path}: expected {tp.__name__}, got {type(value).__name__} {short(value)}")
        return value
    raise ConfigError(f"{path}: unsupported field type {_type_name(tp)}")


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """``cls``'s resolved field annotations, once per class (resolving them costs more than
    building a small dataclass: a plan reads back thousands of cells)."""
    return typing.get_type_hints(cls)


def from_plain(cls: type, data: Any, path: str = "config") -> Any:
    """Instantiate dataclass ``cls`` from ``data``, validating every field recursively; every
    mistake found is reported at once (``jobs.config.mistakes.ConfigMistakes``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping for {cls.__name__}, got {type(data).__name__} {short(data)}")
    prepare = getattr(cls, "prepare_plain", None)  # a class may accept shorthands of its fields
    if callable(prepare):
        data = prepare(data, path)
    hints = _field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    mistakes = Mistakes()
    for key in sorted(map(str, set(data) - set(fields))):
        mistakes.add(ConfigError(f"{path}.{printable(key)}: unknown field; valid fields: {', '.join(fields)}"))
    kwargs = {}
    for name, f in fields.items():
        sub = f"{path}.{name}"
        with mistakes.collect():
            if name not in data:
                if f.default is _MISSING and f.default_factory is _MISSING:
                    raise ConfigError(f"{sub}: missing required field")
                continue
            kwargs[name] = _convert(hints[name], data[name], sub)
    mistakes.raise_any()  # the object's own check needs every field converted
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if callable(check):
        check(path)
    return obj
