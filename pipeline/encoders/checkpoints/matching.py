"""Whether a checkpoint fits an architecture, checked from its header; loading it into a model."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from difflib import SequenceMatcher
from pathlib import Path

import timm
from torch import nn

from pipeline.encoders.checkpoints.names import CHECKPOINT_EXTENSIONS, checked_path, checkpoint_extension
from pipeline.encoders.checkpoints.reading import read_checkpoint
from pipeline.encoders.building import build_on_meta
from pipeline.encoders.checkpoints.fitting import CheckpointFit, KeyMismatch, compare, fit_checkpoint
from pipeline.encoders.spec import EncoderSpec, split_tag
from pipeline.errors import CheckpointError

__all__ = ["CheckpointFit", "KeyMismatch", "check_checkpoint_fits", "checkpoint_path", "compare",
           "guess_architecture", "load_checkpoint_into"]

# Naming the architecture a mismatched checkpoint fits: the most similar names of its family,
# each built on the meta device (tens of milliseconds). A count, so the advice is the same on a
# loaded machine; the time limit only guards against a pathologically slow one.
_GUESS_CANDIDATES = 24
_GUESS_SECONDS = 30.0


def checkpoint_path(spec: EncoderSpec) -> Path:
    """The checkpoint file of ``spec`` as given (a symlink keeps its name), checked for a
    known extension and existence."""
    path = Path(spec.weights).expanduser()
    if checkpoint_extension(path) is None:
        raise CheckpointError(
            f"weights {spec.weights!r} is neither 'random', 'pretrained', 'timm:<tag>' nor a checkpoint "
            f"with extension {', '.join(CHECKPOINT_EXTENSIONS)}"
        )
    if not path.is_file():
        try:
            checked_path(path)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc} (encoder {spec.name!r})") from None
    return path


def load_checkpoint_into(model: nn.Module, path: Path, spec: EncoderSpec) -> CheckpointFit:
    """Load a checkpoint into ``model``, fitted to it (:func:`fit_checkpoint`): the tensors
    the backbone needs, from the mapping and under the prefix that hold them."""
    fit = fit_checkpoint(read_checkpoint(path), model, path.name, spec.arch, spec.checkpoint_key,
                         spec.strip_prefixes)
    model.load_state_dict(fit.state, strict=False)
    return fit


def check_checkpoint_fits(spec: EncoderSpec) -> CheckpointFit | None:
    """Refuse a checkpoint that does not fit ``spec.arch``, without reading its weights.

    Reads the checkpoint's tensor names and shapes (the safetensors header, or a PyTorch
    file on the meta device) and fits them to the model built on the meta device. A spec
    whose weights are not a checkpoint passes.

    Parameters
    ----------
    spec : EncoderSpec
        The spec to check.

    Returns
    -------
    CheckpointFit or None
        What loading will take and do (meta tensors); None when there is no checkpoint.

    Raises
    ------
    CheckpointError
        In one line: the file, the architecture, the first differences and, when one is
        found quickly, the architecture the checkpoint does fit, e.g. ``'ckpt.safetensors'
        does not fit resnet18: 102 shape mismatches (fc.weight ...); it looks like resnet50``.
    """
    if spec.weights_kind != "checkpoint":
        return None
    path = checkpoint_path(spec)
    model = build_on_meta(spec)
    if model is None:
        return None
    raw = read_checkpoint(path, meta=True)
    return fit_checkpoint(raw, model, path.name, spec.arch, spec.checkpoint_key, spec.strip_prefixes,
                          guess=lambda shapes: guess_architecture(shapes, spec))


def guess_architecture(shapes: Mapping[str, tuple[int, ...]], spec: EncoderSpec,
                       seconds: float = _GUESS_SECONDS, candidates: int = _GUESS_CANDIDATES) -> str | None:
    """An architecture of ``spec.arch``'s family that ``shapes`` fits exactly, if found in time."""
    # Family members (names starting like ``spec.arch``) are tried most similar name first,
    # each built on the meta device: at most ``candidates`` of them, within ``seconds``.
    base = split_tag(spec.arch)[0]
    family = re.match(r"[a-z]+", base)
    if family is None:
        return None
    names = sorted((n for n in timm.list_models(f"{family.group(0)}*") if n != base),
                   key=lambda n: (-SequenceMatcher(None, base, n).ratio(), n))
    deadline = time.monotonic() + seconds
    for name in names[:candidates]:
        if time.monotonic() > deadline:
            return None
        candidate = EncoderSpec(spec.name, name, input_size=spec.input_size)
        try:
            model = build_on_meta(candidate)
        except (ValueError, RuntimeError):
            continue
        if model is not None and not compare(shapes, model):
            return name
    return None
