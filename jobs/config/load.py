"""Loading a run config: YAML (or a dict) to a checked ``BenchmarkConfig``, relative paths
taken from the config file's folder."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from jobs.config.benchmark import BenchmarkConfig
from jobs.config.mistakes import MAX_TEXT, MAX_VALUES, check_bounds, check_file_size
from jobs.config.protocols import resolve_protocol_paths
from jobs.config.suites import expand_suite
from jobs.config.typed import from_plain
from pipeline.errors import ConfigError
from pipeline.terminal import printable, short

__all__ = ["MAX_ALIASES", "MAX_DEPTH", "check_events", "load_config", "load_yaml", "resolve_paths", "resolve_tracker_paths"]


_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def load_config(source: str | os.PathLike | dict) -> BenchmarkConfig:
    """Load and validate a benchmark config from a YAML file or a dict.

    Relative paths in a file (store, checkpoints, encoder weights, dataset roots and other
    path parameters of adapters, suite roots, reference csv, report) are taken relative
    to the file's folder, so a config means the same from any working folder. Oversized
    input is refused first (``load_yaml`` while the YAML is parsed,
    ``jobs.config.mistakes`` for a dict); then every mistake found is reported at once, one
    line each.

    Parameters
    ----------
    source : str, os.PathLike or dict
        A YAML file, or the config as a dict (paths then relative to the working folder).

    Returns
    -------
    BenchmarkConfig
        The checked config, its paths absolute.
    """
    if isinstance(source, dict):
        data = source
        base = Path.cwd()
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        check_file_size(path, path.stat().st_size)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not valid YAML: {short(str(exc), 400)}") from None
        data = load_yaml(text, str(path))  # aliases, merge keys and nesting bounded while it is parsed
        base = path.resolve().parent
    check_bounds(data)  # before anything walks it: an alias bomb is a few lines of YAML
    cfg = from_plain(BenchmarkConfig, expand_suite(data, base), "config")  # `suite:` -> its entries
    resolve_paths(cfg, base)
    return cfg


def resolve_paths(cfg: BenchmarkConfig, base: Path) -> None:
    """Make the config's relative paths absolute from ``base`` (the config file's folder).

    URLs and absolute paths stay as they are; checkpoint paths keep their own file name
    (a link is not followed); dataset parameters are the ones an adapter annotates as paths.

    Parameters
    ----------
    cfg : BenchmarkConfig
        The config, changed in place.
    base : Path
        The folder relative paths are taken from.
    """
    def local(p: str) -> str:
        return p if "://" in p or os.path.isabs(p) else str((base / p).resolve())

    def as_given(p: str) -> str:  # a checkpoint link keeps its own name (last.pth -> last.ckpt)
        return p if "://" in p or os.path.isabs(p) else os.path.normpath(os.path.join(base.resolve(), p))

    cfg.store = local(cfg.store)
    cfg.report.path = local(cfg.report.path)
    resolve_tracker_paths(cfg, base, local)
    if cfg.reference.csv:
        cfg.reference.csv = local(cfg.reference.csv)
    for scan in cfg.checkpoints:
        scan.path = as_given(scan.path)
    for enc in cfg.encoders:
        if enc.weights not in ("random", "pretrained") and not enc.weights.startswith("timm:"):
            enc.weights = as_given(os.path.expanduser(enc.weights))
    # deferred: the dataset adapters and PIL load when a config names datasets (their signatures only, no
    # torch), not at the CLI's start
    from pipeline.datasets.catalog import path_parameters

    for ds in cfg.datasets:  # root, csv_path, ...: the parameters annotated as paths
        for key in path_parameters(ds.adapter):
            value = ds.params.get(key)
            if isinstance(value, str) and value.strip():
                ds.params[key] = local(os.path.expanduser(value))
    if cfg.extract.scratch_dir:
        cfg.extract.scratch_dir = local(cfg.extract.scratch_dir)
    resolve_protocol_paths(cfg.protocols, local)


def resolve_tracker_paths(cfg: BenchmarkConfig, base: Path, local: Callable[[str], str]) -> None:
    """``report.trackers``' folders made absolute, and their defaults beside the report: a
    tensorboard ``dir`` of ``tensorboard/``, an mlflow ``tracking_uri`` of the ``file:`` URI
    of ``mlruns/``; a tracking URI that is a plain path becomes that folder's ``file:`` URI."""
    beside = base if "://" in cfg.report.path else Path(cfg.report.path).parent
    for tracker in cfg.report.trackers:
        if tracker.kind == "tensorboard":
            tracker.dir = local(os.path.expanduser(tracker.dir)) if tracker.dir else str(beside / "tensorboard")
        elif tracker.kind == "mlflow":
            uri = tracker.tracking_uri
            if uri is None:
                tracker.tracking_uri = (beside / "mlruns").resolve().as_uri()
            elif not _URI_SCHEME.match(uri):
                tracker.tracking_uri = Path(local(os.path.expanduser(uri))).as_uri()


# -- YAML read under a budget, while it is parsed -------------------------------------------
MAX_DEPTH = 50  # a config nests a handful of levels
MAX_ALIASES = 1_000  # a config reuses a few anchors

# libyaml's parser and scanner where installed (the constructor is PyYAML's own, in Python)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NODE = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.AliasEvent)
_END = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


class _Frame:
    """An open mapping or list: whether a key comes next, and the counts when it opened."""

    __slots__ = ("is_map", "key_next", "anchor", "values", "text", "as_key")

    def __init__(self, is_map: bool, anchor: str | None, values: int, text: int, as_key: bool) -> None:
        self.is_map, self.key_next, self.anchor = is_map, True, anchor
        self.values, self.text, self.as_key = values, text, as_key


def load_yaml(text: str, name: str) -> Any:
    """The plain data of a YAML config, refused over the budget above before it is built."""
    try:
        check_events(yaml.parse(text, Loader=_LOADER), name)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506  a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML{_where(exc)}") from None


def _where(exc: yaml.YAMLError) -> str:
    """`` at line L, column C: what is wrong`` (the parser's own words, on one line)."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:
        return f": {short(str(exc), 400)}"
    context = getattr(exc, "context", None)
    what = printable(" ".join((f"{problem} ({context})" if context else str(problem)).split()))
    return f" at line {mark.line + 1}, column {mark.column + 1}: {what[:300]}"


def check_events(events: Any, name: str) -> None:  # noqa: C901  one branch per kind of event
    """Count the values, text, depth and aliases of a YAML event stream; refuse the first budget passed."""
    values = text = aliases = 0
    stack: list[_Frame] = []
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (values, characters) it stands for
    for event in events:
        if isinstance(event, _NODE):
            as_key = bool(stack) and stack[-1].is_map and stack[-1].key_next
            counted = 0 if as_key else 1
            anchor = getattr(event, "anchor", None)
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    _refuse(name, event, f"more than {MAX_ALIASES:,} aliases; a config uses at most {MAX_ALIASES:,}")
                if any(f.anchor == anchor for f in stack):
                    _refuse(name, event, f"alias *{short(anchor, 40)} is inside the value it names (a value that "
                                         "holds itself)")
                v, t = sizes.get(anchor, (1, 0))  # an undefined alias: the loader names it
                values += v * counted
                text += t
                _done(stack)
            elif isinstance(event, yaml.ScalarEvent):
                values += counted
                text += len(event.value)
                if anchor is not None:
                    sizes[anchor] = (1, len(event.value))
                _done(stack)
            else:
                values += counted
                stack.append(_Frame(isinstance(event, yaml.MappingStartEvent), anchor, values - counted, text, as_key))
                if len(stack) > MAX_DEPTH:
                    _refuse(name, event, f"values nested more than {MAX_DEPTH} levels deep; a config nests at "
                                         f"most {MAX_DEPTH}")
        elif isinstance(event, _END):
            frame = stack.pop()
            if frame.anchor is not None:
                sizes[frame.anchor] = (values - frame.values + (1 if frame.as_key else 0), text - frame.text)
            _done(stack)
        else:
            continue
        if values > MAX_VALUES:
            _refuse(name, event, f"the config holds more than {MAX_VALUES:,} values (a YAML alias or merge key "
                                 f"repeats what it names); a config holds at most {MAX_VALUES:,}")
        if text > MAX_TEXT:
            _refuse(name, event, f"the config's text passes {MAX_TEXT:,} characters (a YAML alias repeats what "
                                 f"it names); a config holds at most {MAX_TEXT:,}")


def _done(stack: list[_Frame]) -> None:
    """A node ended: in a mapping, a key is followed by its value and a value by a key."""
    if stack and stack[-1].is_map:
        stack[-1].key_next = not stack[-1].key_next


def _refuse(name: str, event: Any, what: str) -> None:
    mark = event.start_mark
    raise ConfigError(f"config: {name}, line {mark.line + 1}, column {mark.column + 1}: {what}")
