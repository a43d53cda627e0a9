"""Protocols by name: each entry turns (train, test[, val]) features into metrics.

Like timm's model registry and big_vision's evaluators: ``@register_protocol`` adds an
entry, ``get_protocol`` fails with the valid names, and tests run over every entry. An
entry declares its default settings (PROTOCOLS.md's numbers) and a version; the results
ledger keys a cell by (features, protocol, hash of the full settings, version), so bump
``version`` whenever an entry's numbers would change for the same settings.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, unknown_name

Blocks = Callable[[], Iterable[tuple[np.ndarray, int]]]


@dataclass(frozen=True)
class EvalData:
    """The arrays of one cell. ``train_blocks`` streams the train features in row blocks
    (k-NN uses it so memory does not grow with the train set); ``X_train`` may then be
    None and is loaded only by protocols that need it whole."""

    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    X_train: np.ndarray | None = None
    train_blocks: Blocks | None = None
    X_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    mean_per_class: bool = False

    def train(self) -> np.ndarray:
        if self.X_train is not None:
            return self.X_train
        if self.train_blocks is None:
            raise ConfigError("EvalData needs X_train or train_blocks")
        return np.concatenate([b for b, _ in sorted(self.train_blocks(), key=lambda t: t[1])])


@dataclass
class ProtocolResult:
    metrics: dict[str, Any]
    diagnostics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Protocol:
    name: str
    version: int
    defaults: Mapping[str, Any]
    run: Callable[[EvalData, Mapping[str, Any]], ProtocolResult]
    description: str
    choices: Mapping[str, tuple] = field(default_factory=dict)  # settings with a closed set of values
    check: Callable[[Mapping[str, Any]], None] | None = None  # rules across settings
    bounds: Mapping[str, Bound] = field(default_factory=dict)  # numeric settings with a valid range

    def __call__(self, data: EvalData, settings: Mapping[str, Any] | None = None) -> ProtocolResult:
        full = resolve_settings(self.name, settings or {})
        if np.ndim(data.y_train) == 2:
            from pipeline.protocols.multilabel import refuse_multilabel

            refuse_multilabel(self)
        check_eval_data(data)
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = self.run(data, full)
        result.warnings.extend(sorted({f"{w.category.__name__}: {w.message}" for w in caught}))
        result.seconds = time.perf_counter() - started
        return result


def check_eval_data(data: EvalData) -> None:
    """Refuse unusable arrays before any protocol runs, naming the array: NaN/inf, not 2-D,
    no rows, widths that differ between splits, labels that are not class indices in
    [0, n_classes) with one per row, fewer than two train classes. (Streamed train blocks are
    checked by the k-NN as they arrive.)"""
    from pipeline.errors import DataValidationError
    from pipeline.protocols._validation import check_features, check_labels, check_min_classes

    if np.ndim(data.y_train) == 2:  # multi-label (n, C) rows: their own checks
        from pipeline.protocols.multilabel import check_multilabel_data

        return check_multilabel_data(data)
    width = None
    for split, X, y in (("train", data.X_train, data.y_train), ("test", data.X_test, data.y_test),
                        ("val", data.X_val, data.y_val)):
        if X is None and (split != "train" or data.train_blocks is None):
            if split == "val" and y is None:
                continue
            raise DataValidationError(f"X_{split} is missing")
        labels = check_labels(y, n_samples=None if X is None else len(X), name=f"y_{split}")
        if labels.size and (labels.min() < 0 or labels.max() >= data.n_classes):
            raise DataValidationError(
                f"y_{split} holds labels from {labels.min()} to {labels.max()}; class indices must be in "
                f"[0, {data.n_classes}) (n_classes={data.n_classes})")
        if split == "train":
            check_min_classes(labels)
        if X is None:
            continue
        X = check_features(X, f"X_{split}")
        if width is not None and X.shape[1] != width:
            raise DataValidationError(f"X_{split} has {X.shape[1]} features, but X_train has {width}; every "
                                      "split must come from the same layer")
        width = X.shape[1] if width is None else width


_REGISTRY: dict[str, Protocol] = {}


@dataclass(frozen=True)
class Bound:
    """The valid range of a numeric setting, checked by resolve_settings before any work
    (otherwise a bad value fails deep inside numpy or sklearn, or silently gives nonsense)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low < value (else low <= value)
    high_open: bool = False

    def contains(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def __str__(self) -> str:
        low = f"{'>' if self.low_open else '>='} {self.low:g}" if self.low is not None else ""
        high = f"{'<' if self.high_open else '<='} {self.high:g}" if self.high is not None else ""
        return " and ".join(b for b in (low, high) if b)


def at_least(low: float) -> Bound:
    return Bound(low)


def above(low: float) -> Bound:
    return Bound(low, low_open=True)


SEED = Bound(0, 2**32 - 1)  # numpy's RandomState takes no other seed


def register_protocol(name: str, version: int, defaults: Mapping[str, Any], description: str,
                      choices: Mapping[str, tuple] | None = None,
                      check: Callable[[Mapping[str, Any]], None] | None = None,
                      bounds: Mapping[str, Bound] | None = None):
    def wrap(fn: Callable[[EvalData, Mapping[str, Any]], ProtocolResult]):
        if name in _REGISTRY:
            warnings.warn(f"protocol {name!r} registered twice; the later one wins", stacklevel=2)
        _REGISTRY[name] = Protocol(name, version, dict(defaults), fn, description, dict(choices or {}), check,
                                   dict(bounds or {}))
        return fn

    return wrap


def list_protocols() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_protocol(name: str) -> Protocol:
    _load_builtins()
    if name not in _REGISTRY:
        raise unknown_name("protocol", name, _REGISTRY)
    return _REGISTRY[name]


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


def resolve_settings(name: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The protocol's defaults overlaid with ``settings``; unknown names and wrong types fail."""
    proto = get_protocol(name)
    if not isinstance(settings, Mapping):
        raise ConfigError(f"settings of protocol {name!r} must be a mapping, got {settings!r}")
    unknown = sorted(set(settings) - set(proto.defaults))
    if unknown:
        raise ConfigError(f"settings.{unknown[0]}: unknown setting of protocol {name!r}; "
                          f"valid settings: {', '.join(proto.defaults)}")
    full = {**proto.defaults, **settings}
    for key, value in settings.items():
        if not _type_ok(proto.defaults[key], value):
            raise ConfigError(f"settings.{key}: {value!r} has the wrong type for protocol {name!r} "
                              f"(default {proto.defaults[key]!r})")
        if key in proto.choices and value not in proto.choices[key]:
            raise ConfigError(f"settings.{key}: {value!r} is not one of {', '.join(map(repr, proto.choices[key]))} "
                              f"(protocol {name!r})")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"settings.{key}: {value!r} is not a finite number (protocol {name!r})")
        if number and key in proto.bounds and not proto.bounds[key].contains(value):
            raise ConfigError(f"settings.{key}: {value!r} is out of range; must be {proto.bounds[key]} "
                              f"(protocol {name!r})")
    if proto.check is not None:
        try:
            proto.check(full)
        except ConfigError as exc:
            raise ConfigError(f"settings: {exc} (protocol {name!r})") from None
    return full


def _load_builtins() -> None:
    from pipeline.protocols import builtin  # noqa: F401  (registers on import)
