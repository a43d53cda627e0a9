"""Images in [0, 1] and a differentiable feature function, shared by the diagnostics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from timm.data import create_transform
from torch import Tensor

from pipeline.encoders import Encoder, EncoderSpec, load_encoder
from pipeline.errors import ConfigError, DataValidationError

__all__ = ["as_encoder", "feature_function", "load_images", "pick_samples", "rgb_transform", "to_uint8_hwc"]


def as_encoder(encoder: Encoder | EncoderSpec, device: str | torch.device | None) -> Encoder:
    """An Encoder: ``encoder`` itself, or the spec loaded on ``device`` (float32, no autocast)."""
    if isinstance(encoder, EncoderSpec):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return load_encoder(encoder, device=device, autocast=False)
    if not isinstance(encoder, Encoder):
        raise ConfigError(f"encoder must be an Encoder or an EncoderSpec, got {type(encoder).__name__}")
    if device is not None and torch.device(device) != encoder.device:
        raise ConfigError(f"encoder {encoder.spec.name!r} is loaded on {encoder.device}, not on device={device!r}; "
                          "pass the spec to load it there")
    return encoder


def rgb_transform(data_config: dict[str, Any]) -> Callable[[Any], Tensor]:
    """timm's evaluation transform for ``data_config`` with an identity normalisation."""
    cfg = {**data_config, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
    return create_transform(**cfg, is_training=False)


def pick_samples(n_available: int, n_images: int, seed: int) -> np.ndarray:
    """A seeded draw of distinct sample indices."""
    if n_available < 1:
        raise DataValidationError("the split has no samples")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_available, size=min(n_images, n_available), replace=False)).astype(np.int64)


def load_images(adapter: Any, split: str, indices: np.ndarray, data_config: dict[str, Any]) -> Tensor:
    """Samples of a split as RGB tensors."""
    if not getattr(adapter, "has_images", False):
        raise ConfigError(f"dataset {getattr(adapter, 'name', adapter)!r} holds precomputed features, not images")
    transform = rgb_transform(data_config)
    return torch.stack([transform(adapter.load_image(split, int(i))) for i in indices])


def feature_function(encoder: Encoder) -> Callable[[Tensor], Tensor]:
    """Differentiable ``pre_logits`` features of RGB images in [0, 1] (normalised inside)."""
    import torchvision.transforms.functional as TF

    model = encoder.model
    mean = [float(v) for v in encoder.data_config["mean"]]
    std = [float(v) for v in encoder.data_config["std"]]

    def features(x: Tensor) -> Tensor:
        return model.forward_head(model.forward_features(TF.normalize(x, mean, std)), pre_logits=True)

    return features


def to_uint8_hwc(images: Tensor | np.ndarray) -> np.ndarray:
    """Images as uint8 pixels for pictures."""
    arr = images.detach().cpu().numpy() if isinstance(images, Tensor) else np.asarray(images)
    return np.round(np.clip(arr, 0.0, 1.0) * 255.0).astype(np.uint8).transpose(0, 2, 3, 1)
