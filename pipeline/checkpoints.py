"""Reading local checkpoints safely and fingerprinting their tensors.

Only formats that cannot run code are accepted: safetensors, and PyTorch pickles loaded with
``torch.load(weights_only=True)``. A pickle that needs arbitrary objects is refused with
:class:`UnsafeCheckpointError` rather than loaded with ``weights_only=False``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor, nn

from pipeline.errors import CheckpointError, UnsafeCheckpointError

SAFETENSORS_EXTENSIONS = (".safetensors",)
PICKLE_EXTENSIONS = (".pth", ".pt", ".bin")
CHECKPOINT_EXTENSIONS = SAFETENSORS_EXTENSIONS + PICKLE_EXTENSIONS
# Training scripts commonly nest the weights under one of these keys.
_NESTED_KEYS = ("state_dict", "model")
_V = TypeVar("_V")


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

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint file.
    strip_prefixes : iterable of str
        Key prefixes to remove when every key carries them.

    Returns
    -------
    dict
        Tensor name -> tensor, on CPU.

    Raises
    ------
    CheckpointError
        Unsupported extension, missing or unreadable file, or not a state dict.
    UnsafeCheckpointError
        A pickle that would run code to load.
    """
    path = _checked_path(path)
    raw = _load_safetensors(path) if path.suffix.lower() in SAFETENSORS_EXTENSIONS else _load_pickle(path)
    return _strip(_unwrap(raw, path), strip_prefixes)


def checkpoint_shapes(
    path: str | os.PathLike[str],
    strip_prefixes: Iterable[str] = ("module.",),
) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor of a checkpoint, without reading the tensors.

    A ``.safetensors`` file's header is read; a pickle is opened with every tensor on the
    meta device (memory-mapped where the format allows), under the same safety rules and
    key handling as :func:`load_state_dict`.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint file.
    strip_prefixes : iterable of str
        Key prefixes to remove when every key carries them.

    Returns
    -------
    dict
        Tensor name -> shape.
    """
    path = _checked_path(path)
    if path.suffix.lower() in SAFETENSORS_EXTENSIONS:
        shapes = _safetensors_shapes(path)
    else:
        shapes = {k: tuple(v.shape) for k, v in _unwrap(_load_pickle(path, meta=True), path).items()}
    return _strip(shapes, strip_prefixes)


def _checked_path(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in CHECKPOINT_EXTENSIONS:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} has unsupported extension {suffix or '(none)'!r}; "
            f"valid extensions: {', '.join(CHECKPOINT_EXTENSIONS)}"
        )
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file {str(path)!r} does not exist")
    return path


def _strip(entries: dict[str, _V], strip_prefixes: Iterable[str]) -> dict[str, _V]:
    for prefix in strip_prefixes:
        if prefix and entries and all(k.startswith(prefix) for k in entries):
            entries = {k[len(prefix):]: v for k, v in entries.items()}
    return entries


def _check_complete(path: Path) -> None:
    """Refuse a safetensors file shorter than its header says: the usual sign of a checkpoint
    still being copied or written, which deserves a clearer message than a header error."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            needed = 8 + n
            if needed <= size:
                header = json.loads(f.read(n))
                needed += max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                              default=0)
    except (struct.error, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return  # garbled rather than short: safetensors' own error says more
    if needed > size:
        raise CheckpointError(f"safetensors checkpoint {path.name!r} is truncated: its header describes "
                              f"{needed} bytes, the file holds {size} (still being written?)")


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    _check_complete(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot read safetensors checkpoint {path.name!r}: {exc}") from exc


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    _check_complete(path)
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"Cannot read safetensors checkpoint {path.name!r}: {exc}") from exc


def _load_pickle(path: Path, meta: bool = False) -> object:
    try:
        if meta:
            try:  # memory-mapped: no tensor bytes are read (zip-format files only)
                return torch.load(path, map_location="meta", weights_only=True, mmap=True)
            except RuntimeError:
                return torch.load(path, map_location="meta", weights_only=True)
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

    Parameters
    ----------
    weights : mapping or torch.nn.Module
        A state dict, or a module whose state dict is used.

    Returns
    -------
    str
        64 hexadecimal digits.
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
