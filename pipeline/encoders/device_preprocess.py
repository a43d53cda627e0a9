"""timm's evaluation preprocessing on tensors, on the extraction device."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

_JPEG = b"\xff\xd8\xff"


def device_transform_steps(data_config: dict[str, Any]) -> tuple[list[Callable], list[Callable]] | str:
    """timm's eval transform as (per-image uint8 steps, batch float steps), or why not."""
    from timm.data import create_transform
    from torchvision import transforms as T

    per_image: list[Callable] = []
    batch: list[Callable] = []
    for step in create_transform(**data_config, is_training=False).transforms:
        if isinstance(step, (T.Resize, T.CenterCrop)) and not batch:
            per_image.append(step)
        elif type(step).__name__ in ("MaybeToTensor", "ToTensor") and not batch:
            batch.append(_to_unit_float)
        elif isinstance(step, T.Normalize) and batch:
            batch.append(step)
        else:
            return f"timm's eval transform step {type(step).__name__} has no tensor form here"
    return per_image, batch


def _to_unit_float(x: Tensor) -> Tensor:
    return x.to(torch.float32).div_(255.0)  # as ToTensor does to a uint8 PIL image


class DevicePreprocess:
    """Decode and preprocess a batch of encoded images on ``device``."""

    def __init__(self, data_config: dict[str, Any], device: torch.device,
                 fallback: Callable[[int], Image.Image]) -> None:
        steps = device_transform_steps(data_config)
        if isinstance(steps, str):
            raise ValueError(steps)
        self.per_image, self.batch = steps
        self.device = torch.device(device)
        self.fallback = fallback

    def decode(self, encoded: Sequence[Tensor], indices: Sequence[int]) -> list[Tensor]:
        """The files decoded, not yet resized."""
        with warnings.catch_warnings():  # torchvision 0.29 points at TorchCodec for decoding; it has no
            warnings.simplefilter("ignore", DeprecationWarning)  # batched GPU JPEG decoder of this form
            return self._decode(encoded, indices)

    def _decode(self, encoded: Sequence[Tensor], indices: Sequence[int]) -> list[Tensor]:
        from torchvision.io import ImageReadMode, decode_image, decode_jpeg

        out: list[Tensor | None] = [None] * len(encoded)
        jpeg = [k for k, data in enumerate(encoded) if bytes(data[:3].tolist()) == _JPEG]
        if jpeg:
            try:
                decoded = decode_jpeg([encoded[k] for k in jpeg], mode=ImageReadMode.RGB, device=self.device)
            except RuntimeError:  # one file the decoder refuses: each on its own below
                decoded = [None] * len(jpeg)
            for k, image in zip(jpeg, decoded):
                out[k] = image
        for k, data in enumerate(encoded):
            if out[k] is None:
                out[k] = self._one(data, int(indices[k]), decode_image, ImageReadMode.RGB)
        return out

    def _one(self, data: Tensor, index: int, decode_image, mode) -> Tensor:
        try:
            return decode_image(data, mode=mode).to(self.device, non_blocking=True)
        except RuntimeError:  # a format or variant torchvision does not read: PIL, as the PIL path
            image = np.asarray(self.fallback(index).convert("RGB"))
            return torch.from_numpy(image.copy()).permute(2, 0, 1).to(self.device, non_blocking=True)

    def __call__(self, encoded: Sequence[Tensor], indices: Sequence[int]) -> Tensor:
        """The batch ``(n, 3, H, W)`` float32 on the device, as timm's transform gives it."""
        images = []
        for image in self.decode(encoded, indices):
            for step in self.per_image:
                image = step(image)
            images.append(image)
        batch = torch.stack(images)
        for step in self.batch:
            batch = step(batch)
        return batch
