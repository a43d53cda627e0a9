"""Protocols by name: each entry turns what a cell reads into metrics.

Like timm's model registry and big_vision's evaluators: ``register_protocol`` adds an
entry, ``get_protocol`` fails with the valid names, and tests run over every entry. Each
protocol family registers its own entries in its package's ``protocols`` module, and
importing ``pipeline.protocols`` imports the families (this module imports none of
them). An entry declares its default settings, their valid values, a version, what it
can take and what it needs:

- ``reads``: what a cell of it reads: pooled (n, d) features (``pooled``), token features
  (n, T, d) of a layer stored with its tokens (``tokens``), a dense dataset's spatial maps
  (n, h, w, d) and per-pixel targets (``map``, ``DenseData``), or the encoder's weights
  and a dataset's images (``weights``, ``ImageData``: fine-tuning, the diagnostics). The
  first three read stored features (``reads_features``); a ``weights`` cell builds the
  encoder instead, and its work may split into grid points trained apart (``grid``);
- ``streams_train``: it reads the train features as row blocks (``EvalData.train_blocks``),
  so a caller need not load them whole;
- ``multilabel``: it accepts (n, C) label arrays (1 present, 0 absent, -1 difficult), or
  for a protocol that reads images, a multi-label dataset (it reads no labels);
- ``cheap_settings``: settings for a run on a few dozen rows, with which the tests that
  cover every entry run it (cheap runs, bad inputs, settings fuzzing);
- ``runs_on_device``: it runs in torch on a ``device`` setting's device; the registry adds
  that setting (default ``auto``) and its check, so no entry declares it;
- ``memory_bytes(...)``: the peak host memory of one cell, the features it holds
  included, from the shapes alone (for scheduling; None for a ``weights`` cell): the
  entry's ``memory``, composed of the named parts of ``pipeline.protocols.memory``;
- ``metrics``: the scalar metrics its records can carry, ``primary_metric`` the one a
  correlation reads unless told otherwise, ``unbounded`` those that are not fractions in
  [0, 1] (read raw, never logit-transformed), ``lower_is_better`` those where less is
  better;
- its settings: ``defaults``, checked by ``choices``, ``bounds`` and ``check`` or by a
  settings class (``build``), resolved by ``pipeline.protocols.settings``.

A result's ``warnings`` are ``{"code", "message"}`` dicts (``fit_warnings``): a runner adds
what its fit knows (a grid edge, a plateau, a temperature at its bound); the entry adds
those of the test predictions it returns as evidence (one class, chance level) and every
Python warning raised while it ran (a protocol that reads images reports its own).

The results ledger keys a cell by (what it reads, protocol, hash of the result settings,
version), so bump ``version`` whenever an entry's numbers would change for the same
settings.
"""

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
from pipeline.protocols.fit_warnings import WARNING_CODES, evidence_warnings, merge_warnings, python_warning
from pipeline.protocols.inputs.cell_data import check_cell_data
from pipeline.protocols.inputs.devices import device_setting

__all__ = ["Blocks", "Bound", "CellShape", "EvalData", "ImageData", "Protocol", "ProtocolResult", "SEED", "above",
           "at_least", "check_eval_data", "get_protocol", "list_protocols", "register_protocol",
           "resolve_settings", "unregister_protocol"]


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
        """Run on ``data`` with ``settings`` (overlaid on the defaults, checked first).

        Parameters
        ----------
        data : EvalData, DenseData or ImageData
        settings : mapping or None

        Returns
        -------
        ProtocolResult
        """
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
        found = evidence_warnings(data, result)
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
    """Refuse unusable arrays before any protocol runs, naming the array.

    See ``pipeline.protocols.inputs.cell_data.check_cell_data`` (the checks; its messages
    name the registered protocols that could take what was given).

    Parameters
    ----------
    data : EvalData, DenseData or ImageData
    protocol : Protocol or None
        The protocol that will run (multi-label labels need ``protocol.multilabel``).
    """
    check_cell_data(data, protocol, [_REGISTRY[n] for n in list_protocols()])


_REGISTRY: dict[str, Protocol] = {}


def register_protocol(name: str, version: int, defaults: Mapping[str, Any], description: str,
                      choices: Mapping[str, tuple] | None = None,
                      check: Callable[[Mapping[str, Any]], None] | None = None,
                      bounds: Mapping[str, Bound] | None = None, **flags: Any):
    """Decorator registering ``run(data, settings) -> ProtocolResult`` under ``name``.

    Parameters
    ----------
    name : str
        The protocol's name in configs.
    version : int
        Bumped whenever results would change for the same settings.
    defaults : mapping
        Every setting with its default.
    description : str
        One line for listings.
    choices, check, bounds
        See ``Protocol``.
    **flags
        Keyword only, the other fields of ``Protocol`` (``streams_train``, ``multilabel``,
        ``memory``, ``tokens``, ``dense``, ``metrics``, ``primary_metric``, ``unbounded``,
        ``lower_is_better``, ``weights``, ``test_only``, ``build``, ``ignored``, ``files``,
        ``added_settings``, ``grid``, ``networks``, ``cheap_settings``, ``runs_on_device``).

    Returns
    -------
    callable
        The decorator (it returns the function unchanged).
    """
    for key in ("metrics", "unbounded", "lower_is_better", "ignored", "files"):
        if key in flags:
            flags[key] = tuple(flags[key])

    def wrap(fn: Callable[[Any, Mapping[str, Any]], ProtocolResult]):
        own_defaults, own_check = dict(defaults), check
        if flags.get("runs_on_device"):  # the device setting is the registry's, not the entry's
            own_defaults, own_check = device_setting(own_defaults, own_check, name)
        if name in _REGISTRY:
            warnings.warn(f"protocol {name!r} registered twice; the later one wins", stacklevel=2)
        entry = Protocol(name, version, own_defaults, fn, description, dict(choices or {}), own_check,
                         dict(bounds or {}), **flags)
        if entry.primary_metric not in entry.metrics:
            raise ConfigError(f"protocol {name!r}: primary_metric {entry.primary_metric!r} is not one of its metrics "
                              f"{', '.join(entry.metrics)}")
        stray = sorted(set(entry.unbounded + entry.lower_is_better) - set(entry.metrics))
        if stray:
            raise ConfigError(f"protocol {name!r}: {stray[0]!r} is declared unbounded or lower-is-better but is not "
                              f"one of its metrics {', '.join(entry.metrics)}")
        _REGISTRY[name] = entry
        return fn

    return wrap


def unregister_protocol(name: str) -> Protocol:
    """Remove the entry ``name`` (a test's throwaway protocol) and return it.

    Parameters
    ----------
    name : str
        A registered protocol.

    Returns
    -------
    Protocol
    """
    get_protocol(name)  # an unknown name fails with the valid ones
    return _REGISTRY.pop(name)


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
