"""A store opened read-only cannot be written through any write API: each raises
ReadOnlyStoreError before touching a byte, and the tree is unchanged.

Extends tests/storage_schema/test_store.py::test_read_only_store_cannot_be_written (lease,
write_labels, write_arrays) to every other write path: array creation and resumption, chunk
writes, completion, aliases, the ledger, leases made directly on the backend, the backend's
own primitives, labels, imports, extraction and evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.evaluation.evaluate import Cell, evaluate_cell
from jobs.extraction.extract import ExtractConfig, extract
from jobs.extraction.import_features import import_features
from jobs.extraction.labels import store_labels
from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec
from pipeline.errors import ReadOnlyStoreError
from storage_schema import ArraySpec, FeatureStore, Lease
from storage_schema.ledger import Ledger
from tests.helpers.tally import tree

KEY = "features/m/emb/train/pre_logits"


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A store holding imported features (complete), plus a read-only view of it."""
    tmp = tmp_path_factory.mktemp("ro")
    rng = np.random.default_rng(0)
    npz = tmp / "emb.npz"
    np.savez(npz, train_features=rng.normal(size=(12, 3)).astype(np.float32), train_labels=np.arange(12) % 3,
             test_features=rng.normal(size=(6, 3)).astype(np.float32), test_labels=np.arange(6) % 3)
    dataset = make_dataset("features", path=str(npz))
    writable = FeatureStore(str(tmp / "store"))
    for split in dataset.splits:
        import_features(writable, "m", dataset, split)
    return writable, FeatureStore(str(tmp / "store"), read_only=True), dataset, tmp


def _write_calls(writable, ro, dataset):
    lease = writable.lease("features/m/emb/other")  # a real lease, from a writable handle
    lease.acquire()
    stored = writable.status(KEY)
    rows = np.zeros((12, 3), np.float32)
    new = ArraySpec("features/m/emb/train/block1", (12, 3), 4, "float32", {"fingerprint": "x"})
    cell = Cell("m", "emb", "pre_logits", "knn3", "knn", {"n_neighbors": 3})
    tiny = make_dataset("textures", n_per_class={"train": 1, "test": 1})
    return lease, {
        "lease": lambda: ro.lease("features/m/emb/train"),
        "Lease on the backend": lambda: Lease(ro.backend, "features/m/emb/train").try_acquire(),
        "write_arrays (create)": lambda: ro.write_arrays(lease, [new], lambda todo: [(0, {new.key: rows[:4]})]),
        "write_arrays (rewrite a chunk)": lambda: ro.write_arrays(
            lease, [ArraySpec.of(stored)], lambda todo: [(0, {KEY: rows[:stored.chunk_rows]})], chunks={KEY: [0]}),
        "write_arrays (complete)": lambda: ro.write_arrays(lease, [ArraySpec.of(stored)], lambda todo: []),
        "write_alias": lambda: ro.write_alias(lease, "features/m2/emb/train/pre_logits", stored, {"model": "m2"}),
        "write_labels": lambda: ro.write_labels("emb2", "train", np.zeros(3), {"fingerprint": "y"}),
        "store_labels": lambda: store_labels(ro, tiny, "train"),
        "Ledger.put": lambda: Ledger(ro).put({"cell_id": "abc"}),
        "backend.write_atomic": lambda: ro.backend.write_atomic("_repeval/x", b"1"),
        "backend.create_exclusive": lambda: ro.backend.create_exclusive("_repeval/y", b"1"),
        "backend.delete": lambda: ro.backend.delete("features", recursive=True),
        "import_features": lambda: import_features(ro, "m2", dataset, "train"),
        "extract": lambda: extract(ro, EncoderSpec("r18", "resnet18", input_size=32), tiny, "train",
                                   ExtractConfig(batch_size=2, progress=False)),
        "evaluate_cell": lambda: evaluate_cell(ro, cell),
    }


def test_every_write_api_refuses_and_the_tree_is_unchanged(stores):
    writable, ro, dataset, tmp = stores
    lease, calls = _write_calls(writable, ro, dataset)
    before = tree(tmp / "store")
    refused = []
    try:
        for name, call in calls.items():
            with pytest.raises(ReadOnlyStoreError) as info:
                call()
            assert "read-only" in str(info.value), (name, info.value)
            refused.append(name)
            assert tree(tmp / "store") == before, f"{name} changed the store"
    finally:
        lease.release()
    print(f"read-only store: {len(refused)} of {len(calls)} write APIs refused, tree unchanged: "
          f"{', '.join(refused)}")


def test_reads_still_work_and_a_recorded_cell_is_answered(stores):
    """Read-only is for consumers: reading arrays and cached results must keep working."""
    writable, ro, _, _ = stores
    cell = Cell("m", "emb", "pre_logits", "knn3", "knn", {"n_neighbors": 2})
    computed = evaluate_cell(writable, cell)
    assert ro.features("m", "emb", "train", "pre_logits").read().shape == (12, 3)
    cached = evaluate_cell(ro, cell)
    assert cached.status == "cached" and cached.cell_id == computed.cell_id
