"""The heads trained on frozen maps: a 1x1 convolution (linear, per grid cell), a small
convolutional head, or PSPNet's pyramid pooling head, their outputs upsampled bilinearly
to the targets' resolution."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["HEADS", "POOL_SCALES", "DenseHead", "PyramidPooling", "make_head", "upsample"]

#: ``linear``: one 1x1 convolution; ``conv``: 3x3 convolution, ReLU, 1x1 convolution;
#: ``pspnet``: the pyramid pooling head (module doc).
HEADS = ("pspnet", "conv", "linear")
#: The pyramid's pooled grid sizes (PSPNet's and the seed's).
POOL_SCALES = (1, 2, 3, 6)
_DROPOUT = 0.1


class _BatchNorm(nn.BatchNorm2d):
    """Batch norm that falls back to its running statistics when a training batch holds a
    single value per channel (where batch statistics are undefined)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.training and x.shape[0] * x.shape[2] * x.shape[3] == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return super().forward(x)


class _SeededDropout2d(nn.Module):
    """Channel dropout whose masks come from (seed, training calls so far), not the
    process-wide generator; the call count is a buffer, saved and resumed with the head."""

    def __init__(self, p: float, seed: int) -> None:
        super().__init__()
        self.p, self.seed = float(p), int(seed)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + int(self.calls))
        self.calls += 1
        keep = torch.rand((x.shape[0], x.shape[1], 1, 1), generator=generator) >= self.p
        return x * keep.to(x.device, x.dtype) / (1.0 - self.p)


class PyramidPooling(nn.Module):
    """PSPNet's pyramid pooling head (module doc), (B, d, h, w) -> (B, out, h, w)."""

    def __init__(self, in_channels: int, out_channels: int, hidden: int, seed: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(scale), nn.Conv2d(in_channels, hidden, 1, bias=False),
                          _BatchNorm(hidden), nn.ReLU())
            for scale in POOL_SCALES)
        self.fuse = nn.Sequential(
            nn.Conv2d(in_channels + len(POOL_SCALES) * hidden, hidden, 3, padding=1, bias=False), _BatchNorm(hidden),
            nn.ReLU(), _SeededDropout2d(_DROPOUT, seed), nn.Conv2d(hidden, out_channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        """Outputs on the map's grid."""
        size = x.shape[2:]
        pooled = [F.interpolate(branch(x), size=size, mode="bilinear", align_corners=False)
                  for branch in self.branches]
        return self.fuse(torch.cat([x, *pooled], dim=1))


class DenseHead(nn.Module):
    """Channel standardisation (the train split's per-channel mean and standard deviation,
    fixed, as a frozen batch norm), then the head's convolutions."""

    def __init__(self, layers: nn.Module, mean: Tensor, std: Tensor) -> None:
        super().__init__()
        self.layers = layers
        self.register_buffer("mean", mean.reshape(1, -1, 1, 1).clone())
        self.register_buffer("std", std.reshape(1, -1, 1, 1).clone())

    def forward(self, maps: Tensor) -> Tensor:
        """Outputs on the grid of a batch of channels-last maps."""
        x = maps.permute(0, 3, 1, 2)
        return self.layers((x - self.mean) / self.std)


def make_head(kind: str, in_channels: int, out_channels: int, hidden: int, mean: Tensor, std: Tensor,
              seed: int) -> DenseHead:
    """A head of ``kind`` with seeded initial weights."""
    if kind == "linear":
        layers: nn.Module = nn.Conv2d(in_channels, out_channels, 1)
    elif kind == "pspnet":
        layers = PyramidPooling(in_channels, out_channels, hidden, seed)
    else:
        layers = nn.Sequential(nn.Conv2d(in_channels, hidden, 3, padding=1), nn.ReLU(),
                               nn.Conv2d(hidden, out_channels, 1))
    generator = torch.Generator().manual_seed(int(seed))
    for module in layers.modules():
        if isinstance(module, nn.Conv2d):  # PyTorch's default init, from the cell's generator
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
            if module.bias is not None:
                fan_in = module.weight.shape[1] * module.weight.shape[2] * module.weight.shape[3]
                nn.init.uniform_(module.bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in), generator=generator)
    return DenseHead(layers, mean, std)


def upsample(outputs: Tensor, size: tuple[int, int]) -> Tensor:
    """Grid outputs to the targets' resolution, bilinear (``align_corners=False``: grid cell
    centres sit at the centres of the input pixels they cover)."""
    return F.interpolate(outputs, size=size, mode="bilinear", align_corners=False)
