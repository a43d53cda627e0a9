"""What a benchmark config asks for: extraction units and evaluation cells.

Pure planning over the config; whether a unit or cell still needs work is decided by the
store (completeness, fingerprints) and the ledger (cell ids) when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jobs.config import BenchmarkConfig, DatasetConfig, EncoderConfig
from jobs.evaluate import Cell
from jobs.extract import ExtractionReport, extract
from pipeline.datasets import DatasetAdapter, make_dataset
from pipeline.encoders import check_layers_available
from pipeline.errors import ConfigError, RepevalError
from storage_schema import FeatureStore


@dataclass(frozen=True)
class ExtractUnit:
    """One encoder on one dataset split: one forward pass over the split, all layers."""

    encoder: EncoderConfig
    dataset: DatasetConfig
    split: str

    def label(self) -> str:
        return f"{self.encoder.name}/{self.dataset.name}/{self.split}"


def make_adapter(dataset: DatasetConfig) -> DatasetAdapter:
    return make_dataset(dataset.adapter, name=dataset.name, **dataset.params)


def extraction_units(cfg: BenchmarkConfig) -> list[ExtractUnit]:
    return [ExtractUnit(e, d, split) for e in cfg.encoders for d in cfg.datasets for split in d.splits()]


def evaluation_cells(cfg: BenchmarkConfig) -> list[Cell]:
    """Every (encoder, dataset, layer, protocol setting) the config asks for."""
    cells = []
    for p in cfg.protocols:
        datasets = [d for d in cfg.datasets if p.datasets is None or d.name in p.datasets]
        for d in datasets:
            for e in cfg.encoders:
                for layer in p.layers:
                    if layer in e.layers:
                        cells.append(Cell(e.name, d.name, layer, p.name, p.protocol, dict(p.settings),
                                          d.train_split, d.test_split, d.val_split))
    return cells


def check_plan(cfg: BenchmarkConfig) -> None:
    """Config problems that need the registries: fail before any work."""
    for i, p in enumerate(cfg.protocols):
        provided = {layer for e in cfg.encoders for layer in e.layers}
        missing = [layer for layer in p.layers if layer not in provided]
        if missing:
            raise ConfigError(f"config.protocols[{i}].layers: no encoder extracts {missing[0]!r}; "
                              f"extracted layers: {', '.join(sorted(provided))}")
    check_multilabel_protocols(cfg)
    for i, d in enumerate(cfg.datasets):
        try:
            adapter = make_adapter(d)
        except RepevalError as exc:
            raise ConfigError(f"config.datasets[{i}]: {exc}") from None
        bad = [s for s in d.splits() if s not in adapter.splits]
        if bad:
            raise ConfigError(f"config.datasets[{i}]: dataset {d.name!r} has no split {bad[0]!r}; "
                              f"splits: {', '.join(adapter.splits)}")
        if not adapter.has_images:
            raise ConfigError(f"config.datasets[{i}]: adapter {d.adapter!r} holds precomputed features; "
                              "import them with `repeval import-features` instead")
    for i, e in enumerate(cfg.encoders):
        try:
            spec = e.spec()
            check_layers_available(spec)
        except RepevalError as exc:
            raise ConfigError(f"config.encoders[{i}]: {exc}") from None
        if spec.weights_kind == "checkpoint" and not Path(spec.weights).expanduser().is_file():
            # else every extraction task of this encoder fails, after the run has started
            raise ConfigError(f"config.encoders[{i}].weights: checkpoint file {spec.weights!r} does not exist")


def check_multilabel_protocols(cfg: BenchmarkConfig) -> None:
    """A protocol that needs one class per sample, asked to run on a multi-label dataset,
    fails here, from the adapter's class attribute: before any file is read or extracted."""
    from pipeline.datasets import adapter_class
    from pipeline.protocols.multilabel import refuse_multilabel

    for i, p in enumerate(cfg.protocols):
        for d in cfg.datasets:
            try:
                multi_label = adapter_class(d.adapter).multi_label
            except RepevalError:
                continue  # an unknown adapter is reported with its dataset entry below
            if multi_label and (p.datasets is None or d.name in p.datasets):
                try:
                    refuse_multilabel(p.protocol)
                except RepevalError as exc:
                    raise ConfigError(f"config.protocols[{i}] ({p.name}): dataset {d.name!r} ({d.adapter}) is "
                                      f"multi-label: {exc}; restrict the protocol with its datasets list") from None


def run_extract_unit(store: FeatureStore, unit: ExtractUnit, cfg: BenchmarkConfig) -> ExtractionReport:
    return extract(store, unit.encoder.spec(), make_adapter(unit.dataset), unit.split,
                   cfg.extract.as_extract_config())
