"""Building a spec's timm model (always without its classifier) and the layers it offers."""

from __future__ import annotations

import threading
from typing import Any

import timm
import torch
from torch import nn

from pipeline.encoders.spec import PRE_LOGITS, EncoderSpec, base_layer, check_architecture
from pipeline.errors import ConfigError, UnknownNameError

# torch's RNG is one per process: two threads seeding and building models at once (Dask
# workers with threads) would interleave draws and get other random-init weights each run.
# repeval's other torch draws use their own generators (the extraction's DataLoader).
INIT_LOCK = threading.Lock()


def model_kwargs(spec: EncoderSpec) -> dict[str, Any]:
    """Keyword arguments of ``timm.create_model`` for ``spec``."""
    kwargs: dict[str, Any] = {"num_classes": 0}
    if spec.input_size is not None and _fixed_input_size(spec.model_name):
        kwargs["img_size"] = spec.input_size  # ViT-like models fix the grid of positions at creation
    return kwargs


def _fixed_input_size(model_name: str) -> bool:
    try:
        cfg = timm.models.get_pretrained_cfg(model_name)
    except RuntimeError:
        return False
    return bool(cfg is not None and cfg.fixed_input_size)


def create_model(spec: EncoderSpec, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` for ``spec``, with an input-size error that names the field."""
    try:
        return timm.create_model(spec.model_name, pretrained=pretrained, **kwargs)
    except TypeError as exc:
        if "img_size" not in kwargs:
            raise
        raise ConfigError(
            f"encoder {spec.name!r}: {spec.arch} has a fixed input size and cannot be built for "
            f"input_size={spec.input_size}; leave input_size unset"
        ) from exc


def build_on_meta(spec: EncoderSpec) -> nn.Module | None:
    """``spec``'s model on the meta device: every tensor's name and shape, no memory, no weights."""
    check_architecture(spec)
    try:
        with torch.device("meta"):
            return create_model(spec, **model_kwargs(spec))
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        if isinstance(exc, ConfigError):
            raise
        return None


def available_layers(model: nn.Module) -> tuple[str, ...]:
    """``pre_logits`` plus one ``block{i}`` per output ``forward_intermediates`` can give."""
    # timm sizes forward_intermediates' index range by ``feature_info`` (CNN stages incl. the
    # stem where reported, ViT blocks), so its length is the block count.
    if not hasattr(model, "forward_intermediates"):
        return (PRE_LOGITS,)
    count = len(getattr(model, "feature_info", None) or ())
    return (PRE_LOGITS,) + tuple(f"block{i}" for i in range(count))


def layer_modules(model: nn.Module) -> dict[str, str]:
    """timm's module name of each block (``blocks.11``, ``layer4``, ``stages.2``) -> its
    layer name here (``block11``), from the model's ``feature_info``."""
    out = {}
    for i, entry in enumerate(getattr(model, "feature_info", None) or ()):
        module = entry.get("module") if isinstance(entry, dict) else None
        if isinstance(module, str) and module:
            out[module] = f"block{i}"
    return out


def layer_problem(name: str, arch: str, layers: tuple[str, ...] | list[str], available: tuple[str, ...],
                  modules: dict[str, str] | None = None) -> str | None:
    """One line naming every layer of ``layers`` the model lacks, with the valid range and,
    for timm's own module names (``blocks.11``), the layer they mean; None when all are fine."""
    modules = modules or {}
    bad, hints = [], []
    for layer in layers:
        base = base_layer(layer) if isinstance(layer, str) else layer
        if base in available:
            continue
        bad.append(layer)
        if base in modules:
            hints.append(f"{layer!r} is timm's module name of {modules[base]}: did you mean "
                         f"{modules[base] + layer[len(base):]!r}?")
    if not bad:
        return None
    blocks = [a for a in available if a != PRE_LOGITS]
    offered = f"{PRE_LOGITS} and block0-{blocks[-1]} ({len(blocks)} blocks)" if blocks else f"only {PRE_LOGITS}"
    what = "layer" if len(bad) == 1 else "layers"
    line = (f"encoder {name!r}: {what} {', '.join(repr(b) for b in bad)} not offered by {arch}, which has {offered}"
            f"; a block's tokens or map: block<i>.tokens, block<i>.map")
    return line + (f"; {'; '.join(hints)}" if hints else "")


def check_layer_names(spec: EncoderSpec, available: tuple[str, ...], modules: dict[str, str] | None = None) -> None:
    """Raise UnknownNameError naming every layer of ``spec`` not among ``available``, at once
    (a ``block<i>.tokens`` layer needs ``block<i>``)."""
    problem = layer_problem(spec.name, spec.arch, spec.layers, available, modules)
    if problem is not None:
        raise UnknownNameError(problem)


def check_requested_layers(spec: EncoderSpec, layers: tuple[str, ...] | list[str]) -> None:
    """Refuse every one of ``layers`` (any strings, as a config gives them) that ``spec``'s
    model lacks, in one error: the valid range, and timm's module names mapped to layers."""
    # The model is built on the meta device. A layer of bad grammar (``layer4``) is named
    # with the others instead of alone, before the model is consulted.
    model = build_on_meta(spec)
    if model is not None:
        problem = layer_problem(spec.name, spec.arch, tuple(layers), available_layers(model), layer_modules(model))
        if problem is not None:
            raise UnknownNameError(problem)


def check_layers_available(spec: EncoderSpec) -> None:
    """Refuse an unknown architecture or layers it lacks, before any work.

    The model is built on the meta device (no weights, no memory; milliseconds), so a
    config fails when it is checked, not in a task.

    Parameters
    ----------
    spec : EncoderSpec
        The spec to check.
    """
    model = build_on_meta(spec)
    if model is not None:
        check_layer_names(spec, available_layers(model), layer_modules(model))
