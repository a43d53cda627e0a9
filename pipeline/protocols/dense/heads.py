"""The heads trained on frozen maps: a 1x1 convolution (linear, per grid cell) or a small
convolutional head, their outputs upsampled bilinearly to the targets' resolution.

Initial weights come from a generator seeded by the cell's seed (PyTorch's default
initialisation, drawn from that generator), never from the process-wide one, so two
cells trained in threads of one process do not change each other's weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["HEADS", "DenseHead", "make_head", "upsample"]

#: ``linear``: one 1x1 convolution; ``conv``: 3x3 convolution, ReLU, 1x1 convolution.
HEADS = ("linear", "conv")


class DenseHead(nn.Module):
    """Channel standardisation (the train split's per-channel mean and standard deviation,
    fixed, as a frozen batch norm), then the head's convolutions.

    Parameters
    ----------
    layers : torch.nn.Module
        The convolutions, (B, d, h, w) -> (B, out, h, w).
    mean, std : torch.Tensor
        (d,) per-channel statistics of the train maps.
    """

    def __init__(self, layers: nn.Module, mean: Tensor, std: Tensor) -> None:
        super().__init__()
        self.layers = layers
        self.register_buffer("mean", mean.reshape(1, -1, 1, 1).clone())
        self.register_buffer("std", std.reshape(1, -1, 1, 1).clone())

    def forward(self, maps: Tensor) -> Tensor:
        """Outputs on the grid of a batch of channels-last maps.

        Parameters
        ----------
        maps : torch.Tensor
            (B, h, w, d) float32.

        Returns
        -------
        torch.Tensor
            (B, out, h, w).
        """
        x = maps.permute(0, 3, 1, 2)
        return self.layers((x - self.mean) / self.std)


def make_head(kind: str, in_channels: int, out_channels: int, hidden: int, mean: Tensor, std: Tensor,
              seed: int) -> DenseHead:
    """A head of ``kind`` with seeded initial weights.

    Parameters
    ----------
    kind : str
        One of :data:`HEADS`.
    in_channels, out_channels : int
        Map width and outputs per pixel (classes, or 3 for normals).
    hidden : int
        Channels of the ``conv`` head's hidden layer.
    mean, std : torch.Tensor
        The train maps' per-channel statistics.
    seed : int
        Seeds the initial weights.

    Returns
    -------
    DenseHead
    """
    if kind == "linear":
        layers: nn.Module = nn.Conv2d(in_channels, out_channels, 1)
    else:
        layers = nn.Sequential(nn.Conv2d(in_channels, hidden, 3, padding=1), nn.ReLU(),
                               nn.Conv2d(hidden, out_channels, 1))
    generator = torch.Generator().manual_seed(int(seed))
    for module in layers.modules():
        if isinstance(module, nn.Conv2d):  # PyTorch's default init, from the cell's generator
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
            fan_in = module.weight.shape[1] * module.weight.shape[2] * module.weight.shape[3]
            nn.init.uniform_(module.bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in), generator=generator)
    return DenseHead(layers, mean, std)


def upsample(outputs: Tensor, size: tuple[int, int]) -> Tensor:
    """Grid outputs to the targets' resolution, bilinear (``align_corners=False``: grid cell
    centres sit at the centres of the input pixels they cover).

    Parameters
    ----------
    outputs : torch.Tensor
        (B, C, h, w).
    size : tuple of int
        (H, W).

    Returns
    -------
    torch.Tensor
        (B, C, H, W).
    """
    return F.interpolate(outputs, size=size, mode="bilinear", align_corners=False)
