"""Every key of the store comes from storage_schema.keys: its layout, and names refused there."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.errors import ArrayNotFoundError, InvalidNameError, RecordNotFoundError
from storage_schema import FeatureStore, keys, record_keys
from storage_schema.ledger import Ledger


def test_layout() -> None:
    fk = keys.feature_key("m", "d", "train", "block3")
    assert fk == "features/m/d/train/block3" and keys.group_of(fk) == keys.features_group_key("m", "d", "train")
    assert keys.parse_feature_key(fk) == ("m", "d", "train", "block3")
    assert keys.labels_key("d", "train") == "datasets/d/train/labels"
    assert keys.group_of(keys.labels_key("d", "train")) == keys.labels_group_key("d", "train")
    assert keys.chunk_marker_key(fk, "fp", 3) == f"_repeval/state/{fk}/fp/chunks/3"
    assert keys.completion_key(fk, "fp") == f"_repeval/state/{fk}/fp/complete.json"
    assert keys.lease_generation_key("features/m/d/train", 2) == "_repeval/leases/features/m/d/train/2.json"
    assert keys.alias_key(fk) == f"_repeval/aliases/{fk}.json"
    assert keys.fingerprint_index_key("abc123") == "_repeval/fingerprints/abc123.json"
    assert record_keys.ledger_record_key("ab12cd") == "_repeval/ledger/ab/ab12cd.json"
    assert record_keys.failure_key("cell", "ab12cd") == "_repeval/failures/cell/ab12cd.json"
    assert record_keys.watch_key("/x/config.yaml").startswith("_repeval/watch/")
    watch = record_keys.watch_key
    assert watch("/x/config.yaml") == watch("/x/config.yaml") != watch("/y/config.yaml")


@pytest.mark.parametrize("bad", ["", "..", "a/b", "../x", ".hidden"])
def test_bookkeeping_keys_refuse_path_like_names(bad: str) -> None:
    for make in (lambda: record_keys.failure_key(bad, "x"), lambda: record_keys.failure_key("cell", bad),
                 lambda: record_keys.ledger_record_key(bad), lambda: keys.fingerprint_index_key(bad)):
        with pytest.raises(InvalidNameError):
            make()


def test_missing_ledger_record_is_a_record_error_not_an_array_error(store_url) -> None:
    ledger = Ledger(FeatureStore(store_url))
    assert ledger.put({"cell_id": "ab12", "model": "m"})
    assert not ledger.put({"cell_id": "ab12", "model": "other"})  # never overwritten
    assert ledger.get("ab12")["model"] == "m"
    with pytest.raises(RecordNotFoundError, match="no ledger record 'ab99'") as info:
        ledger.get("ab99")
    assert isinstance(info.value, KeyError) and not isinstance(info.value, ArrayNotFoundError)


def test_ledger_lists_only_its_records(store_url, tmp_path) -> None:
    store = FeatureStore(store_url)
    ledger = Ledger(store)
    ledger.put({"cell_id": "ab12"})
    ledger.put({"cell_id": "cd34"})
    shard = tmp_path / "store" / "_repeval" / "ledger" / "ab"
    (shard / "ab12.json.1f2e.partial").write_text("{")  # a writer's temporary file
    (shard / "zz99.json").write_text(json.dumps({"cell_id": "zz99"}))  # not where zz99 belongs
    assert sorted(r["cell_id"] for r in ledger) == ["ab12", "cd34"] and len(ledger) == 2


def test_writes_land_only_under_keys_built_here(store_url, tmp_path) -> None:
    """A labels write: the array (and the groups zarr makes above it), its chunk, its marker,
    completion and index records, and the released lease."""
    store = FeatureStore(store_url)
    arr = store.write_labels("d", "train", np.array([0, 1, 1]), {"fingerprint": "L"})
    root = tmp_path / "store"
    written = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    expected = {
        keys.node_metadata_key(""), keys.node_metadata_key(arr.key), keys.chunk_marker_key(arr.key, "L", 0),
        keys.completion_key(arr.key, "L"), keys.fingerprint_index_key("L"),
        keys.lease_generation_key(keys.labels_group_key("d", "train"), 0),
        *(keys.node_metadata_key(group) for group in
          (keys.datasets_prefix(), keys.datasets_prefix("d"), keys.labels_group_key("d", "train"))),
    }
    expected = {k.lstrip("/") for k in expected}
    chunks = {w for w in written if w.startswith(f"{arr.key}/c/")}
    assert written - chunks == expected and len(chunks) == 1
    with pytest.raises(ArrayNotFoundError):
        store.labels("d", "test")
