"""Config checks of the encoder protocols (``protocol: finetune``, ``saliency``,
``colour_detail``): their settings, layers and correlation settings, validated when the
config loads (no torch, no timm), and the checks that need the registries (multi-label
datasets, a perceptual network's checkpoint) before any work."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.encoder_protocols import (
    COLOUR_DETAIL, PERCEPTUAL, get_encoder_protocol, is_encoder_protocol, list_encoder_protocols,
)
from pipeline.errors import ConfigError, RepevalError, unknown_name
from storage_schema.ledger import config_hash

if TYPE_CHECKING:
    from jobs.config.benchmark import BenchmarkConfig
    from jobs.config.protocols import ProtocolConfig

ENCODER_LAYER = "pre_logits"  # the features every encoder protocol works on

__all__ = ["ENCODER_LAYER", "check_encoder_correlations", "check_encoder_protocol", "check_encoder_work",
           "encoder_config_hash", "resolve_encoder_paths"]


def check_encoder_protocol(p: ProtocolConfig, path: str) -> bool:
    """Resolve and check the settings of an encoder-protocol entry; False for any other entry.

    Parameters
    ----------
    p : the config's protocol entry (its ``settings`` become the full, validated settings).
    path : where the entry is, for messages (``config.protocols[2]``).

    Returns
    -------
    bool
        Whether ``p`` is an encoder protocol (then it is checked); an unknown protocol name
        is an error naming every valid one.
    """
    if not is_encoder_protocol(p.protocol):
        from pipeline.protocols.registry import list_protocols

        readouts = list_protocols()
        if p.protocol not in readouts:
            error = unknown_name("protocol", p.protocol, readouts + list_encoder_protocols())
            raise ConfigError(f"{path}.protocol: {error}")
        return False
    try:
        p.settings = get_encoder_protocol(p.protocol).resolve(p.settings)
    except RepevalError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if p.layers is not None and list(p.layers) != [ENCODER_LAYER]:
        raise ConfigError(f"{path}.layers: protocol {p.protocol!r} works on the encoder itself, at its "
                          f"{ENCODER_LAYER} features; leave layers out (got {p.layers})")
    return True


def encoder_config_hash(protocol: str, settings: dict[str, Any]) -> str:
    """The ``config_hash`` a record of these settings carries (settings that cannot change
    the result left out).

    Parameters
    ----------
    protocol : an encoder protocol.
    settings : its settings (resolved or not).

    Returns
    -------
    str
    """
    entry = get_encoder_protocol(protocol)
    return config_hash(entry.result_settings(entry.resolve(settings)))


def check_encoder_correlations(cfg: BenchmarkConfig, path: str) -> None:
    """A correlation setting over an encoder protocol must name one of its metrics, and read
    an unbounded one (attentive diffusion, colour errors, NLL) raw: ``bounded: false``.

    Parameters
    ----------
    cfg : the config.
    path : where the config is, for messages.
    """
    kinds = {p.name: p.protocol for p in cfg.protocols if is_encoder_protocol(p.protocol)}
    for i, s in enumerate(cfg.correlation.settings):
        if s.protocol not in kinds:
            continue
        entry = get_encoder_protocol(kinds[s.protocol])
        where = f"{path}.correlation.settings[{i}]"
        if s.metric not in entry.metrics:
            raise ConfigError(f"{where}.metric: protocol {entry.name!r} records no metric {s.metric!r}; "
                              f"its metrics: {', '.join(entry.metrics)}")
        if s.layer != ENCODER_LAYER:
            raise ConfigError(f"{where}.layer: protocol {entry.name!r} records layer {ENCODER_LAYER!r}, "
                              f"not {s.layer!r}")
        if s.bounded and s.metric in entry.unbounded:
            raise ConfigError(f"{where}.bounded: {s.metric!r} of {entry.name!r} is not a fraction in [0, 1]; "
                              "it is read raw, without the logit transform: set bounded: false")


def resolve_encoder_paths(cfg: BenchmarkConfig, local: Any) -> None:
    """Make a perceptual network's checkpoint path and ``extract.scratch_dir`` absolute
    (relative to the config's folder).

    Parameters
    ----------
    cfg : the config.
    local : the config's own path resolver (absolute paths and URLs are kept).
    """
    if cfg.extract.scratch_dir:
        cfg.extract.scratch_dir = local(cfg.extract.scratch_dir)
    for p in cfg.protocols:
        net = p.settings.get(PERCEPTUAL) if p.protocol == COLOUR_DETAIL else None
        if isinstance(net, dict) and isinstance(net.get("weights"), str):
            net["weights"] = local(net["weights"])


def check_encoder_work(cfg: BenchmarkConfig) -> None:
    """What needs the registries: an encoder protocol that needs one class per sample on a
    multi-label dataset, a perceptual network whose checkpoint is missing or does not fit.

    Parameters
    ----------
    cfg : the config.
    """
    from pipeline.datasets import adapter_class

    for i, p in enumerate(cfg.protocols):
        if not is_encoder_protocol(p.protocol):
            continue
        entry = get_encoder_protocol(p.protocol)
        for d in cfg.datasets:
            if p.datasets is not None and d.name not in p.datasets:
                continue
            try:
                multi_label = adapter_class(d.adapter).multi_label
            except RepevalError:
                continue  # an unknown adapter is reported with its dataset entry
            if multi_label and not entry.multilabel:
                raise ConfigError(f"config.protocols[{i}] ({p.name}): dataset {d.name!r} ({d.adapter}) is "
                                  f"multi-label, and protocol {p.protocol!r} needs one class per sample; "
                                  "restrict the protocol with its datasets list")
        net = p.settings.get(PERCEPTUAL)
        if net:
            from jobs.config.weights import check_weights
            from pipeline.protocols.diagnostics.settings import PerceptualNet

            try:
                check_weights(PerceptualNet(**net).spec())
            except RepevalError as exc:
                raise ConfigError(f"config.protocols[{i}].settings.{PERCEPTUAL}: {exc}") from None
