"""Encoder diagnostics that need the encoder itself, not stored features: where it looks
(saliency, attentive diffusion) and what its features keep (inversion, colour errors,
perceptual distance), plus PNG pictures of examples."""

from pipeline.diagnostics.inversion import (
    InversionSettings,
    PerceptualNet,
    colour_detail_study,
    colour_errors,
    invert_features,
    perceptual_distance,
    total_variation,
)
from pipeline.diagnostics.render import render_reconstructions_png, render_saliency_png
from pipeline.diagnostics.saliency import (
    METHODS,
    SaliencySettings,
    attentive_diffusion,
    attentive_diffusion_per_image,
    gradient_saliency,
    occlusion_saliency,
    saliency_study,
)

__all__ = [
    "METHODS",
    "InversionSettings",
    "PerceptualNet",
    "SaliencySettings",
    "attentive_diffusion",
    "attentive_diffusion_per_image",
    "colour_detail_study",
    "colour_errors",
    "gradient_saliency",
    "invert_features",
    "occlusion_saliency",
    "perceptual_distance",
    "render_reconstructions_png",
    "render_saliency_png",
    "saliency_study",
    "total_variation",
]
