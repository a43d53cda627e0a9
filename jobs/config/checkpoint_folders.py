"""Turn checkpoint folders into encoders: what the nightly schedule evaluates."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.config.benchmark import BenchmarkConfig
from jobs.config.encoders import CheckpointScan, EncoderConfig, check_encoder
from jobs.config.mistakes import Mistakes
from jobs.run.failures import checkpoint_failure, one_line
from pipeline.analysis.series.steps import checkpoint_step, series_name, step_from_name
from pipeline.encoders.checkpoints.names import checkpoint_extension, checkpoint_stem
from pipeline.errors import ConfigError, RepevalError
from pipeline.plain import to_plain
from storage_schema.provenance import stable_hash

NAME_COLLISION = "NameCollision"  # error type of files refused for a name another file gives

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=@-]")


@dataclass(frozen=True)
class ScannedFile:
    """One checkpoint file found by a scan, as the encoder it becomes."""

    encoder: EncoderConfig
    path: str
    size: int
    mtime_ns: int
    reference_score: float | None = None
    settings: str = ""  # reading_settings(): a failure recorded with other settings is tried again
    origin: int = -1  # the index of its scan in the config's checkpoints: list

    @property
    def signature(self) -> list[int]:
        """What tells a rewritten file from the one seen before."""
        return [self.size, self.mtime_ns]


@dataclass
class ScanResult:
    """What the checkpoint folders hold now, as one run sees them."""

    taken: list[ScannedFile] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # still being written: left for a later scan
    skipped: list[dict[str, Any]] = field(default_factory=list)  # failure records of unchanged bad files
    collisions: list[dict[str, Any]] = field(default_factory=list)  # failure records: files sharing a name
    notes: list[str] = field(default_factory=list)  # folders that gave nothing, and why (scan_note)
    aliases: list[dict[str, Any]] = field(default_factory=list)  # files holding another file's weights
    facts: dict[str, Any] = field(default_factory=dict, repr=False)  # the store's checkpoint facts when scanned

    @property
    def all_skipped(self) -> bool:
        """Every file the folders offer failed before and is unchanged, settings included:
        the folders give this run nothing (said prominently; the run exits 3)."""
        return bool(self.skipped) and not self.taken and not self.collisions

    def signatures(self) -> dict[str, list[int]]:
        """Encoder name -> [size, mtime_ns] of each file taken: what the watcher compares next time."""
        return {f.encoder.name: f.signature for f in self.taken}


_IDENTITY_FIELDS = ("name", "weights", "series", "step")  # which file, not how it is read


def reading_settings(encoder: EncoderConfig, cfg: BenchmarkConfig | None = None) -> str:
    """A hash of the settings that decide how a scanned file is read and evaluated: the
    encoder's fields but its name, file, series and step (``arch``, ``checkpoint_key``,
    ``strip_prefixes``, ``input_size``, ``layers``, ``dtype``...) and the config's
    ``extract:`` settings. A failure recorded under another hash is not "unchanged"."""
    fields = {k: v for k, v in to_plain(encoder).items() if k not in _IDENTITY_FIELDS}
    return stable_hash({"encoder": fields, "extract": to_plain(cfg.extract) if cfg is not None else None},
                       length=16)


def encoder_name(scan: CheckpointScan, path: Path) -> str:
    """The encoder name of a scanned file: the scan's prefix and the file's stem, made safe as a store key."""
    return _UNSAFE.sub("_", f"{scan.name_prefix}{checkpoint_stem(path.name)}").lstrip(".-+=@") or "checkpoint"


def _ready(scan: CheckpointScan, path: Path, mtime_ns: int, now: float) -> bool:
    if scan.done_suffix:
        return path.with_name(path.name + scan.done_suffix).is_file()
    return now - mtime_ns / 1e9 >= scan.settle_seconds


def _sidecar_score(path: Path) -> float | None:
    sidecar = path.with_name(checkpoint_stem(path.name) + ".json")
    if not sidecar.is_file():
        return None
    try:
        score = json.loads(sidecar.read_text()).get("reference_score")
    except (ValueError, OSError, AttributeError):
        return None  # a sidecar being written, or not ours: no reference score
    return float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None


def scan_step(scan: CheckpointScan, path: Path) -> int | None:
    """The checkpoint's training step: from its name (the scan's ``step_pattern``), else from
    its metadata; None when neither gives one (the series section says so)."""
    try:
        return checkpoint_step(path, scan.step_pattern).step
    # no step, or a file that cannot be read (whatever the reader raised): the checkpoint is
    # still offered, and its own check refuses it alone, naming it (never the whole scan)
    except Exception:  # noqa: BLE001
        return None


def scan_note(scan: CheckpointScan) -> str:
    """Why a folder gave no file: it does not exist, or none of its files matches the
    pattern (naming the checkpoint files it does hold, with a pattern that takes them)."""
    folder = Path(scan.path)
    if not folder.is_dir():
        return f"checkpoints folder {scan.path!r} does not exist: nothing taken from it"
    others = sorted(p.name for p in folder.iterdir() if p.is_file() and checkpoint_extension(p.name)
                    and not (scan.done_suffix and p.name.endswith(scan.done_suffix)))
    line = f"checkpoints folder {scan.path!r}: no file matches pattern {scan.pattern!r}"
    if not others:
        return line + " (no checkpoint file in it yet)"
    extensions = {checkpoint_extension(n) for n in others}
    pattern = f"*{next(iter(extensions))}" if len(extensions) == 1 else "*"
    shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    return line + f"; it holds {len(others)} other checkpoint file(s) ({shown}): set `pattern: \"{pattern}\"`"


def scan_files(scan: CheckpointScan, *, ready_only: bool = True, now: float | None = None, steps: bool = True,
               ) -> tuple[list[ScannedFile], list[str]]:
    """(ready files as encoders, paths still being written) in ``scan.path``, sorted by name."""
    # ``ready_only=False`` takes every matching file (what a report or results listing
    # names), ready or not; ``steps=False`` reads no file (each encoder's step left None,
    # for :func:`with_step`).
    now = time.time() if now is None else now
    taken, waiting = [], []
    for path, st in _checkpoint_files(scan):
        if ready_only and not _ready(scan, path, st.st_mtime_ns, now):
            waiting.append(str(path))
            continue
        enc = EncoderConfig(name=encoder_name(scan, path), arch=scan.arch, weights=str(path),
                            layers=list(scan.layers), input_size=scan.input_size,
                            strip_prefixes=list(scan.strip_prefixes), checkpoint_key=scan.checkpoint_key,
                            series=series_name(path, scan.series), step=scan_step(scan, path) if steps else None)
        taken.append(ScannedFile(enc, str(path), st.st_size, st.st_mtime_ns, _sidecar_score(path)))
    return taken, waiting


def _checkpoint_files(scan: CheckpointScan) -> Iterator[tuple[Path, os.stat_result]]:
    """The checkpoint files a scan's pattern matches (no sidecar, marker or log), sorted, with their stat."""
    folder = Path(scan.path)
    if not folder.is_dir():
        return
    for path in sorted(folder.glob(scan.pattern)):
        try:
            st = path.stat()
        except FileNotFoundError:  # removed while scanning
            continue
        if not path.is_file() or (scan.done_suffix and path.name.endswith(scan.done_suffix)):
            continue
        if checkpoint_extension(path.name) is None:  # a sidecar, a log, a marker: not a checkpoint
            continue
        yield path, st


def unsettled(cfg: BenchmarkConfig, now: float) -> list[str]:
    """The files of ``cfg``'s folders still being written at ``now`` (from the listings alone)."""
    return [str(path) for scan in cfg.checkpoints for path, st in _checkpoint_files(scan)
            if not _ready(scan, path, st.st_mtime_ns, now)]


def scan_folder(scan: CheckpointScan, ready_only: bool = False) -> list[tuple[EncoderConfig, float | None]]:
    """Encoders (and sidecar reference scores) for every checkpoint in ``scan.path``, sorted."""
    return [(f.encoder, f.reference_score) for f in scan_files(scan, ready_only=ready_only)[0]]


def scan_checkpoints(cfg: BenchmarkConfig, failed: dict[str, dict[str, Any]] | None = None, *,
                     ready_only: bool = True, retry_failed: bool = False, now: float | None = None) -> ScanResult:
    """Every scan folder of ``cfg`` as a run sees it."""
    # ``failed`` maps a checkpoint's path to its failure record (``size``, ``mtime_ns``): an
    # unchanged file is skipped unless ``retry_failed``. A file that names the checkpoint an
    # ``encoders:`` entry already gives is left to that entry; files that would share a name
    # are refused together (``collisions``), naming each other.
    failed = failed or {}
    given = {e.name: e for e in cfg.encoders}
    out = ScanResult()
    by_name: dict[str, list[tuple[CheckpointScan, ScannedFile]]] = {}
    for i, scan in enumerate(cfg.checkpoints):
        files, waiting = scan_files(scan, ready_only=ready_only, now=now, steps=False)
        out.waiting.extend(waiting)
        if not files and not waiting:  # a wrong path or pattern would otherwise evaluate nothing, silently
            out.notes.append(scan_note(scan))
        files = [dataclasses.replace(f, settings=reading_settings(f.encoder, cfg), origin=i) for f in files]
        # a file that failed unchanged is not read again (no step, no alias check): it costs a stat
        known = [f for f in files if _skipped(failed.get(f.path), f, retry_failed)]
        skip = {f.path for f in known}
        fresh = [with_step(scan, f) for f in files if f.path not in skip]
        fresh, aliases = find_aliases(scan, fresh)  # a copy or a link of a numbered file: one encoder
        out.aliases.extend(aliases)
        files = sorted(known + fresh, key=lambda f: f.path)
        for f in files:
            by_name.setdefault(f.encoder.name, []).append((scan, f))
    for name, found in by_name.items():
        entry = given.get(name)
        if entry is not None:
            found = [(s, f) for s, f in found if not _same_file(entry.weights, f.path)]
            if found:
                others = [f"{f.path}" for _, f in found]
                out.collisions += [_collision(f, f"encoder name {name!r} is already an encoders: entry "
                                                 f"(weights {entry.weights}); also {', '.join(others[:3])}")
                                   for _, f in found]
            continue
        if len(found) > 1:
            paths = [f.path for _, f in found]
            out.collisions += [_collision(f, f"files {', '.join(paths[:4])} all give encoder name {name!r}; "
                                             "rename one, narrow the scan's pattern or set name_prefix")
                               for _, f in found]
            continue
        scan, f = found[0]
        record = failed.get(f.path)
        if _skipped(record, f, retry_failed):
            out.skipped.append(record)
            continue
        out.taken.append(f)
    out.taken.sort(key=lambda f: f.path)
    return out


def with_step(scan: CheckpointScan, f: ScannedFile) -> ScannedFile:
    """``f`` with its encoder's training step (from its name, else read from the file)."""
    step = scan_step(scan, Path(f.path))
    return dataclasses.replace(f, encoder=dataclasses.replace(f.encoder, step=step))


def _skipped(record: dict[str, Any] | None, f: ScannedFile, retry_failed: bool) -> bool:
    return record is not None and not retry_failed and failed_unchanged(record, f)


def failed_unchanged(record: dict[str, Any], f: ScannedFile) -> bool:
    """Whether ``f`` is what ``record`` failed on: the same size and modification time, and
    the same reading settings (a record without them, from an older run, is tried again);
    a name collision is decided afresh each time."""
    return ([record.get("size"), record.get("mtime_ns")] == f.signature and bool(f.settings)
            and record.get("settings") == f.settings and record.get("error_type") != NAME_COLLISION)


def _same_file(weights: str, path: str) -> bool:
    try:
        return Path(weights).expanduser().samefile(path)
    except OSError:
        return False


def _collision(f: ScannedFile, reason: str) -> dict[str, Any]:
    return checkpoint_failure(f.path, f.size, f.mtime_ns, f.encoder.name, f.encoder.arch,
                              f"{NAME_COLLISION}: {reason}", NAME_COLLISION, settings=f.settings)


def wait_for_settled(cfg: BenchmarkConfig, say=None, *, clock=time.time, sleep=time.sleep) -> list[str]:
    """Wait for the files of ``cfg``'s folders that are still settling, at most the longest
    ``settle_seconds`` among their folders; return those still not ready (named by the run)."""
    # A file is ready once unchanged for its folder's ``settle_seconds`` (or, with
    # ``done_suffix``, once its marker exists): one written just before a one-shot run
    # is evaluated by that run. ``say`` gets one line when there is something to wait for.
    start = clock()
    waiting = unsettled(cfg, start)
    if not waiting:
        return []
    limit = max(s.settle_seconds for s in cfg.checkpoints)
    if say is not None:
        say(f"waiting up to {limit:g} s for {len(waiting)} checkpoint(s) still being written: "
            + ", ".join(Path(p).name for p in waiting[:5]) + (", ..." if len(waiting) > 5 else ""))
    while waiting and clock() - start < limit:
        sleep(min(0.5, max(0.0, limit - (clock() - start))))
        waiting = unsettled(cfg, clock())
    return waiting


def with_encoders(cfg: BenchmarkConfig, scanned: list[ScannedFile]) -> BenchmarkConfig:
    """A copy of ``cfg`` with the scanned files as encoders and their sidecar reference scores."""
    out = copy.deepcopy(cfg)
    for f in scanned:
        out.encoders.append(f.encoder)
        if f.reference_score is not None and f.encoder.name not in out.reference.scores:
            out.reference.scores[f.encoder.name] = f.reference_score
    return out


def with_scanned_checkpoints(cfg: BenchmarkConfig, ready_only: bool = False) -> BenchmarkConfig:
    """A copy of ``cfg`` whose encoders include every scanned checkpoint (config wins on names)."""
    return with_encoders(cfg, scan_checkpoints(cfg, ready_only=ready_only).taken)

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
    standing for it), ``step`` and ``how`` (``link`` or ``copy``)."""
    # A file that cannot be read is never an alias: it stays, and its own check names it.
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
