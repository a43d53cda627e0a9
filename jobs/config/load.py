"""Loading a run config: YAML (or a dict) to a checked ``BenchmarkConfig``, relative paths
taken from the config file's folder.

Loaded into typed dataclasses (``jobs.config.typed``) so a bad file fails on load with the
field's path, before any work: ``protocols[2].settings.n_neighbours: unknown setting of
knn; valid settings: ...``. Reading a config imports neither torch nor timm (the CLI
answers fast); what needs the registries of architectures and adapters is checked by
``jobs.plan.make_plan``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from jobs.config.benchmark import BenchmarkConfig
from jobs.config.bounded_yaml import load_yaml
from jobs.config.protocol_checks import resolve_protocol_paths
from jobs.config.mistakes import check_bounds, check_file_size
from jobs.config.suites import expand_suite
from jobs.config.typed import from_plain
from pipeline.errors import ConfigError
from pipeline.terminal import short

__all__ = ["load_config", "resolve_paths", "resolve_tracker_paths"]

_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def load_config(source: str | os.PathLike | dict) -> BenchmarkConfig:
    """Load and validate a benchmark config from a YAML file or a dict.

    Relative paths in a file (store, checkpoints, encoder weights, dataset roots and other
    path parameters of adapters, suite roots, reference csv, report) are taken relative
    to the file's folder, so a config means the same from any working folder. Oversized
    input is refused first (``jobs.config.bounded_yaml`` while the YAML is parsed,
    ``jobs.config.mistakes`` for a dict); then every mistake found is reported at once, one
    line each.
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
    resolve_protocol_paths(cfg, local)


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
