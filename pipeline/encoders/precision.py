"""The forward pass's precision: which autocast dtype a precision setting means on a device."""

from __future__ import annotations

import torch

from pipeline.errors import ConfigError

__all__ = ["PRECISIONS", "autocast_dtype"]

PRECISIONS = ("auto", "float32", "float16", "bfloat16")


def autocast_dtype(precision: str | None, device: torch.device, autocast: bool | None = None) -> torch.dtype | None:
    """The autocast dtype of ``precision`` on ``device`` (None: float32 throughout)."""
    if precision is None:
        on = device.type == "cuda" if autocast is None else bool(autocast and device.type == "cuda")
        return torch.float16 if on else None
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return torch.float16 if device.type == "cuda" else None
    return None if precision == "float32" else getattr(torch, precision)
