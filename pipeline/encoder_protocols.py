"""Encoder protocols: evaluations that need an encoder's weights and a dataset's images,
not stored features (fine-tuning, saliency, feature inversion).

Like the readout registry (``pipeline.protocols.registry``), each entry has a name, a
code version (bump it when its numbers would change for the same settings), validated
settings with defaults, and the scalar metrics its records carry. ``unbounded`` metrics are
not fractions in [0, 1] (a percentage of pixels, a squared error): a correlation reads
them raw, never logit-transformed. Importing this module imports neither torch nor timm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.protocols.diagnostics.settings import InversionSettings, PerceptualNet, SaliencySettings
from pipeline.errors import ConfigError, unknown_name
from pipeline.protocols.finetune.settings import FinetuneSettings

FINETUNE = "finetune"
SALIENCY = "saliency"
COLOUR_DETAIL = "colour_detail"
PERCEPTUAL = "perceptual"  # colour_detail's optional perceptual network

__all__ = ["COLOUR_DETAIL", "ENCODER_PROTOCOLS", "FINETUNE", "SALIENCY", "EncoderProtocol",
           "get_encoder_protocol", "is_encoder_protocol", "list_encoder_protocols"]


@dataclass(frozen=True)
class EncoderProtocol:
    """One encoder protocol.

    Parameters
    ----------
    name : registry name (what a config's ``protocol:`` gives).
    version : code version, part of a record's identity.
    summary : one line on what it measures.
    metrics : the scalar metrics of its records.
    unbounded : metrics that are not fractions in [0, 1] (read raw by correlations).
    lower_is_better : metrics where a smaller value is better.
    fields : its settings and their defaults.
    build : validated settings object from a mapping of settings.
    ignored : settings that cannot change a result (left out of its identity).
    multilabel : whether it can run on a multi-label dataset (it reads no labels).
    """

    name: str
    version: int
    summary: str
    metrics: tuple[str, ...]
    unbounded: tuple[str, ...]
    lower_is_better: tuple[str, ...]
    fields: Mapping[str, Any]
    build: Callable[[Mapping[str, Any]], Any]
    ignored: tuple[str, ...] = ()
    multilabel: bool = False

    def resolve(self, settings: Mapping[str, Any] | None) -> dict[str, Any]:
        """Every setting: the defaults overlaid with ``settings``, validated.

        Parameters
        ----------
        settings : settings to override (None: none).

        Returns
        -------
        dict
            JSON-able settings (tuples as lists).

        Raises
        ------
        ConfigError
            One line naming the setting: unknown (with the valid ones), or a bad value.
        """
        settings = {} if settings is None else settings
        if not isinstance(settings, Mapping):
            raise ConfigError(f"settings of protocol {self.name!r} must be a mapping, got {settings!r}")
        unknown = sorted(set(settings) - set(self.fields))
        if unknown:
            raise ConfigError(f"settings.{unknown[0]}: unknown setting of protocol {self.name!r}; "
                              f"valid settings: {', '.join(self.fields)}")
        try:
            built = self.build(settings)
        except ConfigError as exc:
            raise ConfigError(f"settings: {exc}{_yaml_hint(settings)}") from None
        except TypeError as exc:  # a value of a type the settings class cannot take
            raise ConfigError(f"settings of protocol {self.name!r}: {exc}") from None
        return _plain({**self.fields, **built})

    def result_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The resolved ``settings`` without those that cannot change a result.

        Parameters
        ----------
        settings : what :meth:`resolve` returned.

        Returns
        -------
        dict
        """
        out = {k: v for k, v in settings.items() if k not in self.ignored}
        if isinstance(out.get(PERCEPTUAL), Mapping):  # the file's contents count, not where it lies
            out[PERCEPTUAL] = {k: v for k, v in out[PERCEPTUAL].items() if k != "weights"}
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    return value


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


def _finetune(settings: Mapping[str, Any]) -> dict[str, Any]:
    return FinetuneSettings.from_dict(settings).to_dict()


def _saliency(settings: Mapping[str, Any]) -> dict[str, Any]:
    return dataclasses.asdict(SaliencySettings(**settings))


def _colour_detail(settings: Mapping[str, Any]) -> dict[str, Any]:
    inversion = dataclasses.asdict(InversionSettings(**{k: v for k, v in settings.items() if k != PERCEPTUAL}))
    net = settings.get(PERCEPTUAL)
    if net is not None:
        if not isinstance(net, Mapping):
            raise ConfigError(f"{PERCEPTUAL} must be a mapping with arch and weights (a local file), got {net!r}")
        names = [f.name for f in dataclasses.fields(PerceptualNet)]
        unknown = sorted(set(net) - set(names))
        if unknown or "arch" not in net or "weights" not in net:
            raise ConfigError(f"{PERCEPTUAL} takes {', '.join(names)} (arch and weights required), got "
                              f"{sorted(net)}")
        net = PerceptualNet(**net)
        net.spec()  # refuses random and hub weights
    return {**inversion, PERCEPTUAL: None if net is None else dataclasses.asdict(net)}


def _fields(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


ENCODER_PROTOCOLS: dict[str, EncoderProtocol] = {
    p.name: p for p in (
        EncoderProtocol(
            FINETUNE, 1, "the encoder fine-tuned with a linear head: grid, selection on validation, refit, test",
            ("score", "top1", "mean_per_class", "ece", "ece_temperature_scaled", "nll", "nll_temperature_scaled"),
            unbounded=("nll", "nll_temperature_scaled"),
            lower_is_better=("ece", "ece_temperature_scaled", "nll", "nll_temperature_scaled"),
            fields=_plain(_fields(FinetuneSettings)), build=_finetune,
            ignored=("save_every", "eval_batch_size", "num_workers")),
        EncoderProtocol(
            SALIENCY, 1, "attentive diffusion: percentage of a saliency map above its mean, averaged over images",
            ("attentive_diffusion",), unbounded=("attentive_diffusion",), lower_is_better=(),
            fields=_fields(SaliencySettings), build=_saliency, multilabel=True),
        EncoderProtocol(
            COLOUR_DETAIL, 1, "features inverted to images: per-channel colour error and perceptual distance",
            ("colour_mse_red", "colour_mse_green", "colour_mse_blue", "colour_mse_mean", "perceptual_distance"),
            unbounded=("colour_mse_red", "colour_mse_green", "colour_mse_blue", "colour_mse_mean",
                       "perceptual_distance"),
            lower_is_better=("colour_mse_red", "colour_mse_green", "colour_mse_blue", "colour_mse_mean",
                             "perceptual_distance"),
            fields={**_fields(InversionSettings), PERCEPTUAL: None}, build=_colour_detail, multilabel=True),
    )
}


def is_encoder_protocol(name: str) -> bool:
    """Whether ``name`` is an encoder protocol (needs weights and images, not features).

    Parameters
    ----------
    name : a protocol name.

    Returns
    -------
    bool
    """
    return name in ENCODER_PROTOCOLS


def get_encoder_protocol(name: str) -> EncoderProtocol:
    """The encoder protocol ``name``.

    Parameters
    ----------
    name : a registered encoder protocol.

    Returns
    -------
    EncoderProtocol

    Raises
    ------
    UnknownNameError
        Naming the valid encoder protocols.
    """
    if name not in ENCODER_PROTOCOLS:
        raise unknown_name("encoder protocol", name, ENCODER_PROTOCOLS)
    return ENCODER_PROTOCOLS[name]


def list_encoder_protocols() -> list[str]:
    """Names of the encoder protocols, sorted.

    Returns
    -------
    list of str
    """
    return sorted(ENCODER_PROTOCOLS)
