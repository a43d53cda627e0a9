"""Matching a checkpoint's tensors to an architecture: strict, except the classifier head.

Head tensors in a checkpoint are dropped (the model is built without its classifier);
every other tensor must exist in the model with the same shape, and every model tensor
must be in the checkpoint (BN step counters excepted: eval mode never reads them).

:func:`check_checkpoint_fits` does the comparison from the checkpoint's header (names and
shapes) against the model built on the meta device, so a checkpoint of another
architecture is refused when a config is checked, in milliseconds, without reading weights.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from difflib import SequenceMatcher
from pathlib import Path

import timm
from torch import nn

from pipeline.checkpoints import CHECKPOINT_EXTENSIONS, checkpoint_shapes, load_state_dict
from pipeline.encoders.building import build_on_meta
from pipeline.encoders.spec import EncoderSpec, split_tag
from pipeline.errors import CheckpointError

_MAX_LISTED_KEYS = 10
_GUESS_SECONDS = 3.0  # time allowed for naming the architecture a mismatched checkpoint fits


@dataclass(frozen=True)
class KeyMismatch:
    """How a checkpoint's tensors differ from a model's.

    Parameters
    ----------
    missing : list of str
        Model tensors the checkpoint lacks.
    unexpected : list of str
        Checkpoint tensors the model lacks (head tensors excluded).
    mismatched : list of str
        ``name (checkpoint shape, model shape)`` for tensors of both with other shapes.
    dropped : frozenset of str
        Checkpoint tensors of the classifier head, not loaded.
    """

    missing: list[str]
    unexpected: list[str]
    mismatched: list[str]
    dropped: frozenset[str]

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)

    def summary(self, limit: int = _MAX_LISTED_KEYS) -> str:
        """The differences, each kind with its count and first ``limit`` names.

        Parameters
        ----------
        limit : int
            Names listed per kind.

        Returns
        -------
        str
            ``"<n> missing keys: a, b, ...; <m> shape mismatches: ..."``.
        """
        parts = []
        for what, names in (("missing keys", self.missing), ("unexpected keys", self.unexpected),
                            ("shape mismatches", self.mismatched)):
            if names:
                more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
                parts.append(f"{len(names)} {what}: {', '.join(names[:limit])}{more}")
        return "; ".join(parts)


def compare(shapes: Mapping[str, tuple[int, ...]], model: nn.Module) -> KeyMismatch:
    """Compare a checkpoint's tensor shapes with a model's.

    Parameters
    ----------
    shapes : mapping
        Checkpoint tensor name -> shape.
    model : torch.nn.Module
        The model (on any device, the meta device included).

    Returns
    -------
    KeyMismatch
        The differences; false when the checkpoint fits.
    """
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    heads = _classifier_prefixes(model)
    dropped = frozenset(k for k in shapes if k not in expected and any(k.startswith(h) for h in heads))
    unexpected = sorted(set(shapes) - set(expected) - dropped)
    # num_batches_tracked only counts training steps; eval-mode BN never reads it.
    missing = sorted(k for k in set(expected) - set(shapes) if not k.endswith("num_batches_tracked"))
    mismatched = sorted(
        f"{k} (checkpoint {tuple(shapes[k])}, model {expected[k]})"
        for k in set(shapes) & set(expected)
        if tuple(shapes[k]) != expected[k]
    )
    return KeyMismatch(missing, unexpected, mismatched, dropped)


def _classifier_prefixes(model: nn.Module) -> tuple[str, ...]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("classifier") or ()
    names = (names,) if isinstance(names, str) else tuple(names)
    return tuple(f"{n}." for n in names)


def _prefix_hint(unexpected: list[str], model: nn.Module) -> str:
    firsts = {k.split(".", 1)[0] for k in unexpected if "." in k}
    if len(firsts) == 1:
        prefix = firsts.pop() + "."
        expected = model.state_dict()
        if any(k[len(prefix):] in expected for k in unexpected):
            return f". The unexpected keys share prefix {prefix!r}: add it to strip_prefixes"
    return ""


def checkpoint_path(spec: EncoderSpec) -> Path:
    """The checkpoint file of ``spec``, checked for a known extension and existence.

    Parameters
    ----------
    spec : EncoderSpec
        A spec whose weights are a checkpoint path.

    Returns
    -------
    pathlib.Path
        The file (``~`` expanded).
    """
    path = Path(spec.weights).expanduser()
    if path.suffix.lower() not in CHECKPOINT_EXTENSIONS:
        raise CheckpointError(
            f"weights {spec.weights!r} is neither 'random', 'pretrained', 'timm:<tag>' nor a checkpoint "
            f"with extension {', '.join(CHECKPOINT_EXTENSIONS)}"
        )
    if not path.is_file():
        raise CheckpointError(f"Checkpoint file {spec.weights!r} for encoder {spec.name!r} does not exist")
    return path


def load_checkpoint_into(model: nn.Module, path: Path, spec: EncoderSpec) -> None:
    """Load a checkpoint into ``model``: strict, except head tensors and BN step counters.

    Parameters
    ----------
    model : torch.nn.Module
        The model built for ``spec`` (without classifier).
    path : pathlib.Path
        The checkpoint file.
    spec : EncoderSpec
        The spec (its architecture and key prefixes to strip).

    Raises
    ------
    CheckpointError
        The checkpoint does not fit; the message lists the differences.
    """
    state = load_state_dict(path, strip_prefixes=spec.strip_prefixes)
    mismatch = compare({k: tuple(v.shape) for k, v in state.items()}, model)
    if mismatch:
        raise CheckpointError(f"Checkpoint {path.name!r} does not match architecture {spec.arch!r}: "
                              f"{mismatch.summary()}{_prefix_hint(mismatch.unexpected, model)}")
    model.load_state_dict({k: v for k, v in state.items() if k not in mismatch.dropped}, strict=False)


def check_checkpoint_fits(spec: EncoderSpec) -> None:
    """Refuse a checkpoint that does not fit ``spec.arch``, without reading its weights.

    Reads the checkpoint's tensor names and shapes (the safetensors header, or the state
    dict's keys and shapes) and compares them with the model built on the meta device. A
    spec whose weights are not a checkpoint passes.

    Parameters
    ----------
    spec : EncoderSpec
        The spec to check.

    Raises
    ------
    CheckpointError
        In one line: the file, the architecture, the first differences and, when one is
        found quickly, the architecture the checkpoint does fit, e.g. ``'ckpt.safetensors'
        does not fit resnet18: 102 shape mismatches (fc.weight ...); it looks like resnet50``.
    """
    if spec.weights_kind != "checkpoint":
        return
    path = checkpoint_path(spec)
    model = build_on_meta(spec)
    if model is None:
        return
    shapes = checkpoint_shapes(path, strip_prefixes=spec.strip_prefixes)
    mismatch = compare(shapes, model)
    if not mismatch:
        return
    guess = guess_architecture(shapes, spec)
    looks = f"; it looks like {guess}: set `arch: {guess}`" if guess else ""
    raise CheckpointError(f"{path.name!r} does not fit {spec.arch}: {mismatch.summary(limit=3)}{looks}"
                          f"{_prefix_hint(mismatch.unexpected, model)}")


def guess_architecture(shapes: Mapping[str, tuple[int, ...]], spec: EncoderSpec,
                       seconds: float = _GUESS_SECONDS) -> str | None:
    """An architecture of ``spec.arch``'s family that ``shapes`` fits exactly, if found in time.

    Family members (names starting like ``spec.arch``) are tried most similar name first,
    each built on the meta device, until ``seconds`` have passed.

    Parameters
    ----------
    shapes : mapping
        Checkpoint tensor name -> shape.
    spec : EncoderSpec
        The spec whose architecture did not fit.
    seconds : float
        Time allowed for the search.

    Returns
    -------
    str or None
        The first architecture that fits, or None.
    """
    base = split_tag(spec.arch)[0]
    family = re.match(r"[a-z]+", base)
    if family is None:
        return None
    candidates = sorted((n for n in timm.list_models(f"{family.group(0)}*") if n != base),
                        key=lambda n: (-SequenceMatcher(None, base, n).ratio(), n))
    deadline = time.monotonic() + seconds
    for name in candidates:
        if time.monotonic() > deadline:
            return None
        candidate = EncoderSpec(spec.name, name, input_size=spec.input_size, strip_prefixes=spec.strip_prefixes)
        try:
            model = build_on_meta(candidate)
        except (ValueError, RuntimeError):
            continue
        if model is not None and not compare(shapes, model):
            return name
    return None
