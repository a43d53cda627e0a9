"""The encoder diagnostics, ``saliency`` and ``colour_detail``, registered with their
settings and metrics."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.errors import ConfigError
from pipeline.protocols.cell import ImageData
from pipeline.protocols.diagnostics.render import render_reconstructions_png, render_saliency_png
from pipeline.protocols.diagnostics.settings import InversionSettings, PerceptualNet, SaliencySettings
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.registry import ProtocolResult, register_protocol

__all__ = ["COLOUR_DETAIL", "PERCEPTUAL", "SALIENCY"]

SALIENCY = "saliency"
COLOUR_DETAIL = "colour_detail"
PERCEPTUAL = "perceptual"  # colour_detail's optional perceptual network
_COLOUR = ("colour_mse_red", "colour_mse_green", "colour_mse_blue", "colour_mse_mean", "perceptual_distance")


def _fields(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def _saliency_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    return dataclasses.asdict(SaliencySettings(**settings))


def _colour_detail_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
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


def _perceptual_network(settings: Mapping[str, Any]) -> dict[str, Any]:
    net = settings.get(PERCEPTUAL)
    return {PERCEPTUAL: PerceptualNet(**net).spec()} if net else {}


def _measured(data: ImageData, study: Callable[[Any], tuple[dict[str, Any], bytes | None]]) -> ProtocolResult:
    """Run ``study(device) -> (output, pictures)`` on the test split, timed, with its device use."""
    import torch

    device = resolve_device(data.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    out, png = study(device)
    seconds = time.perf_counter() - t0
    n_images = int(out["diagnostics"]["n_images"])
    gpu = {"device": device.type, "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "seconds": seconds, "images_per_second": n_images / seconds if seconds else None,
           "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None}
    diagnostics = {**out["diagnostics"], "split": data.test_split, "examples": png is not None}
    return ProtocolResult(out["metrics"], diagnostics, pictures=png, device_use=gpu, n_train=0, n_test=n_images)


@register_protocol(
    SALIENCY, version=1, defaults=_fields(SaliencySettings), build=_saliency_settings, weights=True, test_only=True,
    multilabel=True, metrics=("attentive_diffusion",), primary_metric="attentive_diffusion",
    unbounded=("attentive_diffusion",),
    description="attentive diffusion: percentage of a saliency map above its mean, averaged over images",
)
def _saliency(data: ImageData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch and timm load when a cell runs, not when the registry is read
    from pipeline.protocols.diagnostics.saliency import saliency_study

    def study(device: Any) -> tuple[dict[str, Any], bytes | None]:
        out = saliency_study(data.encoder, data.adapter, data.test_split, SaliencySettings(**s), device)
        ex = out["examples"]
        return out, render_saliency_png(ex["images"], ex["maps"]) if len(ex["images"]) else None

    return _measured(data, study)


@register_protocol(
    COLOUR_DETAIL, version=1, defaults={**_fields(InversionSettings), PERCEPTUAL: None}, build=_colour_detail_settings,
    weights=True, test_only=True, multilabel=True, files=(f"{PERCEPTUAL}.weights",), networks=_perceptual_network,
    metrics=_COLOUR, primary_metric="colour_mse_red", unbounded=_COLOUR, lower_is_better=_COLOUR,
    description="features inverted to images: per-channel colour error and perceptual distance",
)
def _colour_detail(data: ImageData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch and timm load when a cell runs, not when the registry is read
    from pipeline.protocols.diagnostics.inversion import colour_detail_study

    inversion = {k: v for k, v in s.items() if k != PERCEPTUAL}
    net = s.get(PERCEPTUAL)

    def study(device: Any) -> tuple[dict[str, Any], bytes | None]:
        out = colour_detail_study(data.encoder, data.adapter, data.test_split, InversionSettings(**inversion), device,
                                  PerceptualNet(**net) if net else None)
        ex = out["examples"]
        return out, (render_reconstructions_png(ex["originals"], ex["reconstructions"])
                     if len(ex["originals"]) else None)

    return _measured(data, study)
