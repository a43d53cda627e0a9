"""The benchmark configuration: one YAML file names everything a run does.

Loaded into typed dataclasses (jobs.config.typed) so a bad file fails on load with the field's
path, before any work: ``protocols[2].settings.n_neighbours: unknown setting of knn;
valid settings: ...``. Reading a config imports neither torch nor timm (the CLI answers
fast); what needs the registries of architectures and adapters is checked by
``jobs.plan.make_plan``.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jobs.config.mistakes import Mistakes, check_bounds, check_file_size, check_no_credentials
from jobs.config.protocol_checks import check_correlation_layers, check_protocol_entry, resolve_protocol_paths
from jobs.config.extract import DECODERS, DTYPES, PRECISIONS, ExtractConfig  # noqa: F401  (re-exported)
from jobs.config.typed import from_plain, to_plain
from jobs.config.weights import check_checkpoint_fields
from pipeline.errors import ConfigError, InvalidNameError
from pipeline.names import validate_name
from pipeline.terminal import short
from storage_schema.provenance import stable_hash


def _name(value: str, path: str) -> None:
    try:
        validate_name(value, path)
    except InvalidNameError as exc:
        raise ConfigError(str(exc)) from None


ENCODER_SOURCES = ("extract", "store")  # features computed by the run, or already in the store


def layer_shorthands(data: dict, path: str) -> dict:
    """``layers`` entries may be mappings, ``{layer: block11, tokens: true}``: that block's
    token features (n, T, d) rather than pooled ones, i.e. the layer ``block11.tokens``."""
    layers = data.get("layers")
    if not isinstance(layers, list) or not any(isinstance(v, dict) for v in layers):
        return data
    names = []
    for i, entry in enumerate(layers):
        if not isinstance(entry, dict):
            names.append(entry)
            continue
        unknown = sorted(set(entry) - {"layer", "tokens"})
        if unknown or not isinstance(entry.get("layer"), str) or not isinstance(entry.get("tokens", False), bool):
            raise ConfigError(f"{path}.layers[{i}]: {entry!r}; a layer is a name (e.g. block3) or a mapping "
                              "{layer: <name>, tokens: true|false}")
        names.append(entry["layer"] + (".tokens" if entry.get("tokens") else ""))
    return {**data, "layers": names}


@dataclass
class EncoderConfig:
    """The config's fields of one encoder; :meth:`spec` builds the ``EncoderSpec`` that
    loads it (kept apart so that reading a config never imports torch or timm).

    ``dtype`` stores this encoder's features as float16 or float32 whatever
    ``extract.dtype`` says. ``source: store`` names features already in the store
    (``repeval import-features``): they are evaluated, never extracted, and ``arch``,
    ``weights`` and the rest are not needed.
    """

    name: str
    arch: str = ""
    weights: str = "random"
    seed: int = 0
    layers: list[str] = field(default_factory=lambda: ["pre_logits"])
    input_size: int | None = None
    strip_prefixes: list[str] = field(default_factory=list)  # prefix parts tried besides the usual ones
    checkpoint_key: str | None = None  # where a checkpoint holding several state dicts keeps the weights
    dtype: str | None = None  # None: extract.dtype
    source: str = "extract"
    series: str | None = None  # a checkpoint series this encoder belongs to (set by a scan, or given)
    step: int | None = None  # its training step in that series

    @staticmethod
    def prepare_plain(data: dict, path: str) -> dict:
        return layer_shorthands(data, path)

    def check(self, path: str) -> None:
        _name(self.name, f"{path}.name")
        for i, layer in enumerate(self.layers):
            _name(layer, f"{path}.layers[{i}]")
        if self.step is not None and (isinstance(self.step, bool) or self.step < 0):
            raise ConfigError(f"{path}.step: {self.step!r} must be a training step >= 0")
        if self.series is not None and not self.series.strip():
            raise ConfigError(f"{path}.series: must not be empty")
        if self.source not in ENCODER_SOURCES:
            raise ConfigError(f"{path}.source: {self.source!r} is not one of {', '.join(ENCODER_SOURCES)}")
        if self.source == "extract" and not self.arch.strip():
            raise ConfigError(f"{path}.arch: missing; give the timm architecture (e.g. resnet50), or "
                              "source: store for features already in the store")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"{path}.dtype: {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        check_checkpoint_fields(self, path)

    @property
    def extracted(self) -> bool:
        """Whether a run extracts these features (False: they are read from the store)."""
        return self.source == "extract"

    def extract_settings(self, extract: ExtractConfig) -> ExtractConfig:
        """``extract`` with this encoder's own ``dtype`` where it has one."""
        return extract if self.dtype is None else dataclasses.replace(extract, dtype=self.dtype)

    def spec(self):
        """The ``pipeline.encoders.EncoderSpec`` of these fields (imports timm)."""
        from pipeline.encoders import EncoderSpec

        return EncoderSpec(name=self.name, arch=self.arch, weights=self.weights, seed=self.seed,
                           layers=tuple(self.layers), input_size=self.input_size,
                           strip_prefixes=tuple(self.strip_prefixes), checkpoint_key=self.checkpoint_key)


@dataclass
class CheckpointScan:
    """A folder of checkpoints of one architecture; each new file becomes an encoder.

    A file still being written is left for a later scan: it is taken once its size and
    modification time have not changed for ``settle_seconds``, or, with ``done_suffix``
    (e.g. ``.done``), only once a marker file ``<checkpoint file name><done_suffix>`` exists
    (a training script writes the checkpoint, then touches the marker).

    ``checkpoint_key`` and ``strip_prefixes`` apply to every file, as an encoder's do.

    The folder's checkpoints form a series (named ``series``, else after the folder); each
    one's training step comes from its file name (``step_pattern``: ``"step{step}"`` or a
    regular expression with a group ``step``), else from its metadata (``step``,
    ``global_step`` or ``epoch``).
    """

    path: str
    arch: str
    pattern: str = "*.safetensors"
    layers: list[str] = field(default_factory=lambda: ["pre_logits"])
    input_size: int | None = None
    name_prefix: str = ""
    settle_seconds: float = 30.0
    done_suffix: str | None = None
    series: str | None = None
    step_pattern: str | None = None
    checkpoint_key: str | None = None  # as an encoder's, for every file of the folder
    strip_prefixes: list[str] = field(default_factory=list)

    @staticmethod
    def prepare_plain(data: dict, path: str) -> dict:
        return layer_shorthands(data, path)

    def check(self, path: str) -> None:
        if not self.path.strip() or not self.pattern.strip():
            raise ConfigError(f"{path}: path and pattern must not be empty")
        if self.series is not None and not self.series.strip():
            raise ConfigError(f"{path}.series: must not be empty (leave it out to name the series after the folder)")
        if self.step_pattern is not None:
            from pipeline.analysis.series.steps import compile_step_pattern

            try:
                compile_step_pattern(self.step_pattern)
            except ConfigError as exc:
                raise ConfigError(f"{path}.step_pattern: {exc}") from None
        if self.settle_seconds < 0:
            raise ConfigError(f"{path}.settle_seconds: {self.settle_seconds} must be >= 0")
        if self.done_suffix is not None and (not self.done_suffix.strip() or "/" in self.done_suffix):
            raise ConfigError(f"{path}.done_suffix: {self.done_suffix!r} must be a file name suffix such as '.done'")
        for i, layer in enumerate(self.layers):
            _name(layer, f"{path}.layers[{i}]")
        check_checkpoint_fields(self, path)


@dataclass
class DatasetConfig:
    name: str
    adapter: str
    params: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    test_split: str = "test"
    val_split: str | None = None

    def check(self, path: str) -> None:
        _name(self.name, f"{path}.name")
        for what in ("train_split", "test_split", "val_split"):  # '' would silently drop the split
            if what != "val_split" or self.val_split is not None:
                _name(getattr(self, what), f"{path}.{what}")

    def splits(self) -> list[str]:
        # once each: a pooled split can be both train and test (few-shot episodes)
        return list(dict.fromkeys(s for s in (self.train_split, self.val_split, self.test_split) if s))


@dataclass
class ProtocolConfig:
    """One named setting of a protocol, e.g. ``knn20`` = knn with n_neighbors 20."""

    name: str
    protocol: str
    settings: dict[str, Any] = field(default_factory=dict)
    layers: list[str] | None = None  # None: every layer each encoder extracts; else only these
    datasets: list[str] | None = None  # None: every dataset

    def check(self, path: str) -> None:
        _name(self.name, f"{path}.name")
        check_protocol_entry(self, path)  # its settings resolved by the protocol's registry entry


@dataclass
class ReferenceConfig:
    """Reference score per encoder (fractions in [0, 1]), given or measured."""

    scores: dict[str, float] = field(default_factory=dict)
    csv: str | None = None  # columns: model, score
    dataset: str | None = None  # measured: this dataset ...
    protocol: str | None = None  # ... under this protocol setting
    metric: str | None = None  # None: that protocol's primary metric
    name: str = "reference"


@dataclass
class CorrelationSetting:
    name: str
    protocol: str  # a ProtocolConfig name
    datasets: list[str]
    metric: str | None = None  # None: the protocol's primary metric (score; few-shot: mean)
    layer: str = "pre_logits"
    bounded: bool = True  # a metric in [0, 1] (accuracy, ECE): logit-transformed
    lower_is_better: bool = False  # e.g. ECE: negated before correlating

    @staticmethod
    def prepare_plain(data: dict, path: str) -> dict:  # angular errors: raw and negated by default
        from jobs.dense_plan import dense_correlation_defaults

        return dense_correlation_defaults(data, path)


@dataclass
class CorrelationConfig:
    settings: list[CorrelationSetting] = field(default_factory=list)
    bootstrap: int = 1000
    seed: int = 0

    def check(self, path: str) -> None:  # else the run fails only at its very end, in the correlation
        if self.bootstrap < 0 or self.seed < 0:
            raise ConfigError(f"{path}: bootstrap and seed must be >= 0, got {self.bootstrap} and {self.seed}")


@dataclass
class ReportConfig:
    path: str = "repeval-report/report.html"
    baseline: str | None = None  # encoder that low-shot curves are drawn relative to


@dataclass
class DaskSettings:
    """Where tasks run: a LocalCluster by default, or an existing scheduler."""

    address: str | None = None  # e.g. tcp://scheduler:8786
    n_workers: int = 2
    threads_per_worker: int = 1
    processes: bool = True  # worker processes (isolation); False: threads in one process
    gpu: str = "auto"  # extraction tasks ask for a GPU worker resource: auto | always | never
    # Cells of one (encoder, dataset) evaluated per task: submitting a task costs a few
    # hundred ms of Prefect/Dask bookkeeping, so tiny cells are grouped.
    cells_per_task: int = 16
    # Memory of each embedded LocalCluster worker: bytes, "8GiB", or auto (the machine's
    # memory shared by the workers). Each declares 75 % of it as its MEMORY resource, and
    # evaluation tasks ask for what their cells need (jobs.evaluation.cell_memory).
    memory_limit: int | str = "auto"
    # Threads of each task's math (torch, BLAS) in local worker processes. Dask starts them
    # with OMP_NUM_THREADS=1, so one large cell would use one core of many. auto: the
    # machine's cores shared by every worker thread, at most OMP_NUM_THREADS where it is set.
    math_threads: int | str = "auto"

    def check(self, path: str) -> None:
        if self.gpu not in ("auto", "always", "never"):
            raise ConfigError(f"{path}.gpu: {self.gpu!r} is not one of 'auto', 'always', 'never'")
        if self.memory_limit != "auto":
            from jobs.evaluation.cell_memory import parse_bytes

            parse_bytes(self.memory_limit, f"{path}.memory_limit")
        if self.n_workers < 1 or self.threads_per_worker < 1:
            raise ConfigError(f"{path}: n_workers and threads_per_worker must be >= 1")
        if self.cells_per_task < 1:
            raise ConfigError(f"{path}.cells_per_task: {self.cells_per_task} must be >= 1")
        if self.math_threads != "auto" and (isinstance(self.math_threads, bool)
                                            or not isinstance(self.math_threads, int) or self.math_threads < 1):
            raise ConfigError(f"{path}.math_threads: {self.math_threads!r} must be 'auto' or an integer >= 1")


@dataclass(kw_only=True)
class BenchmarkConfig:
    encoders: list[EncoderConfig] = field(default_factory=list)  # a checkpoints: folder may be all
    datasets: list[DatasetConfig]
    protocols: list[ProtocolConfig]
    store: str = "./repeval-store"
    storage_options: dict[str, Any] = field(default_factory=dict)
    dask: DaskSettings = field(default_factory=DaskSettings)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    checkpoints: list[CheckpointScan] = field(default_factory=list)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    correlation: CorrelationConfig = field(default_factory=CorrelationConfig)
    report: ReportConfig = field(default_factory=ReportConfig)

    def check(self, path: str) -> None:
        """Cross-field checks, every mistake reported (a new one: ``jobs.config.mistakes``)."""
        mistakes = Mistakes()
        with mistakes.collect():
            check_no_credentials(self.store, self.storage_options, path)
        for where, value in (("store", self.store), ("report.path", self.report.path)):
            if not value.strip():  # '' would resolve to the config's own folder
                mistakes.add(ConfigError(f"{path}.{where}: must not be empty"))
        if not self.encoders and not self.checkpoints:
            mistakes.add(ConfigError(f"{path}.encoders: no encoders and no checkpoints folder; give at least one"))
        for what, items in (("encoders", self.encoders), ("datasets", self.datasets),
                            ("protocols", self.protocols)):
            seen: dict[str, int] = {}
            for i, item in enumerate(items):
                if item.name in seen:
                    mistakes.add(ConfigError(f"{path}.{what}[{i}].name: {item.name!r} repeats "
                                             f"{what}[{seen[item.name]}]"))
                seen.setdefault(item.name, i)
        datasets = {d.name for d in self.datasets}
        protocols = {p.name for p in self.protocols}
        for i, p in enumerate(self.protocols):
            for j, d in enumerate(p.datasets or []):
                if d not in datasets:
                    mistakes.add(ConfigError(f"{path}.protocols[{i}].datasets[{j}]: unknown dataset {d!r}; "
                                             f"datasets: {', '.join(sorted(datasets))}"))
        for i, s in enumerate(self.correlation.settings):
            if s.protocol not in protocols:
                mistakes.add(ConfigError(f"{path}.correlation.settings[{i}].protocol: unknown protocol setting "
                                         f"{s.protocol!r}; protocols: {', '.join(sorted(protocols))}"))
            for j, d in enumerate(s.datasets):
                if d not in datasets:
                    mistakes.add(ConfigError(f"{path}.correlation.settings[{i}].datasets[{j}]: unknown dataset "
                                             f"{d!r}; datasets: {', '.join(sorted(datasets))}"))
        ref = self.reference
        if ref.protocol is not None and ref.protocol not in protocols:
            mistakes.add(ConfigError(f"{path}.reference.protocol: unknown protocol setting {ref.protocol!r}; "
                                     f"protocols: {', '.join(sorted(protocols))}"))
        if ref.dataset is not None and ref.dataset not in datasets:
            mistakes.add(ConfigError(f"{path}.reference.dataset: unknown dataset {ref.dataset!r}; "
                                     f"datasets: {', '.join(sorted(datasets))}"))
        for model, score in ref.scores.items():
            if not 0.0 <= score <= 1.0:
                mistakes.add(ConfigError(f"{path}.reference.scores.{model}: {score} is not a fraction in [0, 1] "
                                         "(give 0.765, not 76.5)"))
        from jobs.analysis.correlate import check_correlation_metrics

        with mistakes.collect():
            check_correlation_metrics(self, path)  # a metric its protocol records, or its primary one
        with mistakes.collect():
            check_correlation_layers(self, path)
        mistakes.raise_any()

    # -- helpers ------------------------------------------------------------------------
    def resolve_paths(self, base: Path) -> None:
        def local(p: str) -> str:
            return p if "://" in p or os.path.isabs(p) else str((base / p).resolve())

        def as_given(p: str) -> str:  # a checkpoint link keeps its own name (last.pth -> last.ckpt)
            return p if "://" in p or os.path.isabs(p) else os.path.normpath(os.path.join(base.resolve(), p))

        self.store = local(self.store)
        self.report.path = local(self.report.path)
        if self.reference.csv:
            self.reference.csv = local(self.reference.csv)
        for scan in self.checkpoints:
            scan.path = as_given(scan.path)
        for enc in self.encoders:
            if enc.weights not in ("random", "pretrained") and not enc.weights.startswith("timm:"):
                enc.weights = as_given(os.path.expanduser(enc.weights))
        from pipeline.datasets.catalog import path_parameters  # no torch: adapters' signatures only

        for ds in self.datasets:  # root, csv_path, ...: the parameters annotated as paths
            for key in path_parameters(ds.adapter):
                value = ds.params.get(key)
                if isinstance(value, str) and value.strip():
                    ds.params[key] = local(os.path.expanduser(value))
        resolve_protocol_paths(self, local)

    def protocol_hash(self) -> str:
        """Changes exactly when some protocol's settings change (drives reruns)."""
        return stable_hash([to_plain(p) for p in self.protocols], length=16)

    def reference_scores(self) -> dict[str, float]:
        """Given reference scores (config and CSV); measured ones come from the ledger."""
        scores = dict(self.reference.scores)
        if self.reference.csv:
            with open(self.reference.csv, newline="") as f:
                for row in csv.DictReader(f):
                    scores[row["model"]] = float(row["score"])
        return scores

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def open_store(self, read_only: bool = False):
        from storage_schema import FeatureStore

        return FeatureStore(self.store, read_only=read_only, storage_options=self.storage_options or None)


def load_config(source: str | os.PathLike | dict) -> BenchmarkConfig:
    """Load and validate a benchmark config from a YAML file or a dict.

    Relative paths in a file (store, checkpoints, encoder weights, dataset roots and other
    path parameters of adapters, suite roots, reference csv, report) are taken relative
    to the file's folder, so a config means the same from any working folder. Oversized
    input is refused first (``jobs.config.mistakes``); then every mistake found is reported
    at once, one line each.
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
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid YAML: {short(str(exc), 400)}") from None
        base = path.resolve().parent
    check_bounds(data)  # before anything walks it: an alias bomb is a few lines of YAML
    from jobs.config.suites import expand_suite

    cfg = from_plain(BenchmarkConfig, expand_suite(data, base), "config")  # `suite:` -> its entries
    cfg.resolve_paths(base)
    return cfg
