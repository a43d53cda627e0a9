"""Saliency of an encoder and its attentive diffusion (Ericsson et al. 2021, 4.8)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pipeline.protocols.diagnostics.images import as_encoder, feature_function, load_images, pick_samples, to_uint8_hwc
from pipeline.protocols.diagnostics.settings import METHODS, SaliencySettings
from pipeline.errors import ConfigError, DataValidationError

__all__ = [
    "METHODS",
    "SaliencySettings",
    "attentive_diffusion",
    "attentive_diffusion_per_image",
    "gradient_saliency",
    "occlusion_saliency",
    "saliency_study",
]


def attentive_diffusion_per_image(maps: Any) -> np.ndarray:
    """Percentage of pixels above the map's mean, per map.

    Parameters
    ----------
    maps : (H, W) map or (n, H, W) maps of finite values.

    Returns
    -------
    numpy.ndarray
        (n,) float64 percentages in [0, 100).
    """
    arr = np.asarray(maps, dtype=np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or 0 in arr.shape:
        raise DataValidationError(f"saliency maps must be (H, W) or (n, H, W) and non-empty, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1))
    if bad.size:
        raise DataValidationError(f"saliency map(s) {bad[:10].tolist()} hold NaN or infinite values")
    mean = arr.mean(axis=(1, 2), keepdims=True)
    return 100.0 * (arr > mean).mean(axis=(1, 2))


def attentive_diffusion(maps: Any) -> float:
    """Attentive diffusion: :func:`attentive_diffusion_per_image` averaged over the maps.

    Parameters
    ----------
    maps : (H, W) map or (n, H, W) maps.

    Returns
    -------
    float
        Percent.
    """
    return float(attentive_diffusion_per_image(maps).mean())


def gradient_saliency(features: Callable[[Tensor], Tensor], images: Tensor) -> Tensor:
    """Max over channels of |d ||f(x)||_2 / dx| per pixel.

    Parameters
    ----------
    features : differentiable feature function of (n, 3, H, W) images.
    images : (n, 3, H, W) RGB in [0, 1].

    Returns
    -------
    torch.Tensor
        (n, H, W) saliency on the images' device.
    """
    x = images.detach().clone().requires_grad_(True)
    norms = features(x).flatten(1).norm(dim=1)
    # Images do not interact in an eval-mode model, so the gradient of the sum is each
    # image's own gradient.
    (grad,) = torch.autograd.grad(norms.sum(), x)
    return grad.abs().amax(dim=1)


def _positions(size: int, patch: int, stride: int) -> list[int]:
    starts = list(range(0, size - patch + 1, stride))
    if starts[-1] != size - patch:
        starts.append(size - patch)  # the last row/column of pixels is covered too
    return starts


def occlusion_saliency(features: Callable[[Tensor], Tensor], images: Tensor, patch: int, stride: int,
                       batch_size: int = 64) -> Tensor:
    """Mean feature change when squares covering a pixel are greyed out (see the module doc).

    Parameters
    ----------
    features : feature function of (n, 3, H, W) images.
    images : (n, 3, H, W) RGB in [0, 1].
    patch : side of the occluding square, pixels (at most the image side).
    stride : step between squares, pixels.
    batch_size : occluded images per forward pass.

    Returns
    -------
    torch.Tensor
        (n, H, W) saliency.
    """
    n, _, height, width = images.shape
    if patch < 1 or stride < 1 or patch > min(height, width):
        raise ConfigError(f"occlusion patch must be in [1, {min(height, width)}] and stride >= 1, "
                          f"got patch={patch}, stride={stride}")
    squares = [(i, j) for i in _positions(height, patch, stride) for j in _positions(width, patch, stride)]
    like = {"device": images.device, "dtype": images.dtype}
    out = torch.zeros((n, height, width), **like)
    with torch.no_grad():
        for k in range(n):
            image = images[k]
            base = features(image[None]).flatten(1)
            fill = image.mean(dim=(1, 2), keepdim=True)
            credit = torch.zeros((height, width), **like)
            count = torch.zeros((height, width), **like)
            for start in range(0, len(squares), batch_size):
                chunk = squares[start:start + batch_size]
                batch = image.expand(len(chunk), -1, -1, -1).clone()
                for b, (i, j) in enumerate(chunk):
                    batch[b, :, i:i + patch, j:j + patch] = fill
                change = (features(batch).flatten(1) - base).norm(dim=1)
                for b, (i, j) in enumerate(chunk):
                    credit[i:i + patch, j:j + patch] += change[b]
                    count[i:i + patch, j:j + patch] += 1
            out[k] = credit / count
    return out


def saliency_study(encoder: Any, dataset: Any, split: str = "test", settings: SaliencySettings | None = None,
                   device: str | torch.device | None = None) -> dict[str, Any]:
    """Attentive diffusion of an encoder on a split's images, and a few example maps.

    Parameters
    ----------
    encoder : an Encoder, or an EncoderSpec to load on ``device``.
    dataset : image dataset adapter.
    split : split whose images are used.
    settings : method and sizes (default :class:`SaliencySettings`).
    device : torch device for a spec (default CUDA when available, else CPU).

    Returns
    -------
    dict
        ``metrics``: ``attentive_diffusion`` (percent). ``diagnostics``: ``method``,
        ``settings``, ``n_images``, ``image_size``, ``sample_indices``, ``per_image``
        (percent per image), ``weights_fingerprint``. ``examples``: ``images`` (uint8
        (k, H, W, 3)) and ``maps`` (float32 (k, H, W)) for pictures.
    """
    settings = settings or SaliencySettings()
    if not isinstance(settings, SaliencySettings):
        raise ConfigError(f"settings must be SaliencySettings, got {type(settings).__name__}")
    dataset.check_split(split)
    encoder = as_encoder(encoder, device)
    indices = pick_samples(dataset.num_samples(split), settings.n_images, settings.seed)
    features = feature_function(encoder)
    maps = []
    for start in range(0, indices.size, settings.batch_size):
        images = load_images(dataset, split, indices[start:start + settings.batch_size], encoder.data_config)
        images = images.to(encoder.device)
        if settings.method == "gradient":
            maps.append(gradient_saliency(features, images).cpu())
        else:
            maps.append(occlusion_saliency(features, images, settings.patch, settings.stride,
                                           settings.batch_size).cpu())
    all_maps = torch.cat(maps).numpy().astype(np.float32)
    per_image = attentive_diffusion_per_image(all_maps)
    k = min(settings.n_examples, indices.size)
    examples = load_images(dataset, split, indices[:k], encoder.data_config)
    return {
        "metrics": {"attentive_diffusion": float(per_image.mean())},
        "diagnostics": {"method": settings.method, "settings": asdict(settings), "n_images": int(indices.size),
                        "image_size": list(all_maps.shape[1:]), "sample_indices": indices.tolist(),
                        "per_image": per_image.tolist(), "weights_fingerprint": encoder.weights_fingerprint},
        "examples": {"images": to_uint8_hwc(examples), "maps": all_maps[:k]},
    }
