"""Weights an encoder names, checked before any work: one line per problem.

A checkpoint is judged by its tensor names and shapes only (the safetensors header, or a
memory-mapped state dict), against the architecture built on the meta device: a resnet50
checkpoint under ``arch: resnet18`` is refused when the config loads, not after minutes
of extraction. Pretrained weights must be in the local hub cache; the message says how to
give a local file in the config instead.
"""

from __future__ import annotations

import json
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipeline.errors import CheckpointError, ConfigError, HubUnavailableError

_SHOWN = 3  # keys named per kind of mismatch


def pretrained_hint(arch: str) -> str:
    return (f"repeval never downloads; give a local file in the config instead, e.g. "
            f"`weights: checkpoints/{arch}.safetensors` (a path relative to the config file, "
            ".safetensors, .pth, .pt or .bin)")


def check_weights(spec: Any) -> None:
    """Raise a one-line CheckpointError / ConfigError when ``spec``'s weights cannot be used.

    Parameters
    ----------
    spec : pipeline.encoders.EncoderSpec
        The encoder; random weights always pass.
    """
    if spec.weights_kind == "checkpoint":
        check_checkpoint_fits(spec)
    elif spec.weights_kind == "pretrained":
        from pipeline.encoders import load_encoder

        try:
            load_encoder(spec, device="cpu")
        except HubUnavailableError as exc:
            first = str(exc).split(". ")[0]
            raise ConfigError(f"weights {spec.weights!r}: {first}; {pretrained_hint(spec.arch)}") from None


def check_checkpoint_fits(spec: Any) -> None:
    """The checkpoint of ``spec`` is readable and its tensors fit ``spec.arch`` by name and shape.

    Head (classifier) tensors may be missing or of any size; BatchNorm step counters may be
    missing; ``spec.strip_prefixes`` are removed as loading removes them.
    """
    path = Path(spec.weights).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {spec.weights!r} does not exist")
    shapes = _checkpoint_shapes(path)
    for prefix in spec.strip_prefixes:
        if prefix and shapes and all(k.startswith(prefix) for k in shapes):
            shapes = {k[len(prefix):]: v for k, v in shapes.items()}
    expected, heads = _model_shapes(spec.arch, spec.input_size)
    missing = sorted(k for k in set(expected) - set(shapes) if not k.endswith("num_batches_tracked"))
    unexpected = sorted(k for k in set(shapes) - set(expected) if not k.startswith(heads or ("\0",)))
    mismatched = sorted(f"{k} {tuple(shapes[k])} vs {tuple(expected[k])}" for k in set(shapes) & set(expected)
                        if tuple(shapes[k]) != tuple(expected[k]))
    if missing or unexpected or mismatched:
        parts = [f"{len(keys)} {what} (e.g. {', '.join(keys[:_SHOWN])})"
                 for what, keys in (("shape mismatches, checkpoint vs model", mismatched),
                                    ("missing keys", missing), ("unexpected keys", unexpected)) if keys]
        raise CheckpointError(f"checkpoint {path.name!r} does not fit arch {spec.arch!r}: {'; '.join(parts)}; "
                              "check the arch (or strip_prefixes) given for it")


def _checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if path.suffix.lower() == ".safetensors":
        return _safetensors_shapes(path)
    from pipeline.checkpoints import load_state_dict

    return {k: tuple(v.shape) for k, v in load_state_dict(path, strip_prefixes=()).items()}


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes from the header alone; a truncated or garbled file is refused."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if 8 + n > size:
                raise _Truncated(8 + n)
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        shapes = {k: tuple(int(d) for d in v["shape"]) for k, v in header.items() if k != "__metadata__"}
        if 8 + n + end > size:
            raise _Truncated(8 + n + end)
    except _Truncated as short:
        raise CheckpointError(f"safetensors checkpoint {path.name!r} is truncated: its header describes "
                              f"{short.args[0]} bytes, the file holds {size} (still being written?)") from None
    except (struct.error, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read safetensors checkpoint {path.name!r}: {exc}") from None
    return shapes


class _Truncated(Exception):
    """The file is shorter than its header says (caught above, never raised out)."""


@lru_cache(maxsize=32)
def _model_shapes(arch: str, input_size: int | None) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """Parameter shapes of ``arch`` without its classifier, built on the meta device (no memory)."""
    import timm
    import torch

    try:
        with torch.device("meta"):
            try:
                model = timm.create_model(arch, pretrained=False, num_classes=0,
                                          **({"img_size": input_size} if input_size else {}))
            except TypeError:  # a model without img_size (CNNs): the input size changes no shape
                model = timm.create_model(arch, pretrained=False, num_classes=0)
    except RuntimeError as exc:
        raise CheckpointError(f"cannot build {arch!r} to compare a checkpoint with: {exc}") from None
    classifier = (getattr(model, "pretrained_cfg", None) or {}).get("classifier") or ()
    heads = tuple(f"{c}." for c in ((classifier,) if isinstance(classifier, str) else classifier))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, heads
