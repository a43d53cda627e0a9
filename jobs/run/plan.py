"""What a benchmark config asks for: extraction units and evaluation cells, in three steps
a run takes once each (``jobs.run.spine.Run`` holds their results): ``scan_folders`` reads
the checkpoint folders, ``list_work`` lists the units and cells (no check, no torch,
nothing written), ``check_work`` checks what needs the registries before any work."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from jobs.config.checkpoint_facts import keep_facts, take_facts
from jobs.config import BenchmarkConfig, DatasetConfig, EncoderConfig, ExtractConfig, ProtocolConfig
from jobs.config.checkpoint_folders import (
    ScanResult, check_scanned_files, folder_mistakes, scan_checkpoints, scan_entry_mistakes, with_encoders,
)
from jobs.config.mistakes import Mistakes
from jobs.config.encoders import check_encoder
from jobs.config.protocols import check_protocol_networks
from jobs.run.dense_plan import check_dense_pairs, pairs_with_dataset
from jobs.evaluation.encoder_identity import encoder_identity, note_owner, unit_identity
from jobs.evaluation.cell import ENCODER_LAYER, Cell
from jobs.evaluation.cell_memory import estimate_cells
from jobs.extraction.loaded_weights import file_signature, weights_file
from jobs.run.failures import sync_failures
from pipeline.encoders.spec import MAP_SUFFIX, TOKENS_SUFFIX, layer_kind
from pipeline.errors import (
    ArrayNotFoundError, CheckpointError, ConfigError, HubUnavailableError, RepevalError, StoreError,
)
from pipeline.protocols.registry import get_protocol, list_protocols
from storage_schema import feature_key
from storage_schema.backend import local_root, store_base
from storage_schema.ledger import FailureLog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtractUnit:
    """One encoder on one dataset split: one forward pass over the split, all layers."""
    # Shipped to a worker as ``pipeline.plain.to_plain(unit)``, rebuilt with its config
    # entries checked again by ``jobs.config.typed.from_plain(ExtractUnit, plain)``.
    # ``weights_signature`` is the checkpoint file's ``[size, mtime_ns, inode]`` when the run
    # was planned (``jobs.extraction.loaded_weights.file_signature``; None for pretrained or
    # random weights): the unit refuses a file rewritten since.

    encoder: EncoderConfig
    dataset: DatasetConfig
    split: str
    weights_signature: list[int] | None = None

    def label(self) -> str:
        """``encoder/dataset/split``, as failures and progress lines name a unit."""
        return f"{self.encoder.name}/{self.dataset.name}/{self.split}"


@dataclass
class Plan:
    """A run's work: ``config`` holds the encoders of the config plus the scanned checkpoints
    taken this time; ``scan`` what the folders held (files still being written, bad files
    skipped); ``checkpoint_failures`` the scanned files refused by this plan's checks;
    ``cells`` every cell, of every protocol (those that read the encoder's weights and
    images too); ``data_notes`` what the datasets' checks warn about (empty classes,
    folders left out)."""

    config: BenchmarkConfig
    units: list[ExtractUnit]
    cells: list[Cell]
    scan: ScanResult = field(default_factory=ScanResult)
    checkpoint_failures: list[dict[str, Any]] = field(default_factory=list)
    cell_memory: dict[str, int | None] = field(default_factory=dict)  # cell label -> peak bytes (checked plans)
    data_notes: list[dict[str, Any]] = field(default_factory=list)


def make_adapter(dataset: DatasetConfig):
    """The dataset adapter a config entry names, with its parameters."""
    # deferred: the dataset adapters and PIL load when a plan builds datasets, not at the CLI's start
    from pipeline.datasets import make_dataset

    return make_dataset(dataset.adapter, name=dataset.name, **dataset.params)


def extraction_units(cfg: BenchmarkConfig, scanned: dict[str, list[int]] | None = None) -> list[ExtractUnit]:
    """One unit per (extracted encoder, dataset, split) whose features a protocol reads;
    ``source: store`` encoders have none. Each notes its checkpoint file's signature (for a
    scanned file, ``[size, mtime_ns]`` as the scan saw it: ``scanned``, by encoder name;
    else the file's now), so a file rewritten before its unit runs is refused, not
    extracted from other weights."""
    scanned = scanned or {}
    signatures = {e.name: list(scanned[e.name]) if e.name in scanned else file_signature(weights_file(e.spec()))
                  for e in cfg.encoders if e.extracted}
    return [ExtractUnit(e, d, split, signatures[e.name]) for e in cfg.encoders if e.extracted for d in cfg.datasets
            if needs_features(cfg, d)
            for split in d.splits()]


def needs_features(cfg: BenchmarkConfig, dataset: DatasetConfig) -> bool:
    """Whether ``dataset``'s features are extracted: not when every protocol reading it reads
    the encoder's weights instead (a dataset no protocol reads is extracted, as always)."""
    readers = [p for p in cfg.protocols if p.datasets is None or dataset.name in p.datasets]
    return not readers or any(get_protocol(p.protocol).reads_features for p in readers)


def evaluation_cells(cfg: BenchmarkConfig) -> list[Cell]:
    """Every cell the config asks for, protocol by protocol, whatever its protocol reads."""
    # A protocol that reads stored features runs on every layer its encoders extract, or on
    # the protocol's ``layers`` among them: token layers (``block<i>.tokens``) only with the
    # protocols that read tokens, map layers (``block<i>.map``) and dense datasets only with
    # the dense protocols of their task, and pooled layers only with the others. A protocol
    # that reads the encoder's weights runs once per (extracted encoder, dataset), at
    # ``ENCODER_LAYER`` (a ``source: store`` encoder has features, no weights).
    cells, base = [], local_root(cfg.store)
    for p in cfg.protocols:
        entry = get_protocol(p.protocol)
        mine = [d for d in cfg.datasets if p.datasets is None or d.name in p.datasets]
        if not entry.reads_features:  # the encoder and the images: the cell carries their fields
            cells += [Cell(e.name, d.name, ENCODER_LAYER, p.name, p.protocol, dict(p.settings), d.train_split,
                           d.test_split, d.val_split, encoder=e, dataset_config=d,
                           identity=unit_identity(e, d, base), encoder_identity=encoder_identity(e, base))
                      for d in mine for e in cfg.encoders if e.extracted]
            continue
        for d in [d for d in mine if pairs_with_dataset(entry, d)]:
            for e in cfg.encoders:
                for layer in e.layers:
                    if (p.layers is None or layer in p.layers) and layer_kind(layer) == entry.reads:
                        cells.append(Cell(e.name, d.name, layer, p.name, p.protocol, dict(p.settings),
                                          d.train_split, d.test_split, d.val_split, identity=unit_identity(e, d, base),
                                          encoder_identity=encoder_identity(e, base)))
    return cells


def check_plan(cfg: BenchmarkConfig) -> dict[str, Any]:
    """Config problems that need the registries (adapters, architectures, checkpoints) or
    the store (features of ``source: store`` encoders): every one found, each naming its
    field (one ConfigError; ``jobs.config.mistakes``), before any work. Returns the dataset
    adapters built, by dataset name (a dataset that only ``source: store`` encoders use is
    not built: its features are in the store)."""
    # deferred: the dataset adapters and PIL, as in make_adapter
    from pipeline.datasets import adapter_class

    mistakes = Mistakes()
    provided = {layer for e in cfg.encoders for layer in e.layers} | {
        layer for s in cfg.checkpoints for layer in s.layers}
    for i, p in enumerate(cfg.protocols):
        if not get_protocol(p.protocol).reads_features:
            continue  # it works on the encoder itself: its layers were checked with its settings
        with mistakes.collect():
            missing = [layer for layer in p.layers or () if layer not in provided]
            if missing:
                raise ConfigError(f"config.protocols[{i}].layers: no encoder extracts {missing[0]!r}; "
                                  f"extracted layers: {', '.join(sorted(provided))}")
            check_token_layers(p, i, provided)
    with mistakes.collect():
        check_dense_pairs(cfg)
    with mistakes.collect():
        check_multilabel_protocols(cfg)
    with mistakes.collect():
        check_protocol_networks(cfg.protocols)
    extracts = bool(cfg.checkpoints) or any(e.extracted for e in cfg.encoders)
    adapters = {}
    for i, d in enumerate(cfg.datasets):
        with mistakes.collect():
            try:
                if not extracts:
                    adapter_class(d.adapter)  # the name is checked; the features come from the store
                    continue
                adapter = make_adapter(d)
            except RepevalError as exc:
                raise ConfigError(f"config.datasets[{i}]: {exc}") from None
            bad = [s for s in d.splits() if s not in adapter.splits]
            if bad:
                raise ConfigError(f"config.datasets[{i}]: dataset {d.name!r} has no split {bad[0]!r}; "
                                  f"splits: {', '.join(adapter.splits)}")
            if not adapter.has_images:
                raise ConfigError(f"config.datasets[{i}]: adapter {d.adapter!r} holds precomputed features; "
                                  "import them with `repeval import-features` and name their encoder with "
                                  "`source: store` (a config whose encoders are all `source: store` may list it)")
            adapters[d.name] = adapter
    for i, e in enumerate(cfg.encoders):
        if not e.extracted:
            continue
        with mistakes.collect():
            try:
                check_encoder(e)
            except RepevalError as exc:
                field_ = ".weights" if isinstance(exc, (CheckpointError, HubUnavailableError)) else ""
                raise ConfigError(f"config.encoders[{i}]{field_}: {exc}") from None
    with mistakes.collect():
        check_stored_features(cfg)
    mistakes.raise_any()
    return adapters


def check_stored_features(cfg: BenchmarkConfig) -> None:
    """Every array a ``source: store`` encoder's cells read must be complete in the store."""
    stored = [(i, e) for i, e in enumerate(cfg.encoders) if not e.extracted]
    if not stored:
        return
    store = open_store_if_any(cfg)
    used = [d for d in cfg.datasets if any(p.datasets is None or d.name in p.datasets for p in cfg.protocols)]
    mistakes = Mistakes()
    for i, e in stored:
        for d in used:
            for split in d.splits():
                for layer in e.layers:
                    key = feature_key(e.name, d.name, split, layer)
                    st = store.status(key) if store is not None else None
                    if st is None or not st.complete:
                        state = "is incomplete" if st is not None else "is not there"
                        mistakes.add(ConfigError(
                            f"config.encoders[{i}] ({e.name}, source: store): {key} {state} in the store "
                            f"{cfg.store}; import it first: repeval import-features --store {cfg.store} "
                            f"--model {e.name} --dataset-name {d.name} --layer {layer} --path <.npz or folder "
                            "of .npy>"))
    mistakes.raise_any()


def check_token_layers(p: ProtocolConfig, i: int, provided: set[str]) -> None:
    """A protocol that reads token features (or maps) needs a ``block<i>.tokens`` (or
    ``block<i>.map``) layer, and its ``layers`` list names layers of its kind only: else it
    would silently have no cells."""
    reads = get_protocol(p.protocol).reads
    names = {"pooled": "pooled", "tokens": "token", "map": "map"}
    wrong = [layer for layer in p.layers or () if layer_kind(layer) != reads]
    if wrong:
        kind = names[layer_kind(wrong[0])]
        raise ConfigError(f"config.protocols[{i}].layers: {wrong[0]!r} is a {kind} layer, which protocol "
                          f"{p.protocol!r} ({p.name}) cannot read; "
                          + (f"it reads token layers 'block<i>{TOKENS_SUFFIX}'" if reads == "tokens" else
                             f"it reads map layers 'block<i>{MAP_SUFFIX}'" if reads == "map" else
                             f"{kind} layers are read by the protocols that take "
                             f"{'tokens' if kind == 'token' else 'maps'}"))
    if reads != "pooled" and not any(layer_kind(layer) == reads for layer in provided):
        what, example = ("token features", f"block11{TOKENS_SUFFIX}") if reads == "tokens" else \
            ("spatial maps", f"block3{MAP_SUFFIX}")
        raise ConfigError(f"config.protocols[{i}] ({p.name}): protocol {p.protocol!r} reads {what}, but no "
                          f"encoder extracts a {names[reads]} layer; add e.g. '{example}' to an encoder's layers")


def check_multilabel_protocols(cfg: BenchmarkConfig) -> None:
    """A protocol that needs one class per sample, asked to run on a multi-label dataset,
    fails here, from the adapter's class attribute: before any file is read or extracted."""
    # deferred: the dataset adapters and PIL, as in make_adapter
    from pipeline.datasets import adapter_class

    mistakes = Mistakes()
    for i, p in enumerate(cfg.protocols):
        if get_protocol(p.protocol).multilabel:
            continue
        for d in cfg.datasets:
            try:
                multi_label = adapter_class(d.adapter).multi_label
            except RepevalError:
                continue  # an unknown adapter is reported with its dataset entry below
            if multi_label and (p.datasets is None or d.name in p.datasets):
                able = ", ".join(n for n in list_protocols() if get_protocol(n).multilabel)
                mistakes.add(ConfigError(f"config.protocols[{i}] ({p.name}): dataset {d.name!r} ({d.adapter}) is "
                                         f"multi-label, and protocol {p.protocol!r} needs one class per sample "
                                         f"(protocols that take it: {able}); restrict the protocol with its "
                                         "datasets list"))
    mistakes.raise_any()


def scan_folders(cfg: BenchmarkConfig, store=None, *, ready_only: bool = True,
                 retry_failed: bool = False) -> ScanResult:
    """The config's checkpoint folders as a run sees them, scanned once."""
    # The store's failure log names the files that failed unchanged (skipped unless
    # ``retry_failed``); its checkpoint facts spare reading files seen before (a writable
    # store keeps what this scan learned). ``ready_only`` leaves files still being written for
    # a later scan; False lists every file (a listing of results).
    if not cfg.checkpoints:
        return ScanResult()
    failed = {r.get("file"): r for r in FailureLog(store).records("checkpoint")} if store is not None else {}
    facts = take_facts(store)  # steps and fingerprints read by an earlier scan
    scan = scan_checkpoints(cfg, failed, ready_only=ready_only, retry_failed=retry_failed)
    scan.facts = facts
    keep_scan_facts(store, scan)
    return scan


def keep_scan_facts(store, scan: ScanResult) -> None:
    """Store what a scan learned from the files (a read-only store, or none, keeps nothing)."""
    try:
        keep_facts(store, scan.facts)
    except (RepevalError, OSError) as exc:  # only costs the next scan its reads
        log.warning("the checkpoint facts were not stored: %s", exc)


def list_work(cfg: BenchmarkConfig, scan: ScanResult | None = None, *, store=None, ready_only: bool = True) -> Plan:
    """The units and cells a config asks for, listed without any check (no torch, no timm,
    nothing written): what results, reports and the ledger's answer read."""
    scan = scan_folders(cfg, store, ready_only=ready_only) if scan is None else scan
    full = with_encoders(cfg, scan.taken)
    return Plan(full, extraction_units(full, scan.signatures()), evaluation_cells(full), scan,
                list(scan.collisions))


def check_work(cfg: BenchmarkConfig, scan: ScanResult, store=None, *, strict_folders: bool = True) -> Plan:
    """A run's checked plan: every config mistake raised at once (one ConfigError) before
    any work, the scanned files checked one by one; writes nothing (``record_refused``
    records the files it refused once the run holds a writable store)."""
    mistakes, adapters, bad_scans = Mistakes(), {}, set()
    with mistakes.collect():
        adapters = check_plan(cfg)
    if strict_folders:
        entry_mistakes, bad_scans = scan_entry_mistakes(cfg)
        mistakes.messages += entry_mistakes.messages
    offered = [f for f in scan.taken if f.origin not in bad_scans]
    # a scanned file is one checkpoint among many: refused alone, whatever its reader raised
    taken, refused = check_scanned_files(offered)
    if strict_folders:  # a folder none of whose files fits: its settings are the mistake
        mistakes.messages += folder_mistakes(cfg, offered, refused, bad_scans).messages
    mistakes.raise_any()
    full = with_encoders(cfg, taken)
    checked = ScanResult(taken, scan.waiting, scan.skipped, scan.collisions, scan.notes, scan.aliases, scan.facts)
    cells = evaluation_cells(full)
    # what each cell will need, from the store's shapes or the datasets and encoders
    memory = estimate_cells(cells, full.encoders, adapters, store, default_dtype=cfg.extract.dtype)
    return Plan(full, extraction_units(full, checked.signatures()), cells, checked,
                list(scan.collisions) + refused, cell_memory=memory, data_notes=_data_notes(adapters))


def record_refused(store, plan: Plan) -> Plan:
    """Record the scanned files ``plan`` refused in the store's failure log (each with what
    it failed on, so an unchanged file is not read again); ``plan`` with the records."""
    if plan.checkpoint_failures:
        plan.checkpoint_failures = sync_failures(store, checkpoints=plan.checkpoint_failures) or \
            plan.checkpoint_failures
    return plan


def make_plan(cfg: BenchmarkConfig, *, retry_failed: bool = False) -> Plan:
    """A run's plan of a loaded config, as ``jobs.run.Run`` makes it: the folders scanned once,
    every check before any work, the refused files recorded in the config's store."""
    existing = open_store_if_any(cfg)
    plan = check_work(cfg, scan_folders(cfg, existing, retry_failed=retry_failed), existing)
    if cfg.checkpoints:  # the config is good: its store may be made now
        store = cfg.open_store()
        record_refused(store, plan)
        keep_scan_facts(store, plan.scan)
    return plan


def _data_notes(adapters: dict[str, Any]) -> list[dict[str, Any]]:
    """What the built datasets warn about (none built: nothing to read, no import)."""
    if not adapters:
        return []
    # deferred: the dataset adapters and PIL, as in make_adapter
    from pipeline.datasets.inspection import dataset_notes

    return [n for a in adapters.values() for n in dataset_notes(a)]


def open_store_if_any(cfg: BenchmarkConfig):
    """The config's store, read-only, or None when there is none yet (nothing failed before,
    nothing stored)."""
    try:
        return cfg.open_store(read_only=True)
    except (StoreError, ArrayNotFoundError):
        return None


def run_extract_unit(store, unit: ExtractUnit, extract: BenchmarkConfig | ExtractConfig):
    """Extract one unit (no progress bar: the run reports progress per task)."""
    # deferred: torch and timm load in the worker that extracts
    from jobs.extraction.extract import extract as extract_job

    settings = unit.encoder.extract_settings(extract.extract if isinstance(extract, BenchmarkConfig) else extract)
    report = extract_job(store, unit.encoder.spec(), make_adapter(unit.dataset), unit.split,
                         dataclasses.replace(settings, progress=False),
                         expected_weights=unit.weights_signature)
    if report.status != "busy":  # its arrays now hold this unit's weights and images: noted as its own
        note_owner(store, unit_identity(unit.encoder, unit.dataset, store_base(store)),
                   {report.keys[layer]: fp for layer, fp in report.fingerprints.items()})
    return report
