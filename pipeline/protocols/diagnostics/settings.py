"""Settings of the encoder diagnostics, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.protocols.diagnostics.checks import check_integers
from pipeline.encoders.spec import EncoderSpec
from pipeline.errors import ConfigError

METHODS = ("gradient", "occlusion")

__all__ = ["METHODS", "InversionSettings", "PerceptualNet", "SaliencySettings"]


@dataclass(frozen=True)
class SaliencySettings:
    """How saliency is measured.

    Parameters
    ----------
    method : ``gradient`` or ``occlusion``.
    n_images : test images used (a seeded draw; all when the split is smaller).
    batch_size : images per gradient batch / occluded images per forward pass.
    patch, stride : occlusion square side and step, pixels.
    n_examples : maps kept for pictures.
    seed : seeds the draw of images.
    """

    method: str = "gradient"
    n_images: int = 64
    batch_size: int = 16
    patch: int = 16
    stride: int = 8
    n_examples: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"saliency method {self.method!r} is not one of {', '.join(METHODS)}")
        check_integers("saliency", self, {"n_images": 1, "batch_size": 1, "patch": 1, "stride": 1,
                                          "n_examples": 0, "seed": 0})


@dataclass(frozen=True)
class InversionSettings:
    """How features are inverted.

    Parameters
    ----------
    steps : Adam steps.
    lr : Adam learning rate (pixels are in [0, 1]).
    tv_weight : weight of the total-variation prior.
    init_noise : std of the Gaussian noise added to the grey (0.5) start image.
    n_images : images inverted (a seeded draw; all when the split is smaller).
    batch_size : images inverted together.
    n_examples : reconstructions kept for pictures.
    seed : seeds the draw of images and the start images.
    """

    steps: int = 500
    lr: float = 0.05
    tv_weight: float = 0.1
    init_noise: float = 0.05
    n_images: int = 16
    batch_size: int = 16
    n_examples: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        check_integers("inversion", self, {"steps": 1, "n_images": 1, "batch_size": 1, "n_examples": 0, "seed": 0})
        for name, positive in (("lr", True), ("tv_weight", False), ("init_noise", False)):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (value <= 0 if positive else value < 0):
                raise ConfigError(f"inversion setting {name} must be a finite number "
                                  f"{'> 0' if positive else '>= 0'}, got {value!r}")


@dataclass(frozen=True)
class PerceptualNet:
    """A perceptual network from a local file: timm ``arch`` with the checkpoint ``weights``
    (.safetensors, .pth, .pt, .bin; loaded strictly, classifier tensors dropped).

    Parameters
    ----------
    arch : timm architecture.
    weights : path of the checkpoint file.
    layers : intermediate layers compared (``forward_intermediates`` indices); None: all.
    input_size : square input size the network is built for (ViTs); None: its default.
    """

    arch: str
    weights: str
    layers: tuple[int, ...] | None = None
    input_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("arch", "weights"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"perceptual network {name} must be a non-empty string, got {value!r}")
        if self.layers is not None:
            layers = self.layers
            if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
                raise ConfigError(f"perceptual network layers must be a list of layer indices, got {layers!r}")
            layers = tuple(layers)
            if not layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers):
                raise ConfigError(f"perceptual network layers must be a non-empty list of integers >= 0, "
                                  f"got {list(layers)}")
            object.__setattr__(self, "layers", layers)
        if self.input_size is not None and (isinstance(self.input_size, bool) or not isinstance(self.input_size, int)
                                            or self.input_size < 1):
            raise ConfigError(f"perceptual network input_size must be an integer >= 1, got {self.input_size!r}")

    def spec(self) -> EncoderSpec:
        """The EncoderSpec that loads this network; refuses anything but a local file.

        Returns
        -------
        EncoderSpec
        """
        spec = EncoderSpec(name="perceptual", arch=self.arch, weights=str(self.weights), input_size=self.input_size)
        if spec.weights_kind != "checkpoint":
            raise ConfigError(f"perceptual network weights must be a local checkpoint file, got {self.weights!r} "
                              "(no random or hub weights: the distance would mean nothing)")
        return spec
