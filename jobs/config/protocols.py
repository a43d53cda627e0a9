"""The protocol settings of a run: ``protocols:`` entries, each a named setting of one
registered protocol, resolved and checked against its registry entry on load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.config.encoders import check_weights
from jobs.config.typed import check_name
from pipeline.errors import ConfigError, RepevalError
from pipeline.protocols.cell import ENCODER_LAYER
from pipeline.protocols.registry import get_protocol
from storage_schema.ledger import config_hash

__all__ = [
    "ENCODER_LAYER", "ProtocolConfig", "check_correlation_layers", "check_correlation_metrics", "check_protocol_entry",
    "check_protocol_networks", "resolve_protocol_paths", "settings_hash",
]

@dataclass
class ProtocolConfig:
    """One named setting of a protocol, e.g. ``knn20`` = knn with n_neighbors 20.

    Parameters
    ----------
    name : str
        The setting's name (``knn20``).
    protocol : str
        A registered protocol (``repeval protocols``).
    settings : dict
        Its settings (the rest take their defaults).
    layers, datasets : list of str or None
        Only these layers and datasets (None: every one).
    """

    name: str
    protocol: str
    settings: dict[str, Any] = field(default_factory=dict)
    layers: list[str] | None = None  # None: every layer each encoder extracts; else only these
    datasets: list[str] | None = None  # None: every dataset

    def check(self, path: str) -> None:
        """Resolve the settings against the protocol's defaults and bounds, naming the entry.

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
        check_name(self.name, f"{path}.name")
        check_protocol_entry(self, path)  # its settings resolved by the protocol's registry entry


def check_protocol_entry(p: ProtocolConfig, path: str) -> None:
    """Resolve and check the settings of a protocol entry (its ``settings`` become the full,
    checked settings) and, for a protocol that reads the encoder's weights, its layers."""
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


def check_correlation_layers(protocols: list[ProtocolConfig], correlation: Any, path: str) -> None:
    """A correlation setting over a protocol that reads the encoder's weights reads its
    records' layer, ``ENCODER_LAYER`` (its metric is checked with every other setting's,
    :func:`check_correlation_metrics`)."""
    kinds = {p.name: p.protocol for p in protocols}
    for i, s in enumerate(correlation.settings):
        if s.protocol not in kinds or get_protocol(kinds[s.protocol]).reads_features:
            continue
        if s.layer != ENCODER_LAYER:
            raise ConfigError(f"{path}.correlation.settings[{i}].layer: protocol {kinds[s.protocol]!r} records layer "
                              f"{ENCODER_LAYER!r}, not {s.layer!r}")


def resolve_protocol_paths(protocols: list[ProtocolConfig], local: Any) -> None:
    """Make the local files the protocols' settings name (``Protocol.files``) absolute
    (relative to the config's folder)."""
    for p in protocols:
        for name in get_protocol(p.protocol).files:
            *parents, leaf = name.split(".")
            holder = p.settings
            for part in parents:
                holder = holder.get(part) if isinstance(holder, dict) else None
            if isinstance(holder, dict) and isinstance(holder.get(leaf), str):
                holder[leaf] = local(holder[leaf])


def check_protocol_networks(protocols: list[ProtocolConfig]) -> None:
    """The other networks a protocol loads (a perceptual network) must be there and fit."""
    for i, p in enumerate(protocols):
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


def check_correlation_metrics(protocols: list[ProtocolConfig], correlation: Any, reference: Any, path: str) -> None:
    """Every correlation setting (and a measured reference) reads a metric its protocol
    records: an unnamed metric becomes the protocol's primary one (``Protocol.primary_metric``,
    e.g. few-shot's ``mean``), and a metric the protocol never writes is refused here,
    naming the ones it does, instead of failing at the end of a run."""
    kinds = {p.name: p.protocol for p in protocols}
    for i, s in enumerate(correlation.settings):
        if s.protocol in kinds:
            s.metric = _metric_of(kinds[s.protocol], s.metric, s.bounded, f"{path}.correlation.settings[{i}]")
    ref = reference
    if ref.protocol in kinds:  # a reference score is a fraction: a metric it names must be one
        ref.metric = _metric_of(kinds[ref.protocol], ref.metric, ref.metric is not None, f"{path}.reference")
    elif ref.metric is None:
        ref.metric = "score"


def settings_hash(protocol: str, settings: dict[str, Any]) -> str:
    """The ``config_hash`` a record of these settings carries: of the settings that decide
    its result (those that cannot change it, and local files' paths, left out)."""
    entry = get_protocol(protocol)
    return config_hash(entry.result_settings(entry.resolve(settings)))
