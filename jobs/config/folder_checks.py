"""A ``checkpoints:`` folder checked with the config, before any work, as a file named under
``encoders:`` is.

Two kinds of mistake, told apart:

- the scan's own settings: its ``arch`` and ``layers`` are checked on timm's meta device
  whether or not the folder holds a file yet (:func:`scan_entry_mistakes`);
- its files: each one offered is checked from its header (architecture, the key and prefix
  holding its weights, :func:`jobs.config.weights.check_encoder`). A file refused alone (a
  torn copy, another architecture beside the folder's own, a malformed pickle: whatever
  its reader raised) is one failure, named with a one-line reason, and the rest of the run
  goes on. When every file a scan offers is refused, the settings are what is wrong (a
  missing ``checkpoint_key: teacher``, the wrong ``arch``): that is a config mistake,
  reported with the others and nothing run (:func:`folder_mistakes`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.config.benchmark import BenchmarkConfig
from jobs.config.encoders import EncoderConfig
from jobs.config.mistakes import Mistakes
from jobs.config.weights import check_encoder
from jobs.failures import checkpoint_failure, one_line
from pipeline.errors import ConfigError, RepevalError

if TYPE_CHECKING:  # type hints only
    from jobs.config.checkpoint_folders import ScannedFile

_LISTED = 5  # files named per refused folder


def scan_entry_mistakes(cfg: BenchmarkConfig) -> tuple[Mistakes, set[int]]:
    """The mistakes of the scans' own settings (an ``arch`` timm does not know, ``layers`` it
    lacks: checked on the meta device, whether or not the folder holds a file yet), and
    which scans, by index, they are in."""
    mistakes, bad = Mistakes(), set()
    for i, scan in enumerate(cfg.checkpoints):
        probe = EncoderConfig(name="scan", arch=scan.arch, weights="random", layers=list(scan.layers),
                              input_size=scan.input_size)
        try:
            check_encoder(probe)
        except RepevalError as exc:
            bad.add(i)
            mistakes.add(ConfigError(f"config.checkpoints[{i}] ({scan.path}): {exc}"))
    return mistakes, bad


def check_scanned_files(files: list[ScannedFile]) -> tuple[list[ScannedFile], list[dict[str, Any]]]:
    """(files that pass, failure records of those refused): each file alone, from its
    header; any error of its reader (not only a CheckpointError) refuses that file only."""
    taken, refused = [], []
    for f in files:
        try:
            check_encoder(f.encoder)
        # one file among many, whatever its reader raised (a malformed pickle's TypeError too): refused alone,
        # named, in one line; the run goes on with the others
        except Exception as exc:  # noqa: BLE001
            reason = one_line(exc)
            if not isinstance(exc, RepevalError):
                reason = f"cannot read {Path(f.path).name!r} as a checkpoint: {reason}"
            refused.append(checkpoint_failure(f.path, f.size, f.mtime_ns, f.encoder.name, f.encoder.arch, reason,
                                              type(exc).__name__, settings=f.settings))
            continue
        taken.append(f)
    return taken, refused


def folder_mistakes(cfg: BenchmarkConfig, offered: list[ScannedFile], refused: list[dict[str, Any]],
                    skip: set[int] = frozenset()) -> Mistakes:
    """A mistake per scan (not in ``skip``) that offered files and had every one refused by
    its check: the settings do not fit the folder. Names up to five files and their reasons."""
    mistakes = Mistakes()
    why = {r["file"]: r["reason"] for r in refused}
    for i, scan in enumerate(cfg.checkpoints):
        mine = [f for f in offered if f.origin == i]
        if i in skip or not mine or any(f.path not in why for f in mine):
            continue
        mistakes.add(ConfigError(
            f"config.checkpoints[{i}] ({scan.path}): none of its {len(mine)} checkpoint file(s) can be used with "
            "these settings (arch, checkpoint_key, strip_prefixes, layers); nothing was run"))
        for f in mine[:_LISTED]:
            mistakes.add(ConfigError(f"config.checkpoints[{i}]: {why[f.path]}"))
        if len(mine) > _LISTED:
            mistakes.add(ConfigError(f"config.checkpoints[{i}]: ... and {len(mine) - _LISTED} more file(s)"))
    return mistakes
