"""Weights an encoder names, checked before any work: one line per problem.

A checkpoint is judged by its tensor names and shapes only (the safetensors header, or the
state dict's keys and shapes) against the architecture built on the meta device, so a
resnet50 checkpoint under ``arch: resnet18`` is refused when the config loads, not after
minutes of extraction. Pretrained weights must be in a local cache; the message says how
to give a local file in the config instead.
"""

from __future__ import annotations

from typing import Any


def check_weights(spec: Any) -> None:
    """Raise a one-line error when ``spec``'s weights cannot be used; random weights pass.

    Parameters
    ----------
    spec : pipeline.encoders.EncoderSpec
        The encoder to check.
    """
    if spec.weights_kind == "checkpoint":
        from pipeline.encoders import check_checkpoint_fits

        check_checkpoint_fits(spec)
    elif spec.weights_kind == "pretrained":
        from pipeline.encoders.hub import check_pretrained_available

        check_pretrained_available(spec)
