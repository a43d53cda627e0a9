"""What a benchmark config asks for: extraction units and evaluation cells, planned once.

:func:`make_plan` scans the checkpoint folders, checks everything that needs the
registries (adapters, architectures, layers, checkpoints) before any work, and lists the
units and cells; a run hands each task the units or cells it runs, as plain values.
Whether a unit or cell still needs work is decided by the store (completeness,
fingerprints) and the ledger (cell ids) when it runs.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from jobs.checkpoint_facts import keep_facts, take_facts
from jobs.config import BenchmarkConfig, DatasetConfig, EncoderConfig, ExtractConfig, ProtocolConfig
from jobs.config.checkpoint_folders import ScanResult, scan_checkpoints, with_encoders
from jobs.config.mistakes import Mistakes
from jobs.config.checkpoint_files import check_scanned_files, folder_mistakes, scan_entry_mistakes
from jobs.config.encoders import check_encoder
from jobs.config.protocols import check_protocol_networks
from jobs.dense_plan import check_dense_pairs, pairs_with_dataset
from jobs.encoder_identity import encoder_identity, note_owner, unit_identity
from jobs.evaluation.cell import ENCODER_LAYER, Cell
from jobs.evaluation.cell_memory import estimate_cells
from jobs.extraction.loaded_weights import file_signature, weights_file
from jobs.failures import sync_failures
from pipeline.encoders.spec import MAP_SUFFIX, TOKENS_SUFFIX, layer_kind
from pipeline.errors import (
    ArrayNotFoundError, CheckpointError, ConfigError, HubUnavailableError, RepevalError, StoreError,
)
from pipeline.protocols.registry import get_protocol, list_protocols
from storage_schema import feature_key
from storage_schema.ledger import FailureLog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtractUnit:
    """One encoder on one dataset split: one forward pass over the split, all layers.

    Shipped to a worker as ``pipeline.plain.to_plain(unit)``, rebuilt with its config
    entries checked again by ``jobs.config.typed.from_plain(ExtractUnit, plain)``.
    ``weights_signature`` is the checkpoint file's ``[size, mtime_ns, inode]`` when the run
    was planned (``jobs.extraction.loaded_weights.file_signature``; None for pretrained or
    random weights): the unit refuses a file rewritten since.
    """

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
    """Every cell the config asks for, protocol by protocol, whatever its protocol reads.

    A protocol that reads stored features runs on every layer its encoders extract, or on
    the protocol's ``layers`` among them: token layers (``block<i>.tokens``) only with the
    protocols that read tokens, map layers (``block<i>.map``) and dense datasets only with
    the dense protocols of their task, and pooled layers only with the others. A protocol
    that reads the encoder's weights runs once per (extracted encoder, dataset), at
    ``ENCODER_LAYER`` (a ``source: store`` encoder has features, no weights)."""
    cells = []
    for p in cfg.protocols:
        entry = get_protocol(p.protocol)
        mine = [d for d in cfg.datasets if p.datasets is None or d.name in p.datasets]
        if not entry.reads_features:  # the encoder and the images: the cell carries their fields
            cells += [Cell(e.name, d.name, ENCODER_LAYER, p.name, p.protocol, dict(p.settings), d.train_split,
                           d.test_split, d.val_split, encoder=e, dataset_config=d,
                           identity=unit_identity(e, d), encoder_identity=encoder_identity(e))
                      for d in mine for e in cfg.encoders if e.extracted]
            continue
        for d in [d for d in mine if pairs_with_dataset(entry, d)]:
            for e in cfg.encoders:
                for layer in e.layers:
                    if (p.layers is None or layer in p.layers) and layer_kind(layer) == entry.reads:
                        cells.append(Cell(e.name, d.name, layer, p.name, p.protocol, dict(p.settings),
                                          d.train_split, d.test_split, d.val_split, identity=unit_identity(e, d),
                                          encoder_identity=encoder_identity(e)))
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
        check_protocol_networks(cfg)
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
    store = _failure_store(cfg, writable=False)
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


def make_plan(cfg: BenchmarkConfig, *, retry_failed: bool = False, ready_only: bool = True, record: bool = True,
              store=None, check: bool = True, strict_folders: bool = True) -> Plan:
    """Check, scan and list a run's work, once, before anything runs.

    Parameters
    ----------
    cfg : BenchmarkConfig
        The loaded config.
    retry_failed : bool
        Take scanned files that failed before even if unchanged.
    ready_only : bool
        Leave files still being written for a later scan (runs); False takes every file.
    record : bool
        Record the scanned files this plan refuses in the store's failure log (a run);
        False only reads the log (a report, a listing).
    store : FeatureStore, optional
        The store holding the failure log; by default the config's, opened after the
        checks (a bad config writes nothing) and only when the config scans folders.
    check : bool
        Check adapters, architectures and checkpoints (a run); False only lists the work
        (a report or a listing of results: no torch, no timm).
    strict_folders : bool
        With ``check``: a scan whose settings are wrong (its ``arch`` or ``layers``, or
        every file it offers refused) is a config mistake, raised with the others before
        anything is recorded or run (``jobs.config.checkpoint_files``); False (a scheduled
        scan) refuses such files one by one instead. A file refused alone beside files that
        pass is recorded either way, and the run goes on.

    Returns
    -------
    Plan
    """
    mistakes, adapters, bad_scans = Mistakes(), {}, set()
    if check:  # the config's own encoders and the scans' settings: every mistake, before any work
        with mistakes.collect():
            adapters = check_plan(cfg)
        if strict_folders:
            entry_mistakes, bad_scans = scan_entry_mistakes(cfg)
            mistakes.messages += entry_mistakes.messages
    failed: dict[str, dict[str, Any]] = {}
    if cfg.checkpoints and store is None:
        store = _failure_store(cfg, writable=record and not mistakes.messages)
    if store is not None:
        failed = {r.get("file"): r for r in FailureLog(store).records("checkpoint")}
    facts = take_facts(store) if cfg.checkpoints else {}  # steps and fingerprints read by an earlier scan
    scan = scan_checkpoints(cfg, failed, ready_only=ready_only, retry_failed=retry_failed)
    if cfg.checkpoints and record:
        try:
            keep_facts(store, facts)
        except (RepevalError, OSError) as exc:  # only costs the next scan its reads
            log.warning("the checkpoint facts were not stored: %s", exc)
    offered = [f for f in scan.taken if f.origin not in bad_scans]
    # a scanned file is one checkpoint among many: refused alone, whatever its reader raised
    taken, refused = check_scanned_files(offered) if check else (offered, [])
    if check and strict_folders:  # a folder none of whose files fits: its settings are the mistake
        mistakes.messages += folder_mistakes(cfg, offered, refused, bad_scans).messages
    mistakes.raise_any()
    refused = list(scan.collisions) + refused  # files sharing a name: refused together, each naming the others
    if store is not None and record and refused:
        refused = sync_failures(store, checkpoints=refused) or refused
    full = with_encoders(cfg, taken)
    scan = ScanResult(taken, scan.waiting, scan.skipped, scan.collisions, scan.notes, scan.aliases)
    cells = evaluation_cells(full)
    memory = {}
    if check:  # what each cell will need, from the store's shapes or the datasets and encoders
        memory = estimate_cells(cells, full.encoders, adapters, store or _failure_store(cfg, writable=False),
                                default_dtype=cfg.extract.dtype)
    return Plan(full, extraction_units(full, scan.signatures()), cells, scan, refused, cell_memory=memory,
                data_notes=_data_notes(adapters))


def _data_notes(adapters: dict[str, Any]) -> list[dict[str, Any]]:
    """What the built datasets warn about (none built: nothing to read, no import)."""
    if not adapters:
        return []
    # deferred: the dataset adapters and PIL, as in make_adapter
    from pipeline.datasets.inspection import dataset_notes

    return [n for a in adapters.values() for n in dataset_notes(a)]


def _failure_store(cfg: BenchmarkConfig, writable: bool):
    try:
        return cfg.open_store(read_only=not writable)
    except (StoreError, ArrayNotFoundError):  # no store yet (read-only): nothing failed before
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
        note_owner(store, unit_identity(unit.encoder, unit.dataset),
                   {report.keys[layer]: fp for layer, fp in report.fingerprints.items()})
    return report
