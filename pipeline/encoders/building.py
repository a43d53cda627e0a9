"""Building a spec's timm model (always without its classifier) and the layers it offers.

The model is built with ``num_classes=0``: features never need the classifier, so a
checkpoint whose head has any number of classes loads, and so does a backbone-only one.
"""

from __future__ import annotations

import threading
from typing import Any

import timm
import torch
from torch import nn

from pipeline.encoders.spec import PRE_LOGITS, EncoderSpec, base_layer, check_architecture
from pipeline.errors import ConfigError, unknown_name

# torch's RNG is one per process: two threads seeding and building models at once (Dask
# workers with threads) would interleave draws and get other random-init weights each run.
# repeval's other torch draws use their own generators (the extraction's DataLoader).
INIT_LOCK = threading.Lock()


def model_kwargs(spec: EncoderSpec) -> dict[str, Any]:
    """Keyword arguments of ``timm.create_model`` for ``spec``.

    Parameters
    ----------
    spec : EncoderSpec
        The spec.

    Returns
    -------
    dict
        ``num_classes=0``, plus ``img_size`` where the architecture fixes its input grid.
    """
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
    """``timm.create_model`` for ``spec``, with an input-size error that names the field.

    Parameters
    ----------
    spec : EncoderSpec
        The spec (its model name and input size).
    pretrained : bool
        Load timm's pretrained weights (from the local cache only).
    **kwargs
        Further arguments of ``timm.create_model`` (see :func:`model_kwargs`).

    Returns
    -------
    torch.nn.Module
        The model.
    """
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
    """``spec``'s model on the meta device: every tensor's name and shape, no memory, no weights.

    Parameters
    ----------
    spec : EncoderSpec
        The spec; its architecture is checked first.

    Returns
    -------
    torch.nn.Module or None
        The model, or None when timm cannot build it without the hub (a tag only the hub
        knows): the loading itself then says what is wrong.
    """
    check_architecture(spec)
    try:
        with torch.device("meta"):
            return create_model(spec, **model_kwargs(spec))
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        if isinstance(exc, ConfigError):
            raise
        return None


def available_layers(model: nn.Module) -> tuple[str, ...]:
    """``pre_logits`` plus one ``block{i}`` per output ``forward_intermediates`` can give.

    timm sizes forward_intermediates' index range by ``feature_info`` (CNN stages incl. the
    stem where reported, ViT blocks), so its length is the block count.

    Parameters
    ----------
    model : torch.nn.Module
        A timm model.

    Returns
    -------
    tuple of str
        The layer names.
    """
    if not hasattr(model, "forward_intermediates"):
        return (PRE_LOGITS,)
    count = len(getattr(model, "feature_info", None) or ())
    return (PRE_LOGITS,) + tuple(f"block{i}" for i in range(count))


def check_layer_names(spec: EncoderSpec, available: tuple[str, ...]) -> None:
    """Raise UnknownNameError, listing ``available``, for a layer of ``spec`` not among them
    (a ``block<i>.tokens`` layer needs ``block<i>``).

    Parameters
    ----------
    spec : EncoderSpec
        The spec whose layers are checked.
    available : tuple of str
        The model's layers (:func:`available_layers`).
    """
    for layer in spec.layers:
        if base_layer(layer) not in available:
            raise unknown_name(f"layer of {spec.arch}", base_layer(layer), available)


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
        check_layer_names(spec, available_layers(model))
