"""Protocols by name: each entry turns what a cell reads into metrics."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import ConfigError, unknown_name
from pipeline.protocols import settings as _settings
from pipeline.protocols.bounds import SEED, Bound, above, at_least
from pipeline.protocols.cell import Blocks, CellShape, EvalData, ImageData, ProtocolResult
from pipeline.protocols.fit_warnings import (
    WARNING_CODES, at_chance_warning, evidence_warnings, merge_warnings, python_warning,
)
from pipeline.protocols.inputs.cell_data import check_cell_data
from pipeline.protocols.inputs.devices import device_setting
from pipeline.protocols.kinds import METRIC_KINDS, MetricKind, check_kind

__all__ = ["Blocks", "Bound", "CellShape", "EvalData", "ImageData", "Protocol", "ProtocolResult", "SEED", "above",
           "at_least", "check_eval_data", "get_protocol", "headline_metric", "headline_value", "list_protocols",
           "register_protocol", "resolve_settings", "unregister_protocol"]


@dataclass(frozen=True)
class Protocol:
    """A registered protocol: its metadata, its runner and what it can take.

    Parameters
    ----------
    name, version, defaults, description, choices, bounds
        Metadata (the docs and ``repeval protocols`` read them).
    run : callable
        ``run(data, full_settings) -> ProtocolResult``; ``data`` is an ``EvalData``, a
        ``DenseData`` (``dense``) or an ``ImageData`` (``weights``).
    check : callable or None
        Rules across settings; raises ConfigError.
    streams_train : bool
        Reads the train features in row blocks (``EvalData.train_blocks``).
    multilabel : bool
        Accepts (n, C) 0/1 label arrays (a multi-label dataset).
    memory : callable or None
        ``memory(CellShape, full_settings) -> int``: peak bytes of one cell.
    tokens : bool
        Reads token features (n, T, d) instead of pooled (n, d) features.
    dense : str or None
        The task of the per-pixel targets it reads with spatial maps (``DenseData``).
    metrics, primary_metric, unbounded, lower_is_better : tuple of str, str, tuple, tuple
        The scalar metrics its records can carry (which of them depends on the data:
        ``map11`` for multi-label rows, ``top1`` otherwise); the one a correlation setting
        reads when it names none; those that are not fractions in [0, 1]; those where a
        smaller value is better.
    weights : bool
        Reads the encoder's weights and a dataset's images (``ImageData``), not features.
    test_only : bool
        Reads the test split only (a diagnostic), not train, validation and test.
    build : callable or None
        ``build(settings) -> mapping``: a settings class that checks the values (in place
        of ``choices``, ``bounds`` and ``check``).
    ignored, files : tuple of str
        Settings that cannot change a result, and dotted settings naming local files it
        reads (taken relative to the config, fingerprinted by contents): both are left
        out of a result's identity.
    added_settings : mapping
        Settings added after records of the entry were made, each with the value that
        reproduces what it did before: left out of a result's identity while they hold
        that value, so a store's records keep theirs (any other value is hashed as usual).
    grid : object or None
        Splits a ``weights`` run into grid points trained apart: ``points(settings)``,
        ``run_point(data, settings, index)``, ``finish(data, settings, done)``.
    networks : callable or None
        ``networks(settings) -> {setting: EncoderSpec}``: other networks it loads.
    cheap_settings : mapping or None
        Settings small enough for a run on a few dozen rows in well under a second (the
        per-protocol property tests run every entry that reads features with them; ``{}``:
        the defaults already are); None: not declared.
    runs_on_device : bool
        Runs in torch on the ``device`` setting's device: the registry adds that setting
        (``auto``) to its defaults and checks its name (``inputs.devices.device_setting``).
    kind : str
        Its metric kind, a key of ``pipeline.protocols.kinds.METRIC_KINDS``.
    chance : callable or None
        ``chance(data) -> (level, how)``: its own chance level of the headline and how it
        is computed; None: the kind's generic check on its evidence (majority class).
    slow : bool
        Its per-protocol memory measurement takes over 10 s (those tests mark it slow).
    floor : float or None
        The headline a run on the per-protocol tests' class-clustered features must beat
        (None: no such check; the registry fills in the kind's when not given).
    about : str
        What it computes and after whom (Markdown); an entry with ``about`` is documented
        by the generated reference alone and needs ``setting_help`` for every setting.
    setting_help : mapping
        Setting -> what it means (the ``device`` row is the registry's).
    warning_codes : mapping
        Its own fit-warning codes, code -> (severity, meaning), added to
        ``pipeline.protocols.fit_warnings.WARNING_CODES`` when it registers.
    """

    name: str
    version: int
    defaults: Mapping[str, Any]
    run: Callable[[Any, Mapping[str, Any]], ProtocolResult]
    description: str
    choices: Mapping[str, tuple] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], None] | None = None
    bounds: Mapping[str, Bound] = field(default_factory=dict)
    streams_train: bool = False
    multilabel: bool = False
    memory: Callable[[CellShape, Mapping[str, Any]], int] | None = None
    tokens: bool = False
    dense: str | None = None
    metrics: tuple[str, ...] = ("score",)
    primary_metric: str = "score"
    unbounded: tuple[str, ...] = ()
    lower_is_better: tuple[str, ...] = ()
    weights: bool = False
    test_only: bool = False
    build: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    ignored: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    added_settings: Mapping[str, Any] = field(default_factory=dict)
    grid: Any = None
    networks: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    cheap_settings: Mapping[str, Any] | None = None
    runs_on_device: bool = False
    kind: str = "classification"
    chance: Callable[[Any], tuple[float, str]] | None = None
    slow: bool = False
    floor: float | None = None
    about: str = ""
    setting_help: Mapping[str, str] = field(default_factory=dict)
    warning_codes: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def metric_kind(self) -> MetricKind:
        """Its ``pipeline.protocols.kinds.MetricKind``."""
        return METRIC_KINDS[self.kind]

    @property
    def reads(self) -> str:
        """What a cell of it reads: ``weights``, ``map`` (dense), ``tokens`` or ``pooled``."""
        return "weights" if self.weights else "map" if self.dense else "tokens" if self.tokens else "pooled"

    @property
    def reads_features(self) -> bool:
        """Whether it reads stored features (pooled, tokens or maps), not the encoder's weights."""
        return not self.weights

    def resolve(self, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every setting: the defaults overlaid with ``settings``, checked.

        Parameters
        ----------
        settings : mapping or None
            Settings to override (None: none).

        Returns
        -------
        dict

        Raises
        ------
        ConfigError
            One line naming the setting (``pipeline.protocols.settings.resolve``).
        """
        return _settings.resolve(self, {} if settings is None else settings)

    def result_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The resolved ``settings`` that decide a result (hashed into its identity).

        Parameters
        ----------
        settings : mapping
            What :meth:`resolve` returned.

        Returns
        -------
        dict
        """
        return _settings.result_settings(self, settings)

    def __call__(self, data: Any, settings: Mapping[str, Any] | None = None) -> ProtocolResult:
        """Run on ``data`` with ``settings`` (overlaid on the defaults, checked first)."""
        full = self.resolve(settings)
        check_eval_data(data, self)
        started = time.perf_counter()
        if self.weights:  # its runner reports its own warnings and device use
            result = self.run(data, full)
            result.seconds = time.perf_counter() - started
            return result
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = self.run(data, full)

        raised = [python_warning(w.category.__name__, str(w.message)) for w in caught]
        found = evidence_warnings(data, result, self.primary_metric)
        if self.chance is not None and not any(w["code"] == "collapsed_features" for w in found):
            level, how = self.chance(data)
            result.diagnostics["chance"] = level
            found += at_chance_warning(_number(result.metrics.get(self.primary_metric)), level, how)
        if any(w["code"] == "collapsed_features" for w in found):  # the chance score is the encoder's, not the fit's
            result.warnings = [w for w in result.warnings if WARNING_CODES[w["code"]][0] != "unreliable"]
        result.warnings = merge_warnings(result.warnings, found, sorted(raised, key=lambda w: w["message"]))
        result.seconds = time.perf_counter() - started
        return result

    def memory_bytes(self, n_train: int, n_test: int, n_val: int, dim: int, n_classes: int, itemsize: int,
                     settings: Mapping[str, Any] | None = None, n_tokens: int = 1,
                     target_pixels: int = 0) -> int | None:
        """Peak host memory of one cell in bytes, the features it holds included.

        A protocol that ``streams_train`` holds one block of the train features at a
        time, not all of them. A protocol that reads the encoder's weights has no model
        of its shapes (it asks for a GPU, not for memory): None.

        Parameters
        ----------
        n_train, n_test, n_val : int
            Rows per split (0 for no validation split).
        dim : int
            Feature width.
        n_classes : int
            Number of classes.
        itemsize : int
            Bytes per stored feature value.
        settings : mapping or None
            The cell's settings (overlaid on the defaults).
        n_tokens : int
            Tokens per row (token features: each row is ``n_tokens`` x ``dim``; a map of
            h x w cells: h x w).
        target_pixels : int
            Pixels of one image's per-pixel targets (dense protocols).

        Returns
        -------
        int or None
        """
        if self.weights:
            return None
        full = self.resolve(settings)
        shape = CellShape(int(n_train), int(n_test), int(n_val), int(dim), int(n_classes), int(itemsize),
                          int(n_tokens), int(target_pixels))
        if self.memory is None:  # a protocol without a model: twice its features
            return 2 * shape.feature_bytes
        return int(self.memory(shape, full))


def check_eval_data(data: Any, protocol: Protocol | None = None) -> None:
    """Refuse unusable arrays before any protocol runs, naming the array."""
    # See ``pipeline.protocols.inputs.cell_data.check_cell_data`` (the checks; its messages
    # name the registered protocols that could take what was given).
    check_cell_data(data, protocol, [_REGISTRY[n] for n in list_protocols()])


_REGISTRY: dict[str, Protocol] = {}


def register_protocol(name: str, version: int, defaults: Mapping[str, Any], description: str,
                      choices: Mapping[str, tuple] | None = None,
                      check: Callable[[Mapping[str, Any]], None] | None = None,
                      bounds: Mapping[str, Bound] | None = None, **flags: Any):
    """Decorator registering ``run(data, settings) -> ProtocolResult`` under ``name``."""
    for key in ("metrics", "unbounded", "lower_is_better", "ignored", "files"):
        if key in flags:
            flags[key] = tuple(flags[key])

    def wrap(fn: Callable[[Any, Mapping[str, Any]], ProtocolResult]):
        own_defaults, own_check = dict(defaults), check
        if flags.get("runs_on_device"):  # the device setting is the registry's, not the entry's
            own_defaults, own_check = device_setting(own_defaults, own_check, name)
        if name in _REGISTRY:
            warnings.warn(f"protocol {name!r} registered twice; the later one wins", stacklevel=2)
        own_flags = dict(flags)
        # undeclared: a dense entry's kind is dense, a test-only diagnostic's an audit, else classification
        kind = check_kind(own_flags.setdefault(
            "kind", "dense" if own_flags.get("dense") else "audit" if own_flags.get("test_only") else
            "classification"), name)
        own_flags.setdefault("floor", _KIND_FLOORS.get(kind.name))
        if own_flags.get("runs_on_device") and own_flags.get("setting_help"):
            own_flags["setting_help"] = {**own_flags["setting_help"], "device": DEVICE_HELP}
        entry = Protocol(name, version, own_defaults, fn, description, dict(choices or {}), own_check,
                         dict(bounds or {}), **own_flags)
        _check_entry(entry)
        if entry.primary_metric not in entry.metrics:
            raise ConfigError(f"protocol {name!r}: primary_metric {entry.primary_metric!r} is not one of its metrics "
                              f"{', '.join(entry.metrics)}")
        stray = sorted(set(entry.unbounded + entry.lower_is_better) - set(entry.metrics))
        if stray:
            raise ConfigError(f"protocol {name!r}: {stray[0]!r} is declared unbounded or lower-is-better but is not "
                              f"one of its metrics {', '.join(entry.metrics)}")
        for code, (severity, meaning) in entry.warning_codes.items():
            WARNING_CODES.setdefault(code, (severity, meaning))
        _REGISTRY[name] = entry
        return fn

    return wrap


# What the registry's ``device`` setting means, for entries that document themselves.
DEVICE_HELP = "where it computes: `auto` (a GPU when there is one), `cpu`, `cuda` or `cuda:<i>`"
# The headline a run on the per-protocol tests' class-clustered features beats, by kind.
_KIND_FLOORS = {"classification": 0.5}


def _check_entry(entry: Protocol) -> None:
    """Refuse an entry whose docs or warning codes cannot be generated as declared."""
    if entry.about:
        missing = [k for k in entry.defaults if k not in entry.setting_help]
        if missing:
            raise ConfigError(f"protocol {entry.name!r} documents itself (about=...) but setting_help lacks "
                              f"{', '.join(missing)}: say what each setting means")
    for code, value in entry.warning_codes.items():
        known = WARNING_CODES.get(code)
        if known is not None and known != tuple(value):
            raise ConfigError(f"protocol {entry.name!r}: warning code {code!r} is already defined as {known[0]}")
        if not (isinstance(value, tuple) and len(value) == 2 and value[0] in ("unreliable", "caution")):
            raise ConfigError(f"protocol {entry.name!r}: warning code {code!r} must map to (severity, meaning) "
                              "with severity 'unreliable' or 'caution'")


def _number(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else float("nan")


def headline_metric(protocol: str | None) -> str | None:
    """The name of a protocol's headline metric (``Protocol.primary_metric``)."""
    # A protocol no longer registered (a record of a removed entry) reads ``score``, the
    # name every entry used before the headline was declared. An audit (kind ``audit``:
    # invariance, the diagnostics) has no headline to rank or compare: None.
    entry = _REGISTRY.get(str(protocol))
    if entry is None:
        return "score"
    return None if entry.kind == "audit" else entry.primary_metric


def headline_value(record: Mapping[str, Any]) -> float | None:
    """A record's headline score, ``metrics[headline_metric(protocol)]``; None when it is
    not a finite number (failed, or a metric that could not be computed) or the record is
    an audit's."""
    metric = headline_metric(record.get("protocol"))
    value = None if metric is None else (record.get("metrics") or {}).get(metric)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    return float(value) if ok else None


def unregister_protocol(name: str) -> Protocol:
    """Remove the entry ``name`` (a test's throwaway protocol) and return it."""
    get_protocol(name)  # an unknown name fails with the valid ones
    entry = _REGISTRY.pop(name)
    for code in entry.warning_codes:  # its codes leave with it unless another entry declares them
        if not any(code in other.warning_codes for other in _REGISTRY.values()):
            WARNING_CODES.pop(code, None)
    return entry


def list_protocols() -> list[str]:
    """Names of the registered protocols, sorted.

    Returns
    -------
    list of str
    """
    return sorted(_REGISTRY)


def get_protocol(name: str) -> Protocol:
    """The protocol registered as ``name``; UnknownNameError lists the valid names.

    Parameters
    ----------
    name : str

    Returns
    -------
    Protocol
    """
    if name not in _REGISTRY:
        raise unknown_name("protocol", name, _REGISTRY)
    return _REGISTRY[name]


def resolve_settings(name: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The protocol's defaults overlaid with ``settings``; unknown names and bad values fail.

    Parameters
    ----------
    name : str
        A registered protocol.
    settings : mapping
        Settings to override.

    Returns
    -------
    dict
        Every setting of the protocol.

    Raises
    ------
    ConfigError
        Naming the setting: unknown, wrong type, not a valid choice, out of range, or
        against a rule across settings (``pipeline.protocols.settings``).
    """
    return get_protocol(name).resolve(settings)
