"""The protocol settings of a run: ``protocols:`` entries, each a named setting of one
registered protocol, resolved and checked against its registry entry on load.

When the config loads (no torch, no timm): each entry's settings are resolved by its
registry entry (unknown names and bad values refused, one line naming the field); an
entry whose protocol reads the encoder's weights works on the encoder itself, at
``ENCODER_LAYER``, so its ``layers`` and the correlation settings over it name that
layer only; a correlation setting reads a metric its protocol records
(:func:`check_correlation_metrics`); the local files its settings name (a perceptual
network's checkpoint) are taken relative to the config's folder. Before any work
(``jobs.plan.check_plan``): the other networks an entry loads must be there and fit.
:func:`settings_hash` is the hash a setting's records carry (a config's settings are
matched to its records by it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobs.config.encoders import check_weights
from jobs.config.typed import check_name
from pipeline.errors import ConfigError, RepevalError
from pipeline.protocols.cell import ENCODER_LAYER
from pipeline.protocols.registry import get_protocol
from storage_schema.ledger import config_hash

if TYPE_CHECKING:
    from jobs.config.benchmark import BenchmarkConfig

__all__ = [
    "ENCODER_LAYER", "ProtocolConfig", "check_correlation_layers", "check_correlation_metrics", "check_protocol_entry",
    "check_protocol_networks", "resolve_protocol_paths", "settings_hash",
]

@dataclass
class ProtocolConfig:
    """One named setting of a protocol, e.g. ``knn20`` = knn with n_neighbors 20."""

    name: str
    protocol: str
    settings: dict[str, Any] = field(default_factory=dict)
    layers: list[str] | None = None  # None: every layer each encoder extracts; else only these
    datasets: list[str] | None = None  # None: every dataset

    def check(self, path: str) -> None:
        """Resolve the settings against the protocol's defaults and bounds, naming the entry."""
        check_name(self.name, f"{path}.name")
        check_protocol_entry(self, path)  # its settings resolved by the protocol's registry entry


def check_protocol_entry(p: ProtocolConfig, path: str) -> None:
    """Resolve and check the settings of a protocol entry (its ``settings`` become the full,
    checked settings) and, for a protocol that reads the encoder's weights, its layers.

    Parameters
    ----------
    p : ProtocolConfig
        The config's protocol entry.
    path : str
        Where the entry is, for messages (``config.protocols[2]``).

    Raises
    ------
    ConfigError
        An unknown protocol (naming every valid one), a bad setting, or layers a weights
        protocol cannot take.
    """
    try:
        entry = get_protocol(p.protocol)
    except RepevalError as exc:
        raise ConfigError(f"{path}.protocol: {exc}") from None
    try:
        p.settings = entry.resolve(p.settings)
    except RepevalError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not entry.reads_features and p.layers is not None and list(p.layers) != [ENCODER_LAYER]:
        raise ConfigError(f"{path}.layers: protocol {p.protocol!r} works on the encoder itself, at its "
                          f"{ENCODER_LAYER} features; leave layers out (got {p.layers})")


def check_correlation_layers(cfg: BenchmarkConfig, path: str) -> None:
    """A correlation setting over a protocol that reads the encoder's weights reads its
    records' layer, ``ENCODER_LAYER`` (its metric is checked with every other setting's,
    :func:`check_correlation_metrics`).

    Parameters
    ----------
    cfg : BenchmarkConfig
    path : str
        Where the config is, for messages.
    """
    kinds = {p.name: p.protocol for p in cfg.protocols}
    for i, s in enumerate(cfg.correlation.settings):
        if s.protocol not in kinds or get_protocol(kinds[s.protocol]).reads_features:
            continue
        if s.layer != ENCODER_LAYER:
            raise ConfigError(f"{path}.correlation.settings[{i}].layer: protocol {kinds[s.protocol]!r} records layer "
                              f"{ENCODER_LAYER!r}, not {s.layer!r}")


def resolve_protocol_paths(cfg: BenchmarkConfig, local: Any) -> None:
    """Make the local files the protocols' settings name (``Protocol.files``) and
    ``extract.scratch_dir`` absolute (relative to the config's folder).

    Parameters
    ----------
    cfg : BenchmarkConfig
    local : callable
        The config's own path resolver (absolute paths and URLs are kept).
    """
    if cfg.extract.scratch_dir:
        cfg.extract.scratch_dir = local(cfg.extract.scratch_dir)
    for p in cfg.protocols:
        for name in get_protocol(p.protocol).files:
            *parents, leaf = name.split(".")
            holder = p.settings
            for part in parents:
                holder = holder.get(part) if isinstance(holder, dict) else None
            if isinstance(holder, dict) and isinstance(holder.get(leaf), str):
                holder[leaf] = local(holder[leaf])


def check_protocol_networks(cfg: BenchmarkConfig) -> None:
    """The other networks a protocol loads (a perceptual network) must be there and fit.

    Parameters
    ----------
    cfg : BenchmarkConfig
    """
    for i, p in enumerate(cfg.protocols):
        networks = get_protocol(p.protocol).networks
        if networks is None:
            continue
        try:
            specs = networks(p.settings)
        except RepevalError as exc:
            raise ConfigError(f"config.protocols[{i}].settings: {exc}") from None
        for name, spec in specs.items():
            try:
                check_weights(spec)
            except RepevalError as exc:
                raise ConfigError(f"config.protocols[{i}].settings.{name}: {exc}") from None


def _metric_of(protocol: str, metric: str | None, bounded: bool | None, where: str) -> str:
    """``metric`` (the protocol's primary one when None), refused unless the protocol records it;
    with ``bounded``, refused when it is not a fraction in [0, 1]."""
    entry = get_protocol(protocol)
    chosen = entry.primary_metric if metric is None else metric
    if chosen not in entry.metrics:
        raise ConfigError(f"{where}.metric: protocol {protocol!r} records no metric {metric!r}; its metrics: "
                          f"{', '.join(entry.metrics)} (leave metric out for its primary one, "
                          f"{entry.primary_metric!r})")
    if bounded and chosen in entry.unbounded:
        raise ConfigError(f"{where}.bounded: {chosen!r} of {protocol!r} is not a fraction in [0, 1]; it is read "
                          "raw, without the logit transform: set bounded: false")
    return chosen


def check_correlation_metrics(cfg: BenchmarkConfig, path: str) -> None:
    """Every correlation setting (and a measured reference) reads a metric its protocol
    records: an unnamed metric becomes the protocol's primary one (``Protocol.primary_metric``,
    e.g. few-shot's ``mean``), and a metric the protocol never writes is refused here,
    naming the ones it does, instead of failing at the end of a run.

    Parameters
    ----------
    cfg : BenchmarkConfig
        The config, its protocol setting names already checked.
    path : str
        Where the config is, for messages.
    """
    kinds = {p.name: p.protocol for p in cfg.protocols}
    for i, s in enumerate(cfg.correlation.settings):
        if s.protocol in kinds:
            s.metric = _metric_of(kinds[s.protocol], s.metric, s.bounded, f"{path}.correlation.settings[{i}]")
    ref = cfg.reference
    if ref.protocol in kinds:  # a reference score is a fraction: a metric it names must be one
        ref.metric = _metric_of(kinds[ref.protocol], ref.metric, ref.metric is not None, f"{path}.reference")
    elif ref.metric is None:
        ref.metric = "score"


def settings_hash(protocol: str, settings: dict[str, Any]) -> str:
    """The ``config_hash`` a record of these settings carries: of the settings that decide
    its result (those that cannot change it, and local files' paths, left out).

    Parameters
    ----------
    protocol : str
        A registered protocol.
    settings : dict
        Its settings (resolved or not).

    Returns
    -------
    str
    """
    entry = get_protocol(protocol)
    return config_hash(entry.result_settings(entry.resolve(settings)))
