"""Reading local checkpoints safely and fingerprinting their tensors.

Only formats that cannot run code are accepted: safetensors, and PyTorch pickles loaded with
``torch.load(weights_only=True)``. A pickle that needs arbitrary objects is refused with
:class:`UnsafeCheckpointError` rather than loaded with ``weights_only=False``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from pipeline.errors import CheckpointError, UnsafeCheckpointError

SAFETENSORS_EXTENSIONS = (".safetensors",)
PICKLE_EXTENSIONS = (".pth", ".pt", ".bin")
CHECKPOINT_EXTENSIONS = SAFETENSORS_EXTENSIONS + PICKLE_EXTENSIONS
# Training scripts commonly nest the weights under one of these keys.
_NESTED_KEYS = ("state_dict", "model")


def load_state_dict(
    path: str | os.PathLike[str],
    strip_prefixes: Iterable[str] = ("module.",),
) -> dict[str, Tensor]:
    """Load a flat ``{name: tensor}`` state dict from a local checkpoint, on CPU.

    ``.safetensors`` files are read with safetensors; ``.pth``/``.pt``/``.bin`` with
    ``torch.load(weights_only=True)``. A dict nested under ``state_dict`` or ``model`` is
    unwrapped (other entries such as optimizer state or epoch are ignored).

    Each prefix of ``strip_prefixes`` is removed, in order, only when *every* key carries it
    (e.g. ``module.`` from DistributedDataParallel, ``backbone.`` from a detector); a prefix
    that only some keys carry is left alone, so no key is renamed by accident.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in CHECKPOINT_EXTENSIONS:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} has unsupported extension {suffix or '(none)'!r}; "
            f"valid extensions: {', '.join(CHECKPOINT_EXTENSIONS)}"
        )
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file {str(path)!r} does not exist")

    raw = _load_safetensors(path) if suffix in SAFETENSORS_EXTENSIONS else _load_pickle(path)
    state_dict = _unwrap(raw, path)
    for prefix in strip_prefixes:
        if prefix and state_dict and all(k.startswith(prefix) for k in state_dict):
            state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot read safetensors checkpoint {path.name!r}: {exc}") from exc


def _load_pickle(path: Path) -> object:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # weights_only refuses any global it does not know: the file would run code to load.
        raise UnsafeCheckpointError(
            f"Refusing to load checkpoint {path.name!r}: it is a pickle that needs arbitrary "
            "code to load (torch.load(weights_only=True) rejected it). Re-save it as "
            "safetensors (safetensors.torch.save_file) or as a plain state dict "
            f"(torch.save(model.state_dict(), ...)). Detail: {str(exc).splitlines()[0]}"
        ) from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(f"Cannot read checkpoint {path.name!r}: {exc}") from exc


def _unwrap(raw: object, path: Path) -> dict[str, Tensor]:
    obj = raw
    while isinstance(obj, Mapping):
        nested = next((k for k in _NESTED_KEYS if isinstance(obj.get(k), Mapping)), None)
        if nested is None:
            break
        obj = obj[nested]
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"Checkpoint {path.name!r} holds a {type(obj).__name__}, not a state dict "
            f"(a mapping of names to tensors, optionally nested under {' or '.join(_NESTED_KEYS)})"
        )
    bad = [str(k) for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise CheckpointError(
            f"Checkpoint {path.name!r} has {len(bad)} entries that are not named tensors "
            f"(e.g. {', '.join(bad[:5])}); expected a state dict, optionally nested under "
            f"{' or '.join(_NESTED_KEYS)}"
        )
    return dict(obj)


def weights_fingerprint(weights: Mapping[str, Tensor] | nn.Module) -> str:
    """SHA-256 over the tensors: sorted (name, dtype, shape, raw bytes).

    Independent of file name, format and mtime: identical tensors give the same fingerprint,
    any changed element a different one.
    """
    state = weights.state_dict() if isinstance(weights, nn.Module) else weights
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach()
        header = f"{name}\x00{str(tensor.dtype)}\x00{tuple(tensor.shape)}\x00{tensor.numel()}\n"
        digest.update(header.encode())
        # Viewing as bytes works for every dtype (bfloat16 has no numpy equivalent).
        flat = tensor.to("cpu").contiguous().reshape(-1)
        if flat.numel():
            digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return digest.hexdigest()
