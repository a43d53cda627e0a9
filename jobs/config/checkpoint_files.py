"""The files of a ``checkpoints:`` folder: which hold another file's weights (aliases),
and which are checked with the config, before any work.

Aliases, one encoder and not two. A folder often holds, beside the numbered checkpoints, a
file the training code keeps pointing at the newest (or best) one: DINO's ``checkpoint.pth``, Lightning's ``last.ckpt``,
timm's ``last.pth.tar``, a ``latest`` link. Evaluated as an encoder of its own it would be
a second point at one step, a duplicate leaderboard row, and, since it moves, a "change"
at every run. So a file that is the same file as another of its scan (a link), or an
unnumbered file whose tensors equal a numbered one's (a copy: sizes first, then the tensor
fingerprint, :mod:`pipeline.encoders.checkpoints.aliases`), is left out and named as an
alias of the numbered file, which stands for both in the series, the leaderboard and the
alerts. A numbered file has a step in its name: the scan's ``step_pattern`` matches it, or,
without a pattern, its name holds a digit. An unnumbered file equal to no numbered one
(DINO's ``checkpoint.pth`` between two numbered saves) stays an encoder of its own.

Checks. A ``checkpoints:`` folder is checked with the config, before any work, as a file
named under ``encoders:`` is. Two kinds of mistake, told apart:

- the scan's own settings: its ``arch`` and ``layers`` are checked on timm's meta device
  whether or not the folder holds a file yet (:func:`scan_entry_mistakes`);
- its files: each one offered is checked from its header (architecture, the key and prefix
  holding its weights, :func:`jobs.config.encoders.check_encoder`). A file refused alone (a
  torn copy, another architecture beside the folder's own, a malformed pickle: whatever
  its reader raised) is one failure, named with a one-line reason, and the rest of the run
  goes on. When every file a scan offers is refused, the settings are what is wrong (a
  missing ``checkpoint_key: teacher``, the wrong ``arch``): that is a config mistake,
  reported with the others and nothing run (:func:`folder_mistakes`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.config.benchmark import BenchmarkConfig
from jobs.config.encoders import CheckpointScan, EncoderConfig, check_encoder
from jobs.config.mistakes import Mistakes
from jobs.failures import checkpoint_failure, one_line
from pipeline.analysis.series.steps import step_from_name
from pipeline.encoders.checkpoints.names import checkpoint_stem
from pipeline.errors import ConfigError, RepevalError

if TYPE_CHECKING:
    from jobs.config.checkpoint_folders import ScannedFile


# -- aliases: files holding another file's weights ------------------------------------------
_COMPARED = 3  # numbered files an unnumbered one is compared with: its step's (or the one before), the newest


def numbered(scan: CheckpointScan, path: str) -> bool:
    """Whether a file's name gives its step: the scan's ``step_pattern`` matches it, or,
    without one, the name (without its extension) holds a digit."""
    if scan.step_pattern is not None:
        return step_from_name(path, scan.step_pattern) is not None
    return any(ch.isdigit() for ch in checkpoint_stem(Path(path).name))


def alias_line(alias: dict[str, Any]) -> str:
    """One line saying which file an alias stands for."""
    how = "a link to" if alias["how"] == "link" else "a copy of"
    return (f"alias: {alias['file']} is {how} {Path(alias['same_as']).name} (the same weights): evaluated once, "
            f"as {alias['as']}")


def find_aliases(scan: CheckpointScan, files: list[ScannedFile]) -> tuple[list[ScannedFile], list[dict[str, Any]]]:
    """``files`` (one scan's) without the aliases, and one record per alias: ``file``,
    ``encoder`` (the name it would have had), ``same_as`` and ``as`` (the file and encoder
    standing for it), ``step`` and ``how`` (``link`` or ``copy``).

    A file that cannot be read is never an alias: it stays, and its own check names it."""
    if len(files) < 2:
        return list(files), []
    is_numbered = {f.path: numbered(scan, f.path) for f in files}
    standing: dict[str, tuple[ScannedFile, str]] = {}  # alias path -> (the file standing for it, how)
    by_inode: dict[tuple[int, int], list[ScannedFile]] = {}
    for f in files:
        try:
            st = os.stat(f.path)
        except OSError:
            continue
        by_inode.setdefault((st.st_dev, st.st_ino), []).append(f)
    for group in by_inode.values():
        if len(group) > 1:  # links of one file: the numbered real file stands for the others
            group = sorted(group, key=lambda f: (not is_numbered[f.path], Path(f.path).is_symlink(), f.path))
            standing.update({f.path: (group[0], "link") for f in group[1:]})
    candidates = [f for f in files if is_numbered[f.path] and f.path not in standing]
    for f in files:
        if is_numbered[f.path] or f.path in standing:
            continue
        # the numbered file of its own step first (DINO, Lightning and timm save the epoch or step
        # inside), then the newest: the one an alias of the newest equals; at most _COMPARED read
        newest = sorted(candidates, key=lambda g: (-1 if g.encoder.step is None else g.encoder.step, g.path),
                        reverse=True)
        step = f.encoder.step  # saved inside; DINO and MoCo save their file's number + 1 as the epoch
        own = [g for s in (step, None if step is None else step - 1) for g in newest
               if s is not None and g.encoder.step == s]
        order = own + [g for g in newest if g not in own]
        for g in order[:_COMPARED]:
            if _same_weights(f.path, g.path):
                standing[f.path] = (g, "copy")
                break
    kept = [f for f in files if f.path not in standing]
    aliases = [{"file": f.path, "encoder": f.encoder.name, "same_as": g.path, "as": g.encoder.name,
                "step": g.encoder.step, "how": how} for f in files if f.path in standing
               for g, how in [standing[f.path]]]
    return kept, aliases


def _same_weights(a: str, b: str) -> bool:
    # deferred: torch reads the two files only when a folder holds an unnumbered file
    from pipeline.encoders.checkpoints.aliases import same_weights

    try:
        return same_weights(a, b)
    # a file its reader cannot take (whatever it raised) is no alias: its own check refuses it, named
    except Exception:  # noqa: BLE001
        return False


# -- a folder's files checked with the config -----------------------------------------------
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
