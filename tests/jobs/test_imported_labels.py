"""Two encoders' features imported for one dataset share its labels: the second import
leaves the labels array (and its fingerprint) as the first wrote it, so the first encoder's
records stay current and pair with the second's.

Before, the labels carried the fingerprint of the whole feature file: the second import
restamped them, every earlier record of the dataset looked made from other labels
(re-evaluated on the next run, and not comparable with the new encoder's).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from jobs.analysis.compare import compare_records, why_not_paired
from jobs.evaluation.evaluate import Cell, evaluate_cell
from jobs.extraction.import_features import import_features
from pipeline.datasets import make_dataset
from storage_schema import FeatureStore

LABELS = "datasets/blobs/{}/labels"


def _npz(path, y, shift: float, seed: int):
    rng = np.random.default_rng(seed)
    feats = {f"{s}_features": (rng.normal(size=(len(y[s]), 6)) + shift * y[s][:, None]).astype(np.float32) for s in y}
    np.savez(path, **{f"{s}_labels": y[s] for s in y}, **feats)
    return make_dataset("features", name="blobs", path=str(path))


@pytest.fixture
def imported(tmp_path):
    rng = np.random.default_rng(0)
    y = {"train": rng.integers(0, 3, 90), "test": rng.integers(0, 3, 45)}
    store = FeatureStore(str(tmp_path / "store"))
    return store, y, [_npz(tmp_path / f"{m}.npz", y, shift, i) for i, (m, shift) in enumerate((("a", 2.0), ("b", 1.0)))]


def test_the_second_import_keeps_the_labels_and_the_first_records(imported, caplog):
    store, y, (a, b) = imported
    for split in ("train", "test"):
        import_features(store, "a", a, split)
    before = {s: store.status(LABELS.format(s)).fingerprint for s in ("train", "test")}
    rec_a = evaluate_cell(store, Cell("a", "blobs", "pre_logits", "knn", "knn", {"n_neighbors": 5})).record
    with caplog.at_level(logging.WARNING):
        for split in ("train", "test"):
            import_features(store, "b", b, split)
    assert not [r for r in caplog.records if "replacing" in r.getMessage()]  # nothing rewritten
    assert {s: store.status(LABELS.format(s)).fingerprint for s in ("train", "test")} == before
    # the fingerprint is the labels' own: the same labels with other features give the same one
    assert a.labels_fingerprint("test") == b.labels_fingerprint("test") == before["test"]
    assert a.fingerprint("test") != b.fingerprint("test")  # the features' files do differ
    # a's record is still current (its cell identity did not move) and pairs with b's
    again = evaluate_cell(store, Cell("a", "blobs", "pre_logits", "knn", "knn", {"n_neighbors": 5}))
    assert again.status == "cached" and again.cell_id == rec_a["cell_id"]
    rec_b = evaluate_cell(store, Cell("b", "blobs", "pre_logits", "knn", "knn", {"n_neighbors": 5})).record
    assert why_not_paired(rec_a, rec_b) is None
    assert compare_records(store, rec_a, rec_b).n == y["test"].size


def test_other_labels_under_the_same_name_are_still_written_anew(imported, tmp_path):
    store, y, (a, _) = imported
    import_features(store, "a", a, "test")
    old = store.status(LABELS.format("test")).fingerprint
    relabelled = _npz(tmp_path / "c.npz", {s: (v + 1) % 3 for s, v in y.items()}, 2.0, 5)
    import_features(store, "c", relabelled, "test")
    assert store.status(LABELS.format("test")).fingerprint == relabelled.labels_fingerprint("test") != old
