"""Dense targets laid over an encoder's input: the resize and centre crop its images get."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import DatasetError

__all__ = ["geometry_tag", "resample_target", "target_geometry"]


def target_geometry(data_config: Mapping[str, Any]) -> dict[str, Any]:
    """The geometric steps of the encoder's eval transform and the size they give."""
    from timm.data import create_transform
    from torchvision import transforms as T

    steps: list[dict[str, Any]] = []
    for step in create_transform(**dict(data_config), is_training=False).transforms:
        if isinstance(step, T.Resize):
            size = step.size if isinstance(step.size, int) else [int(s) for s in step.size]
            steps.append({"op": "resize", "size": size, "max_size": step.max_size})
        elif isinstance(step, T.CenterCrop):
            steps.append({"op": "center_crop", "size": [int(s) for s in step.size]})
        elif type(step).__name__ in ("MaybeToTensor", "ToTensor") or isinstance(step, T.Normalize):
            continue
        else:
            raise DatasetError(f"the encoder's eval transform has a {type(step).__name__} step; dense targets are "
                               "laid over resize and centre-crop steps only")
    size = [int(s) for s in data_config["input_size"][1:]]
    if not steps or steps[-1]["op"] != "center_crop" or steps[-1]["size"] != size:
        raise DatasetError(f"the encoder's eval transform does not end with a centre crop to {size}; dense targets "
                           "need a fixed input size")
    return {"steps": steps, "size": size}


def geometry_tag(geometry: Mapping[str, Any]) -> str:
    """A short readable name of a geometry for store keys: ``r73-c64x64`` (resize the shorter
    side to 73, crop 64 x 64), ``r64x64-c64x64`` (resize to 64 x 64, then crop)."""
    parts = []
    for step in geometry["steps"]:
        size = step["size"]
        text = str(size) if isinstance(size, int) else "x".join(str(s) for s in size)
        if step["op"] == "resize" and step.get("max_size"):
            text += f"m{step['max_size']}"
        parts.append(("r" if step["op"] == "resize" else "c") + text)
    return "-".join(parts)


def resample_target(target: np.ndarray, geometry: Mapping[str, Any]) -> np.ndarray:
    """``target`` resized and cropped as the encoder's images are, nearest-neighbour."""
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    arr = np.ascontiguousarray(target)
    chw = torch.from_numpy(arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1).copy())
    for step in geometry["steps"]:
        if step["op"] == "resize":
            chw = F.resize(chw, step["size"], interpolation=InterpolationMode.NEAREST_EXACT,
                           max_size=step.get("max_size"), antialias=False)
        else:
            chw = F.center_crop(chw, step["size"])
    out = chw.numpy()
    return out[0] if arr.ndim == 2 else np.ascontiguousarray(out.transpose(1, 2, 0))
