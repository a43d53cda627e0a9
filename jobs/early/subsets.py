"""Which rows of a dataset the early pass reads: chosen once, recorded, and kept until the
history has changed enough to choose again."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from jobs.config.datasets import DatasetConfig
from jobs.config.early import EarlyConfig
from pipeline.analysis.early import anchor_rows, stratified_rows
from pipeline.errors import DataValidationError
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords, early_id
from storage_schema.keys import labels_key

__all__ = ["GROWTH", "Subset", "current_subset", "rows_sha256"]

#: A subset chosen from a history of n encoders is chosen again at n * GROWTH.
GROWTH = 1.5


def rows_sha256(rows: np.ndarray) -> str:
    """SHA-256 of a row list (int64): what an early array says it holds."""
    return hashlib.sha256(np.asarray(rows, dtype=np.int64).tobytes()).hexdigest()


@dataclass(frozen=True)
class Subset:
    """The early rows of one dataset."""

    id: str
    dataset: str
    method: str
    rows: dict[str, np.ndarray]
    weights: np.ndarray | None
    labels: dict[str, str]
    history: int
    test_split: str

    def to_record(self, early: EarlyConfig) -> dict[str, Any]:
        """The ``subsets`` record (``storage_schema.early``)."""
        return {"id": self.id, "dataset": self.dataset, "method": self.method, "test_split": self.test_split,
                "rows": {s: r.tolist() for s, r in self.rows.items()},
                "weights": None if self.weights is None else self.weights.tolist(),
                "labels": dict(self.labels), "history": self.history,
                "settings": {"fraction": early.fraction, "min_per_class": early.min_per_class, "seed": early.seed,
                             "rows": early.rows}}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Subset:
        """Rebuild a subset from its record."""
        return cls(rec["id"], rec["dataset"], rec["method"],
                   {s: np.asarray(r, dtype=np.int64) for s, r in rec["rows"].items()},
                   None if rec.get("weights") is None else np.asarray(rec["weights"], dtype=np.float64),
                   dict(rec["labels"]), int(rec.get("history") or 0), rec["test_split"])

    def size(self) -> int:
        """Early rows over every split."""
        return int(sum(len(r) for r in self.rows.values()))


def _stored_labels(store: FeatureStore, dataset: DatasetConfig) -> dict[str, tuple[np.ndarray, str]]:
    out = {}
    for split in dataset.splits():
        arr = store.open_array(labels_key(dataset.name, split))
        out[split] = (arr.read(), arr.fingerprint)
    return out


def _size(n: int, fraction: float) -> int:
    return max(1, int(round(fraction * n)))


def _stratified(dataset: DatasetConfig, labels: dict[str, tuple[np.ndarray, str]], early: EarlyConfig) -> Subset:
    settings = ["stratified", early.fraction, early.min_per_class, early.seed]
    sid = early_id(dataset.name, {s: fp for s, (_, fp) in labels.items()}, settings)
    rows = {split: stratified_rows(y, _size(len(y), early.fraction), early.seed + i, early.min_per_class)
            for i, (split, (y, _)) in enumerate(labels.items())}
    return Subset(sid, dataset.name, "stratified", rows, None, {s: fp for s, (_, fp) in labels.items()}, 0,
                  dataset.test_split)


def _anchored(dataset: DatasetConfig, labels: dict[str, tuple[np.ndarray, str]], early: EarlyConfig,
              profiles: np.ndarray, history: list[str]) -> Subset:
    base = _stratified(dataset, labels, early)
    y_test = labels[dataset.test_split][0]
    rows, weights = anchor_rows(profiles, y_test, _size(len(y_test), early.fraction), early.seed,
                                early.min_per_class)
    sid = early_id(base.id, "anchors", sorted(history))
    return Subset(sid, dataset.name, "anchors", {**base.rows, dataset.test_split: rows}, weights, base.labels,
                  len(history), dataset.test_split)


def current_subset(store: FeatureStore, dataset: DatasetConfig, early: EarlyConfig,
                   profiles: tuple[np.ndarray, list[str]] | None = None) -> Subset:
    """The subset the early pass reads of ``dataset`` now: the one on record, or a new one
    (recorded) when there is none for these labels and settings, or (anchors) when the
    history has grown by half since it was chosen."""
    labels = _stored_labels(store, dataset)
    records = EarlyRecords(store)
    base = _stratified(dataset, labels, early)
    if early.rows != "anchors" or profiles is None or len(set(profiles[1])) < early.min_history:
        chosen = base
    else:
        matrix, encoders = profiles
        if matrix.shape[0] != len(labels[dataset.test_split][0]):
            raise DataValidationError(f"anchor profiles of {dataset.name} have {matrix.shape[0]} rows, the test "
                                      f"split {len(labels[dataset.test_split][0])}")
        n = len(set(encoders))
        kept = [Subset.from_record(r) for r in records.iter("subsets", dataset.name)
                if r.get("method") == "anchors" and r.get("labels") == base.labels
                and r.get("settings", {}).get("seed") == early.seed
                and r.get("settings", {}).get("fraction") == early.fraction
                and r.get("settings", {}).get("min_per_class") == early.min_per_class]
        kept.sort(key=lambda s: s.history)
        if kept and n < kept[-1].history * GROWTH:
            return kept[-1]
        chosen = _anchored(dataset, labels, early, matrix, sorted(set(encoders)))
    if records.get("subsets", chosen.id, dataset.name) is None and not store.read_only:
        records.put("subsets", chosen.to_record(early))
    return chosen
