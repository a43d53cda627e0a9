"""Weights an encoder names, checked before any work: one line per problem.

A checkpoint is judged by its tensor names and shapes only (the safetensors header, or the
state dict's keys and shapes) against the architecture built on the meta device, so a
resnet50 checkpoint under ``arch: resnet18`` is refused when the config loads, not after
minutes of extraction. Pretrained weights must be in a local cache; the message says how
to give a local file in the config instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.encoders.spec import PRE_LOGITS, is_layer_name
from pipeline.errors import ConfigError


def check_weights(spec: Any) -> None:
    """Raise a one-line error when ``spec``'s weights cannot be used; random weights pass.

    Parameters
    ----------
    spec : pipeline.encoders.EncoderSpec
        The encoder to check.
    """
    if spec.weights_kind == "checkpoint":
        # deferred: torch reads the checkpoint when the plan checks it; reading a config needs neither torch
        # nor timm
        from pipeline.encoders import check_checkpoint_fits

        check_checkpoint_fits(spec)
    elif spec.weights_kind == "pretrained":
        # deferred: timm, as above
        from pipeline.encoders.hub import check_pretrained_available

        check_pretrained_available(spec)


def check_encoder(encoder: Any) -> None:
    """Architecture, layers and weights of one encoder config (timm on the meta device, the
    checkpoint's header); raises the RepevalError that says what is wrong."""
    # deferred: timm and torch load when an encoder is checked (a full plan), never for a rerun answered from
    # the ledger
    from pipeline.encoders import check_layers_available
    from pipeline.encoders.building import check_requested_layers

    if not all(is_layer_name(layer) for layer in encoder.layers):  # every bad layer at once, with the range
        check_requested_layers(dataclasses.replace(encoder, layers=[PRE_LOGITS]).spec(), encoder.layers)
    spec = encoder.spec()
    check_layers_available(spec)
    check_weights(spec)


def check_checkpoint_fields(entry: Any, path: str) -> None:
    """``checkpoint_key`` names a key (``teacher``); ``strip_prefixes`` holds name prefixes
    ending in a dot (``net.``), tried besides the usual ones (docs/checkpoints.md)."""
    if entry.checkpoint_key is not None and not entry.checkpoint_key.strip():
        raise ConfigError(f"{path}.checkpoint_key: must not be empty; give the key holding the weights "
                          "(e.g. teacher), or leave it out to find it")
    bad = [p for p in entry.strip_prefixes if not p.endswith(".") or p.strip() != p or p == "."]
    if bad:
        raise ConfigError(f"{path}.strip_prefixes: {bad[0]!r} is not a name prefix ending in '.' "
                          "(e.g. [net.])")
