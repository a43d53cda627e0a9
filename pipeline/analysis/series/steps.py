"""The training step of each checkpoint of a series, from its file name or its metadata."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.encoders.checkpoints.facts import recall, remember
from pipeline.errors import CheckpointError, ConfigError
from pipeline.terminal import short

STEP_METADATA_KEYS = ("step", "global_step", "epoch")
_STEP_FIELD = "{step}"


@dataclass(frozen=True)
class CheckpointStep:
    """A checkpoint's place in its series; ``source`` is ``name`` or ``metadata:<key>``.

    Parameters
    ----------
    path : str
        The checkpoint file.
    step : int
        Its training step.
    source : str
        Where the step was read: the file ``name`` or ``metadata:<key>``.
    """

    path: str
    step: int
    source: str


def compile_step_pattern(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    """Turn a step pattern (glob template with ``{step}``, or regex) into a regex.

    Parameters
    ----------
    pattern : str or re.Pattern
        A glob template holding ``{step}`` exactly once, or a regular expression (string or
        compiled) with a named group ``step``.

    Returns
    -------
    re.Pattern
        A regex with a group ``step``. A template's regex is meant for ``fullmatch`` and a
        given regex for ``search``; :func:`step_from_name` applies the right one.
    """
    if isinstance(pattern, re.Pattern):
        regex = pattern
    elif not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"step pattern must be a non-empty string, got {pattern!r}")
    elif "(?P<step>" in pattern:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"step pattern {pattern!r} is not a valid regular expression: {exc}") from exc
    else:
        if pattern.count(_STEP_FIELD) != 1:
            raise ConfigError(
                f"step pattern {pattern!r} must hold {_STEP_FIELD} exactly once (e.g. 'step{{step}}', "
                "'*-ep{step}.safetensors'), or be a regular expression with a group (?P<step>...)"
            )
        before, after = pattern.split(_STEP_FIELD)
        regex = re.compile(f"{_glob_regex(before)}(?P<step>[0-9]+){_glob_regex(after)}")
    if "step" not in regex.groupindex:
        raise ConfigError(f"step pattern regex {regex.pattern!r} has no named group 'step', e.g. (?P<step>\\d+)")
    return regex


def _glob_regex(glob: str) -> str:
    # Non-greedy '*' so that '*{step}' leaves every digit to the step.
    return "".join(".*?" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in glob)


def step_from_name(name: str | os.PathLike[str], pattern: str | re.Pattern[str]) -> int | None:
    """The training step in a checkpoint's file name, or None when the pattern does not match.

    Parameters
    ----------
    name : str or path
        A file name or path (only the last component is matched).
    pattern : str or re.Pattern
        See :func:`compile_step_pattern`.

    Returns
    -------
    int or None
        The step, or None if the name does not match.
    """
    base = Path(name).name
    is_template = isinstance(pattern, str) and "(?P<step>" not in pattern
    regex = compile_step_pattern(pattern)
    if is_template:
        stem = base[: -len(Path(base).suffix)] if Path(base).suffix else base
        match = regex.fullmatch(base) or regex.fullmatch(stem)
    else:
        match = regex.search(base)
    if match is None or match.group("step") is None:
        return None
    return _as_step(match.group("step"), f"file name {base!r}")


def _as_step(value: object, where: str) -> int:
    """An int >= 0 from an int, an integral float, a digit string or a 0-d tensor/array."""
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
        return int(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and value >= 0 and float(value).is_integer():
        return int(value)
    # quoted shortened: a hostile value's whole repr can be gigabytes
    raise CheckpointError(f"The step in {where} must be a whole number >= 0, got {short(value)}")


def read_step_metadata(path: str | os.PathLike[str]) -> tuple[int, str] | None:
    """The step stored in a checkpoint file, without loading its tensors where possible.

    Parameters
    ----------
    path : str or path
        A safetensors file (its header's ``__metadata__`` is read) or a PyTorch file
        (``.pth``, ``.pt``, ``.bin``, ``.ckpt``, ``.pth.tar``: its top-level entries, read
        with ``torch.load(weights_only=True)``, an archive memory-mapped).

    Returns
    -------
    tuple of (int, str) or None
        The step and the key it came from (one of ``STEP_METADATA_KEYS``), or None when the
        file carries none of those keys.
    """
    known, step = recall(path, "step")  # read before from this very file (size, modification time)
    if known:
        return (int(step[0]), str(step[1])) if step else None
    # deferred: the checkpoint readers, which a name pattern (the config) never needs; a safetensors header
    # is read without torch (a scheduled scan of a folder of them stays light)
    from pipeline.encoders.checkpoints.formats import container_format
    from pipeline.encoders.checkpoints.names import checked_path
    from pipeline.encoders.checkpoints.safetensors_files import safetensors_metadata

    path = checked_path(path)
    if container_format(path) == "safetensors":
        entries = safetensors_metadata(path)
    else:  # an archive is memory-mapped: only the top-level values are read
        # deferred: torch.load reads PyTorch files
        from pipeline.encoders.checkpoints.reading import read_checkpoint

        loaded = read_checkpoint(path)
        entries = loaded if isinstance(loaded, Mapping) else {}
    found = next(((_as_step(entries[key], f"{path.name!r} metadata key {key!r}"), key)
                  for key in STEP_METADATA_KEYS if key in entries), None)
    remember(path, "step", list(found) if found else None)
    return found


def checkpoint_step(path: str | os.PathLike[str], pattern: str | re.Pattern[str] | None = None) -> CheckpointStep:
    """A checkpoint's step: from its name when ``pattern`` matches, else from its metadata.

    Parameters
    ----------
    path : str or path
        The checkpoint file.
    pattern : str, re.Pattern or None
        Step pattern for the file name (see :func:`compile_step_pattern`); None reads the
        metadata only.

    Returns
    -------
    CheckpointStep
        The path, the step and where it came from.
    """
    if pattern is not None:
        step = step_from_name(path, pattern)
        if step is not None:
            return CheckpointStep(str(path), step, "name")
    found = read_step_metadata(path)
    if found is None:
        tried = f"the name does not match the step pattern {getattr(pattern, 'pattern', pattern)!r} and " if pattern else ""
        raise CheckpointError(
            f"No training step for checkpoint {Path(path).name!r}: {tried}its metadata has none of the keys "
            f"{', '.join(STEP_METADATA_KEYS)}. Give a step pattern matching the file name or save the step "
            "in the checkpoint."
        )
    return CheckpointStep(str(path), found[0], f"metadata:{found[1]}")


def order_series(
    paths: Iterable[str | os.PathLike[str]], pattern: str | re.Pattern[str] | None = None
) -> list[CheckpointStep]:
    """The checkpoints of one series sorted by step.

    Parameters
    ----------
    paths : iterable of str or path
        The series' checkpoint files.
    pattern : str, re.Pattern or None
        Step pattern for the file names; None reads the metadata.

    Returns
    -------
    list of CheckpointStep
        Sorted by increasing step. Two files with the same step, or steps from different
        metadata keys (steps mixed with epochs), raise ``CheckpointError``.
    """
    steps = [checkpoint_step(p, pattern) for p in paths]
    sources = sorted({s.source for s in steps if s.source != "name"})
    if len(sources) > 1 or (sources and any(s.source == "name" for s in steps)):
        shown = ", ".join(f"{Path(s.path).name}: {s.source}" for s in steps[:10])
        raise CheckpointError(
            f"The series' steps come from different places ({shown}); steps, global steps and epochs "
            "cannot be ordered together. Use one step pattern or one metadata key for every checkpoint."
        )
    steps.sort(key=lambda s: s.step)
    for earlier, later in zip(steps, steps[1:]):
        if earlier.step == later.step:
            raise CheckpointError(
                f"Checkpoints {Path(earlier.path).name!r} and {Path(later.path).name!r} both have step "
                f"{earlier.step}; a series needs one checkpoint per step"
            )
    return steps


def series_name(path: str | os.PathLike[str], declared: str | None = None) -> str:
    """The series a scanned checkpoint belongs to: the declared name, else its folder's name.

    Parameters
    ----------
    path : str or path
        The checkpoint file.
    declared : str or None
        A ``series:`` name given in the configuration.

    Returns
    -------
    str
        The series name.
    """
    if declared is not None:
        if not isinstance(declared, str) or not declared.strip():
            raise ConfigError(f"series name must be a non-empty string, got {declared!r}")
        return declared
    # the folder the file was found in, as given: a link into another folder keeps its own
    return Path(os.path.abspath(path)).parent.name




_EPOCH_IN_NAME = re.compile(r"(?:^|[^a-z])epoch[=_-]?(?P<epoch>[0-9]+)", re.IGNORECASE)


def checkpoint_epoch(path: str | os.PathLike[str]) -> int | None:
    """A checkpoint's training epoch where it says so, for tables beside its step."""
    found = _EPOCH_IN_NAME.search(Path(path).name)
    if found is not None:
        return int(found.group("epoch"))
    if not str(path).endswith(".safetensors"):
        return None
    from safetensors import safe_open  # the header only: no tensor, no torch

    try:
        with safe_open(str(path), framework="numpy") as handle:
            value = (handle.metadata() or {}).get("epoch")
        return None if value is None else _as_step(value, f"{Path(path).name!r} metadata key 'epoch'")
    except Exception:  # noqa: BLE001  unreadable or moved since: the epoch is not known
        return None
