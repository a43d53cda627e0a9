"""The whole run config, ``BenchmarkConfig``: its sections and the checks across them
(names repeated, references to unknown datasets or protocol settings, reference scores
outside [0, 1]), every mistake reported at once."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from typing import Any

from jobs.config.datasets import DatasetConfig
from jobs.config.early import EarlyConfig
from jobs.config.encoders import CheckpointScan, EncoderConfig
from jobs.config.mistakes import Mistakes, check_no_credentials
from jobs.config.protocols import ProtocolConfig, check_correlation_layers, check_correlation_metrics
from jobs.config.report import CorrelationConfig, ReferenceConfig, ReportConfig
from jobs.config.run import DaskSettings, ExtractConfig
from pipeline.errors import ConfigError
from pipeline.plain import to_plain
from storage_schema import FeatureStore
from storage_schema.provenance import stable_hash

__all__ = ["BenchmarkConfig"]


@dataclass(kw_only=True)
class BenchmarkConfig:
    """A whole run config: encoders (or checkpoint folders), datasets, protocol settings,
    where the store is, how the run executes, and what it correlates and reports.

    Parameters
    ----------
    encoders : list of EncoderConfig
        The ``encoders:`` entries (a ``checkpoints:`` folder may give them all).
    datasets : list of DatasetConfig
        The ``datasets:`` entries.
    protocols : list of ProtocolConfig
        The protocol settings (``protocols:``).
    store : str
        The feature store: a folder or an fsspec URL.
    storage_options : dict
        fsspec options of the store (never credentials).
    dask, extract : DaskSettings, ExtractConfig
        Where tasks run; how features are extracted.
    checkpoints : list of CheckpointScan
        Checkpoint folders, each new file an encoder.
    reference, correlation, report, early : ReferenceConfig, CorrelationConfig, ReportConfig, EarlyConfig
        The reference scores, the correlations, the report and the early pass.
    """

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
    early: EarlyConfig = field(default_factory=EarlyConfig)

    def check(self, path: str) -> None:
        """Cross-field checks, every mistake reported (a new one: ``jobs.config.mistakes``).

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
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
        with mistakes.collect():
            check_correlation_metrics(self.protocols, self.correlation, self.reference, path)  # a metric its protocol records, or its primary one
        with mistakes.collect():
            check_correlation_layers(self.protocols, self.correlation, path)
        mistakes.raise_any()

    def protocol_hash(self) -> str:
        """Changes exactly when some protocol's settings change (drives reruns).

        Returns
        -------
        str
            16 hex digits.
        """
        return stable_hash([to_plain(p) for p in self.protocols], length=16)

    def reference_scores(self) -> dict[str, float]:
        """Given reference scores (config and CSV); measured ones come from the ledger.

        Returns
        -------
        dict
            Encoder name -> reference score.
        """
        scores = dict(self.reference.scores)
        if self.reference.csv:
            with open(self.reference.csv, newline="") as f:
                for row in csv.DictReader(f):
                    scores[row["model"]] = float(row["score"])
        return scores

    def open_store(self, read_only: bool = False) -> FeatureStore:
        """The run's feature store, with the config's storage options.

        Parameters
        ----------
        read_only : bool
            Open it for reading only (nothing is created).

        Returns
        -------
        FeatureStore
        """
        return FeatureStore(self.store, read_only=read_only, storage_options=self.storage_options or None)
