"""Frozen timm encoders: specs, loading, hub probing and checkpoint matching."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from pipeline.encoders.spec import PRE_LOGITS, EncoderSpec, check_architecture, list_architectures

# No network: pretrained weights come from the local cache or not at all (set before timm
# and huggingface_hub are imported by the submodules).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_LAZY = {
    "Encoder": "pipeline.encoders.encoder",
    "load_encoder": "pipeline.encoders.encoder",
    "meta_feature_dims": "pipeline.encoders.encoder",
    "meta_feature_shapes": "pipeline.encoders.encoder",
    "meta_encoder": "pipeline.encoders.encoder",
    "check_layers_available": "pipeline.encoders.building",
    "check_checkpoint_fits": "pipeline.encoders.checkpoints.matching",
}

__all__ = ["PRE_LOGITS", "Encoder", "EncoderSpec", "check_architecture", "check_checkpoint_fits",
           "check_layers_available", "list_architectures", "load_encoder", "meta_encoder",
           "meta_feature_dims", "meta_feature_shapes"]

if TYPE_CHECKING:
    from pipeline.encoders.building import check_layers_available
    from pipeline.encoders.encoder import (
        Encoder, load_encoder, meta_encoder, meta_feature_dims, meta_feature_shapes,
    )
    from pipeline.encoders.checkpoints.matching import check_checkpoint_fits


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
