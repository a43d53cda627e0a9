"""What colour and detail the features keep (Ericsson et al. 2021, 4.9): invert the
features back to images and compare them with the originals."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pipeline.protocols.diagnostics.images import as_encoder, feature_function, load_images, pick_samples, to_uint8_hwc
from pipeline.protocols.diagnostics.settings import InversionSettings, PerceptualNet
from pipeline.encoders import Encoder, load_encoder
from pipeline.errors import ConfigError, DataValidationError

CHANNELS = ("red", "green", "blue")
_EPS = 1e-10

__all__ = [
    "InversionSettings",
    "PerceptualNet",
    "colour_detail_study",
    "colour_errors",
    "invert_features",
    "perceptual_distance",
    "total_variation",
]


def total_variation(x: Tensor) -> Tensor:
    """Mean over images of the mean squared horizontal plus vertical neighbour differences.

    Parameters
    ----------
    x : (n, C, H, W) images.

    Returns
    -------
    torch.Tensor
        Scalar.
    """
    dh = (x[:, :, :, 1:] - x[:, :, :, :-1]).pow(2).mean(dim=(1, 2, 3))
    dv = (x[:, :, 1:, :] - x[:, :, :-1, :]).pow(2).mean(dim=(1, 2, 3))
    return (dh + dv).mean()


def _relative_feature_loss(feats: Tensor, target: Tensor) -> Tensor:
    return ((feats - target).pow(2).sum(dim=1) / target.pow(2).sum(dim=1).clamp_min(_EPS)).mean()


def invert_features(features: Any, originals: Tensor, settings: InversionSettings,
                    generator: torch.Generator | None = None) -> tuple[Tensor, dict[str, Any]]:
    """Images whose features match those of ``originals`` (see the module doc).

    Parameters
    ----------
    features : differentiable feature function of (n, 3, H, W) RGB images in [0, 1].
    originals : (n, 3, H, W) RGB in [0, 1]; their features are the targets.
    settings : steps, learning rate, prior weight, start noise.
    generator : CPU generator of the start noise (default: seeded from ``settings.seed``).

    Returns
    -------
    (reconstructions, info)
        Reconstructions (n, 3, H, W) in [0, 1] on the originals' device; info holds
        ``feature_loss_initial`` and ``feature_loss_final`` (the relative feature loss at
        the start image and at the result) and ``tv_final``.
    """
    if generator is None:
        generator = torch.Generator().manual_seed(settings.seed)
    with torch.no_grad():
        target = features(originals).flatten(1)
    noise = torch.randn(originals.shape, generator=generator).to(originals.device)
    x = (0.5 + settings.init_noise * noise).clamp(0.0, 1.0).requires_grad_(True)
    optimizer = torch.optim.Adam([x], lr=settings.lr)
    with torch.no_grad():
        initial = float(_relative_feature_loss(features(x).flatten(1), target))
    for _ in range(settings.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = _relative_feature_loss(features(x).flatten(1), target) + settings.tv_weight * total_variation(x)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            x.clamp_(0.0, 1.0)
    with torch.no_grad():
        final = float(_relative_feature_loss(features(x).flatten(1), target))
        tv = float(total_variation(x))
    return x.detach(), {"feature_loss_initial": initial, "feature_loss_final": final, "tv_final": tv}


def colour_errors(originals: Any, reconstructions: Any) -> dict[str, float]:
    """Per-channel mean squared error between (n, 3, H, W) RGB images.

    Parameters
    ----------
    originals, reconstructions : arrays or tensors of the same shape, RGB in [0, 1].

    Returns
    -------
    dict
        ``red``, ``green``, ``blue`` (MSE over images and pixels) and ``mean`` (their mean).
    """
    a = originals.detach().cpu().double().numpy() if isinstance(originals, Tensor) else np.asarray(originals, float)
    b = (reconstructions.detach().cpu().double().numpy() if isinstance(reconstructions, Tensor)
         else np.asarray(reconstructions, float))
    if a.shape != b.shape or a.ndim != 4 or a.shape[1] != 3:
        raise DataValidationError(f"colour errors need two (n, 3, H, W) arrays of one shape, got {a.shape} and "
                                  f"{b.shape}")
    per_channel = ((a - b) ** 2).mean(axis=(0, 2, 3))
    out = {name: float(v) for name, v in zip(CHANNELS, per_channel)}
    out["mean"] = float(per_channel.mean())
    return out


def perceptual_distance(net: Encoder, x: Tensor, y: Tensor, layers: tuple[int, ...] | None = None) -> Tensor:
    """Per-image perceptual distance between RGB batches in [0, 1] (see the module doc).

    Parameters
    ----------
    net : the loaded perceptual network (an Encoder from :meth:`PerceptualNet.spec`).
    x, y : (n, 3, H, W) images; resized to the network's input size when they differ.
    layers : ``forward_intermediates`` indices; None: every layer the network reports.

    Returns
    -------
    torch.Tensor
        (n,) distances, each in [0, 4].
    """
    import torch.nn.functional as F
    import torchvision.transforms.functional as TF

    model = net.model
    count = len(getattr(model, "feature_info", None) or ())
    if not hasattr(model, "forward_intermediates") or count == 0:
        raise ConfigError(f"perceptual network {net.spec.arch!r} has no intermediate layers to compare")
    indices = list(range(count)) if layers is None else [int(i) for i in layers]
    bad = [i for i in indices if not 0 <= i < count]
    if bad or not indices:
        raise ConfigError(f"perceptual layers {list(indices)} must be non-empty indices in [0, {count - 1}] "
                          f"for {net.spec.arch!r}")
    size = tuple(net.data_config["input_size"][1:])
    mean, std = list(net.data_config["mean"]), list(net.data_config["std"])

    def maps(images: Tensor) -> list[Tensor]:
        if tuple(images.shape[2:]) != size:
            images = F.interpolate(images, size=size, mode="bilinear", antialias=True, align_corners=False)
        return model.forward_intermediates(TF.normalize(images, mean, std), indices=indices, intermediates_only=True)

    with torch.no_grad():
        total = torch.zeros(x.shape[0], device=x.device)
        for a, b in zip(maps(x.to(net.device)), maps(y.to(net.device))):
            a = a / a.norm(dim=1, keepdim=True).clamp_min(_EPS)  # unit length along channels
            b = b / b.norm(dim=1, keepdim=True).clamp_min(_EPS)
            total += (a - b).pow(2).sum(dim=1).flatten(1).mean(dim=1).to(x.device)
    return total / len(indices)


def colour_detail_study(encoder: Any, dataset: Any, split: str = "test", settings: InversionSettings | None = None,
                        device: str | torch.device | None = None,
                        perceptual: PerceptualNet | None = None) -> dict[str, Any]:
    """Invert an encoder's features on a split's images; colour errors and, with a
    perceptual network, the perceptual distance.

    Parameters
    ----------
    encoder : an Encoder, or an EncoderSpec to load on ``device``.
    dataset : image dataset adapter.
    split : split whose images are used.
    settings : inversion settings (default :class:`InversionSettings`).
    device : torch device for a spec (default CUDA when available, else CPU).
    perceptual : local perceptual network, or None for no perceptual distance.

    Returns
    -------
    dict
        ``metrics``: ``colour_mse_red``, ``colour_mse_green``, ``colour_mse_blue``,
        ``colour_mse_mean``, ``perceptual_distance`` (None without a network).
        ``diagnostics``: ``settings``, ``n_images``, ``image_size``, ``sample_indices``,
        ``feature_loss_initial`` / ``feature_loss_final`` (means over batches),
        ``perceptual`` (arch, file name, layers, or None), ``weights_fingerprint``.
        ``examples``: ``originals`` and ``reconstructions``, uint8 (k, H, W, 3).
    """
    settings = settings or InversionSettings()
    if not isinstance(settings, InversionSettings):
        raise ConfigError(f"settings must be InversionSettings, got {type(settings).__name__}")
    if perceptual is not None and not isinstance(perceptual, PerceptualNet):
        raise ConfigError(f"perceptual must be a PerceptualNet or None, got {type(perceptual).__name__}")
    dataset.check_split(split)
    perceptual_spec = perceptual.spec() if perceptual is not None else None  # refused before any work
    encoder = as_encoder(encoder, device)
    net = load_encoder(perceptual_spec, device=encoder.device, autocast=False) if perceptual_spec else None
    indices = pick_samples(dataset.num_samples(split), settings.n_images, settings.seed)
    features = feature_function(encoder)
    generator = torch.Generator().manual_seed(settings.seed)
    originals, recons, infos, distances = [], [], [], []
    for start in range(0, indices.size, settings.batch_size):
        images = load_images(dataset, split, indices[start:start + settings.batch_size], encoder.data_config)
        images = images.to(encoder.device)
        recon, info = invert_features(features, images, settings, generator)
        originals.append(images.cpu())
        recons.append(recon.cpu())
        infos.append(info)
        if net is not None:
            distances.append(perceptual_distance(net, images, recon, perceptual.layers).cpu())
    orig, rec = torch.cat(originals), torch.cat(recons)
    errors = colour_errors(orig, rec)
    weights = [len(range(s, min(s + settings.batch_size, indices.size))) for s in range(0, indices.size,
                                                                                      settings.batch_size)]
    k = min(settings.n_examples, indices.size)
    return {
        "metrics": {**{f"colour_mse_{name}": errors[name] for name in (*CHANNELS, "mean")},
                    "perceptual_distance": float(torch.cat(distances).mean()) if distances else None},
        "diagnostics": {
            "settings": asdict(settings), "n_images": int(indices.size), "image_size": list(orig.shape[2:]),
            "sample_indices": indices.tolist(),
            "feature_loss_initial": float(np.average([i["feature_loss_initial"] for i in infos], weights=weights)),
            "feature_loss_final": float(np.average([i["feature_loss_final"] for i in infos], weights=weights)),
            "perceptual": None if perceptual is None else {
                "arch": perceptual.arch, "file": Path(perceptual.weights).name,
                "layers": None if perceptual.layers is None else list(perceptual.layers)},
            "weights_fingerprint": encoder.weights_fingerprint,
        },
        "examples": {"originals": to_uint8_hwc(orig[:k]), "reconstructions": to_uint8_hwc(rec[:k])},
    }
