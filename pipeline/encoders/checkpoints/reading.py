"""Reading local checkpoints safely, finding the tensors inside, fingerprinting them."""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import tarfile
import threading
import warnings
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from pipeline.encoders.checkpoints.formats import COMPRESSED, container_format
from pipeline.encoders.checkpoints.names import SAFETENSORS_EXTENSIONS, checked_path, checkpoint_extension
from pipeline.encoders.checkpoints.named_globals import globals_naming_code
from pipeline.encoders.checkpoints.pickle_budget import check_pickle_budget
from pipeline.encoders.checkpoints.storage_sizes import Global
from pipeline.encoders.checkpoints.safetensors_files import read_safetensors
from pipeline.errors import CheckpointError, UnsafeCheckpointError
from pipeline.terminal import printable, short

__all__ = ["ArgsRecord", "USUAL_KEYS", "checked_path", "container_format", "load_state_dict", "location_label",
           "pick_mapping", "read_checkpoint", "tensor_mappings", "torch_message", "weights_fingerprint"]

#: Where training code usually puts the weights inside a checkpoint, most common first.
USUAL_KEYS = ("state_dict", "model", "module", "teacher", "student", "model_ema", "state_dict_ema",
              "ema", "ema_state_dict", "encoder", "backbone", "online_network_state_dict", "network",
              "net", "weights", "params")
# what torch's weights-only unpickler says about a torn file (anything else it refuses would need code)
_DAMAGED = ("truncated", "invalid load key", "ran out of input", "stack underflow", "unexpected eof")
# torch's advice in its messages, never passed on: each points at loading with its unrestricted unpickler
_TORCH_ADVICE = ("weights_only", "weights only", "trusted source", "arbitrary code", "safe_globals", "allowlist",
                 "pickle_module", "docs.pytorch.org", "pytorch.org/docs", "check the recommended steps")
_MAX_DEPTH = 3  # nesting levels searched for mappings of tensors (checkpoint -> state_dict -> model)
_SHOWN = 5


class ArgsRecord:
    """What an ``argparse.Namespace`` in a checkpoint is read as: its attributes, nothing more."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def __repr__(self) -> str:
        return f"ArgsRecord({', '.join(f'{k}={short(v)}' for k, v in self.__dict__.items())})"  # bounded


_RECORDS_LOCK = threading.Lock()
_RECORDS_ALLOWED = False


def _allow_plain_records() -> None:
    """Map the plain records training scripts save to inert stand-ins (once per process)."""
    global _RECORDS_ALLOWED
    with _RECORDS_LOCK:
        if _RECORDS_ALLOWED:
            return
        import numpy as np

        # ArgsRecord under its own name too: a file re-saved after being read here loads again
        records: list[Any] = [(ArgsRecord, "argparse.Namespace"), ArgsRecord]
        records += [(dict, f"{m}.AttributeDict") for m in (
            "lightning.fabric.utilities.data", "lightning_fabric.utilities.data",
            "pytorch_lightning.utilities.parsing", "lightning.pytorch.utilities.parsing")]
        scalar = np.float64(0).__reduce__()[0]  # the function numpy pickles its scalars with
        records += [scalar, (scalar, "numpy.core.multiarray.scalar"), (scalar, "numpy._core.multiarray.scalar"),
                    np.dtype]
        records += sorted({type(np.dtype(c)) for c in "?bhilqBHILQefdgFD"}, key=str)
        torch.serialization.add_safe_globals(records)
        # torch's advice on a protocol 3-5 pickle ("please file an issue"); repeval names the
        # protocol itself where the file cannot be read
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        _RECORDS_ALLOWED = True


def read_checkpoint(path: str | os.PathLike[str], meta: bool = False) -> object:
    """Everything a checkpoint file holds, read safely: a state dict, or the training
    script's whole record (weights under some key, optimizer state, epoch, arguments)."""
    path = checked_path(path)
    try:
        kind = container_format(path)
    except OSError as exc:
        raise CheckpointError(f"Cannot read checkpoint {path.name!r}: {exc}") from exc
    named_safe = checkpoint_extension(path) in SAFETENSORS_EXTENSIONS
    if kind is None:
        raise CheckpointError(
            f"{path.name!r} is not a checkpoint: its {path.stat().st_size} bytes are neither safetensors, "
            "a PyTorch archive (torch.save) nor a pickle of tensors"
        )
    if kind in {name for _, name in COMPRESSED}:
        raise CheckpointError(
            f"{path.name!r} is a {kind}-compressed file, not a checkpoint: decompress it and give the file "
            "inside (a .pth, .pt, .ckpt, .bin or .safetensors)"
        )
    if kind == "torch-tar":
        # torch reads its oldest format only with its unrestricted unpickler: never done here
        raise UnsafeCheckpointError(
            f"Refusing to load checkpoint {path.name!r}: it is in PyTorch's legacy tar format, which cannot be "
            "read without running the code it may hold. Where it was made, save its weights again with "
            "torch.save(model.state_dict(), 'weights.pth') or safetensors.torch.save_file"
        )
    if named_safe and kind != "safetensors":
        # a pickle under a safe name is never unpickled: the name promised it could not run code
        raise CheckpointError(
            f"{path.name!r} is named .safetensors but holds a PyTorch pickle ({kind}); it is not read as "
            "one. Rename it to .pth if it is a torch.save file you mean to load (its pickle is then read "
            "with tensors and plain values only)"
        )
    if kind == "safetensors":
        return read_safetensors(path, meta=meta)
    if kind == "torch-zip" and not zipfile.is_zipfile(path):
        # a zip's directory is written last: without it the file was cut short (torch's own
        # message about miniz's central directory says nothing a user can act on)
        raise CheckpointError(
            f"{path.name!r} is a truncated PyTorch archive: its {path.stat().st_size} bytes end before the "
            "archive's directory (still being written or copied?); use it once it is complete"
        )
    try:  # what the pickle builds besides tensors, bounded before torch builds it
        named = check_pickle_budget(path, kind)
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"Cannot read checkpoint {path.name!r}: {short(str(exc), 300)}") from exc
    # an archive is memory-mapped: tensor bytes are read when used (never, on the meta device)
    return _load_pickle(path, meta=meta, mmap=kind == "torch-zip", named=named)


def tensor_mappings(raw: object) -> dict[str, dict[str, Tensor]]:
    """Every mapping inside a checkpoint that holds tensors under string keys, by where it is."""
    # The top level is ``""``; a mapping under a key is that key (``teacher``), nested ones
    # are joined with ``/`` (``state_dict/model``). Only the tensor entries are kept;
    # searched ``_MAX_DEPTH`` levels deep.
    found: dict[str, dict[str, Tensor]] = {}

    def walk(obj: Mapping, where: str, depth: int) -> None:
        tensors = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, Tensor)}
        if tensors:
            found[where] = tensors
        if depth >= _MAX_DEPTH:
            return
        for k, v in obj.items():
            if isinstance(k, str) and isinstance(v, Mapping):
                walk(v, f"{where}/{k}" if where else k, depth + 1)

    if isinstance(raw, Mapping):
        walk(raw, "", 0)
    return found


def location_label(where: str) -> str:
    """How a location of :func:`tensor_mappings` is named in messages."""
    return short(where) if where else "the top level"  # a key of the file: quoted shortened


def load_state_dict(
    path: str | os.PathLike[str],
    checkpoint_key: str | None = None,
    strip_prefixes: Iterable[str] = ("module.",),
) -> dict[str, Tensor]:
    """A flat ``{name: tensor}`` state dict from a checkpoint, on CPU, without an architecture."""
    # The weights are the only mapping of tensors in the file, or the one at
    # ``checkpoint_key`` (a key, or keys joined with ``/``). Each prefix of
    # ``strip_prefixes`` is removed, in order, only when *every* key carries it. Loading an
    # encoder matches the file to its architecture instead
    # (:func:`pipeline.encoders.checkpoints.fitting.fit_checkpoint`), which also finds the key and
    # the prefix.
    path = checked_path(path)
    found = tensor_mappings(read_checkpoint(path))
    state = pick_mapping(found, checkpoint_key, path.name)
    for prefix in strip_prefixes:
        if prefix and state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def pick_mapping(found: Mapping[str, dict[str, Tensor]], checkpoint_key: str | None, name: str) -> dict[str, Tensor]:
    """The mapping at ``checkpoint_key``, else the only one; a one-line error otherwise."""
    listed = ", ".join(f"{location_label(w)} ({len(t)} tensors)" for w, t in list(found.items())[:8])
    if checkpoint_key is not None:
        if checkpoint_key not in found:
            raise CheckpointError(f"Checkpoint {name!r} has no tensors under checkpoint_key {short(checkpoint_key)}; "
                                  f"it holds tensors at: {listed or 'nowhere'}")
        return dict(found[checkpoint_key])
    if not found:
        raise CheckpointError(f"Checkpoint {name!r} holds no tensors under string names: not a state dict")
    if len(found) > 1:
        raise CheckpointError(f"Checkpoint {name!r} holds several mappings of tensors ({listed}); "
                              "say which with checkpoint_key")
    return dict(next(iter(found.values())))


def _load_pickle(path: Path, meta: bool = False, mmap: bool = False,
                 named: frozenset[Global] | None = None) -> object:
    _allow_plain_records()
    try:
        return torch.load(path, map_location="meta" if meta else "cpu", weights_only=True, mmap=mmap or None)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if any(s in text.lower() for s in _DAMAGED):
            raise CheckpointError(f"Cannot read checkpoint {path.name!r}: a damaged pickle "
                                  f"({torch_message(text)})") from exc
        refused = globals_naming_code(named)
        if "unsupported operand" in text.lower() and refused == []:
            # pickle protocol 4 or 5 (torch.save(..., pickle_protocol=4), plain pickle.dump): opcodes
            # torch's safe loader lacks, though every global it names names no code (named_globals)
            raise CheckpointError(
                f"Cannot read checkpoint {path.name!r}: it was saved with pickle protocol 4 or 5, whose "
                f"opcodes torch's safe loader (weights_only) cannot read ({torch_message(text)}); it names no "
                "code, and nothing in it was run. Where it was made, save it again with torch.save's default "
                "protocol (torch.save(model.state_dict(), 'weights.pth')) or as safetensors "
                "(safetensors.torch.save_file)") from exc
        # weights_only refuses any global it does not know: the file would run code to load.
        why = f"it needs {', '.join(refused[:_SHOWN])}" + (", ..." if len(refused) > _SHOWN else "") \
            if refused and "unsupported operand" in text.lower() else _unsafe_names(path, text)
        raise UnsafeCheckpointError(
            f"Refusing to load checkpoint {path.name!r}: it is a pickle that needs arbitrary "
            f"code to load ({why}). Where it was made, save its weights again as "
            "safetensors (safetensors.torch.save_file) or as a plain state dict (torch.save(model.state_dict(), "
            "'weights.pth'))"
        ) from exc
    except (RuntimeError, OSError, EOFError, ValueError, tarfile.TarError,
            AttributeError, AssertionError, TypeError, KeyError, IndexError) as exc:  # torch's own reader failing
        raise CheckpointError(f"Cannot read checkpoint {path.name!r}: {torch_message(str(exc))}") from exc


def torch_message(text: str) -> str:
    """The line of torch's message that says what went wrong, without its advice: torch
    suggests loading with ``weights_only=False``, which would run whatever the file holds."""
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text[text.index(marker) + len(marker):]
    kept = []
    for line in text.splitlines():
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", line.strip())
                     if s and not any(w in s.lower() for w in _TORCH_ADVICE)]
        if sentences:
            kept.append(" ".join(sentences))
    line = printable(kept[0] if kept else "no detail")
    return line if len(line) <= 300 else line[:297] + "..."


def _unsafe_names(path: Path, text: str) -> str:
    """The globals the pickle needs, as torch lists them (zip archives), else its message."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001  a legacy pickle: the message names the first one
        names = []
    if names:
        return f"it needs {', '.join(names[:_SHOWN])}" + (", ..." if len(names) > _SHOWN else "")
    return torch_message(text)


def weights_fingerprint(weights: Mapping[str, Tensor] | nn.Module) -> str:
    """SHA-256 over the tensors: sorted (name, dtype, shape, raw bytes)."""
    # Independent of file name, format and mtime: identical tensors give the same fingerprint,
    # any changed element a different one.
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
