"""Encoder diagnostics that need the encoder itself, not stored features: where it looks
(saliency, attentive diffusion) and what its features keep (inversion, colour errors,
perceptual distance), plus PNG pictures of examples."""

from __future__ import annotations

import importlib
from typing import Any

from pipeline.protocols.diagnostics.settings import METHODS, InversionSettings, PerceptualNet, SaliencySettings

_LAZY = {
    "colour_detail_study": "inversion", "colour_errors": "inversion", "invert_features": "inversion",
    "perceptual_distance": "inversion", "total_variation": "inversion",
    "render_reconstructions_png": "render", "render_saliency_png": "render",
    "attentive_diffusion": "saliency", "attentive_diffusion_per_image": "saliency",
    "gradient_saliency": "saliency", "occlusion_saliency": "saliency", "saliency_study": "saliency",
}

__all__ = sorted([*_LAZY, "METHODS", "InversionSettings", "PerceptualNet", "SaliencySettings"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"pipeline.protocols.diagnostics.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pipeline.protocols.diagnostics' has no attribute {name!r}")
