"""The store's invariants on a real Zarr hierarchy on disk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from pipeline.errors import (
    ArrayNotFoundError, CorruptChunkError, IncompleteArrayError, InvalidNameError, ReadOnlyStoreError,
    SchemaVersionError, StaleArrayError, StoreError,
)
from storage_schema import ArraySpec, FeatureStore, feature_key, labels_key
from storage_schema.store import SCHEMA_ATTR, SCHEMA_VERSION

KEY = "features/m/d/train/pre_logits"


def _spec(fp="fp1", n=10, chunk_rows=4, d=3):
    return ArraySpec(KEY, (n, d), chunk_rows, "float32", {"fingerprint": fp})


def _fill(store, fp="fp1", n=10, chunk_rows=4, d=3, chunks=None):
    """Write ``chunks`` (default: all, then complete) through the store's one write path."""
    data = np.arange(n * d, dtype=np.float32).reshape(n, d)

    def produce(todo):
        wanted = sorted(todo[KEY]) if chunks is None else chunks
        return ((c, {KEY: data[c * chunk_rows:(c + 1) * chunk_rows]}) for c in wanted)

    with store.lease("features/m/d/train") as lease:
        store.write_arrays(lease, [_spec(fp, n, chunk_rows, d)], produce, complete=chunks is None)
    return data


def _complete(store, fp="fp1"):
    """Ask for completion without writing any chunk."""
    with store.lease("features/m/d/train") as lease:
        store.write_arrays(lease, [_spec(fp)], lambda todo: [])


def test_new_store_records_schema_version(store_url):
    FeatureStore(store_url)
    root = zarr.open_group(store_url, mode="r")
    assert root.attrs[SCHEMA_ATTR] == SCHEMA_VERSION


def test_other_schema_version_is_refused(store_url):
    zarr.create_group(store_url, attributes={SCHEMA_ATTR: SCHEMA_VERSION + 6})
    with pytest.raises(SchemaVersionError, match=f"schema version {SCHEMA_VERSION + 6}"):
        FeatureStore(store_url)


def test_plain_zarr_hierarchy_is_not_a_store(store_url):
    zarr.create_group(store_url, attributes={"other": 1})
    with pytest.raises(SchemaVersionError, match="not a repeval store"):
        FeatureStore(store_url)


def test_round_trip_numpy_and_dask(store_url):
    store = FeatureStore(store_url)
    data = _fill(store)
    arr = store.features("m", "d", "train", "pre_logits")
    np.testing.assert_array_equal(arr.read(), data)
    np.testing.assert_array_equal(arr.to_dask().compute(), data)
    assert arr.to_dask().chunks[0] == (4, 4, 2)
    assert arr.attrs["fingerprint"] == "fp1" and "created" in arr.attrs


def test_partial_array_is_not_readable_and_reports_progress(store_url):
    store = FeatureStore(store_url)
    _fill(store, chunks=[0, 1])
    st = store.status(KEY)
    assert st.done_chunks == {0, 1} and not st.complete and st.first_missing_chunk() == 2
    assert st.fraction_done == pytest.approx(2 / 3)
    with pytest.raises(IncompleteArrayError, match="2 of 3 chunks"):
        store.features("m", "d", "train", "pre_logits")
    _fill(store, chunks=[2])  # resume the rest
    _complete(store)
    assert store.features("m", "d", "train", "pre_logits").shape == (10, 3)


def test_complete_refused_while_chunks_missing(store_url):
    store = FeatureStore(store_url)
    _fill(store, chunks=[0])
    with pytest.raises(IncompleteArrayError, match=r"\[1, 2\]"):
        _complete(store)
    assert not store.status(KEY).complete


def test_chunk_write_must_be_whole(store_url):
    store = FeatureStore(store_url)
    with store.lease("features/m/d/train") as lease, pytest.raises(StoreError, match="needs 4 rows, got 3"):
        store.write_arrays(lease, [_spec("f")], lambda todo: [(0, {KEY: np.zeros((3, 3), np.float32)})])
    assert store.status(KEY).done_chunks == frozenset()  # nothing recorded for the refused chunk


def test_stale_fingerprint_replaces_array_and_progress(store_url):
    store = FeatureStore(store_url)
    _fill(store, fp="old")
    with pytest.raises(StaleArrayError, match="other weights"):
        store.features("m", "d", "train", "pre_logits", fingerprint="new")
    _fill(store, fp="new", chunks=[0])  # replacement starts from zero progress
    st = store.status(KEY)
    assert st.fingerprint == "new" and st.done_chunks == {0} and not st.complete


def test_missing_array_error_is_keyerror_and_filenotfound(store_url):
    store = FeatureStore(store_url)
    _fill(store)
    with pytest.raises(ArrayNotFoundError) as info:
        store.features("m", "d", "train", "block3")
    assert isinstance(info.value, KeyError) and isinstance(info.value, FileNotFoundError)
    assert "pre_logits" in str(info.value)  # names what is there


@pytest.mark.parametrize("bad", ["", "..", "a/b", "a\\b", ".hidden", "x\x00y", "tab\tname", "-flag"])
def test_bad_names_rejected_before_any_write(store_url, bad):
    store = FeatureStore(store_url)
    _fill(store)
    before = sorted(p.relative_to(store_url) for p in Path(store_url).rglob("*"))
    with pytest.raises(InvalidNameError):
        feature_key(bad, "d", "train", "pre_logits")
    with pytest.raises(InvalidNameError):
        labels_key("d", bad)
    # the store's writing and reading entry points refuse the name before touching the tree
    with pytest.raises(InvalidNameError):
        store.write_labels("d", bad, np.array([0, 1]), {"fingerprint": "L"})
    with pytest.raises(InvalidNameError):
        store.write_labels(bad, "train", np.array([0, 1]), {"fingerprint": "L"})
    with pytest.raises(InvalidNameError):
        store.features(bad, "d", "train", "pre_logits")
    with pytest.raises(InvalidNameError):
        store.labels("d", bad)
    after = sorted(p.relative_to(store_url) for p in Path(store_url).rglob("*"))
    assert after == before


def test_read_only_store_cannot_be_written(store_url):
    _fill(FeatureStore(store_url))
    ro = FeatureStore(store_url, read_only=True)
    assert ro.features("m", "d", "train", "pre_logits").shape == (10, 3)
    with pytest.raises(ReadOnlyStoreError):
        ro.lease("features/m/d/train")
    with pytest.raises(ReadOnlyStoreError):
        ro.write_labels("d", "train", np.zeros(3), {"fingerprint": "x"})
    with pytest.raises(ReadOnlyStoreError):
        ro.write_arrays(None, [_spec()], lambda todo: [])


def test_read_only_open_of_missing_store_fails(tmp_path):
    with pytest.raises(ArrayNotFoundError, match="no repeval store"):
        FeatureStore(str(tmp_path / "nowhere"), read_only=True)
    assert not (tmp_path / "nowhere").exists()


def test_labels_written_once(store_url):
    store = FeatureStore(store_url)
    a = store.write_labels("d", "train", np.array([0, 1, 1]), {"fingerprint": "L", "class_names": ["a", "b"]})
    created = a.attrs["created"]
    b = store.write_labels("d", "train", np.array([0, 1, 1]), {"fingerprint": "L", "class_names": ["a", "b"]})
    assert b.attrs["created"] == created
    np.testing.assert_array_equal(store.labels("d", "train").read(), [0, 1, 1])


def test_chunk_checksum_detects_flipped_byte(store_url, tmp_path):
    store = FeatureStore(store_url)
    _fill(store)
    chunk_file = tmp_path / "store" / KEY / "c" / "1" / "0"  # chunk 1: rows 4-7
    raw = bytearray(chunk_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk_file.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match=r"pre_logits.: chunk\(s\) \[1\] fail their crc32c checksum \(rows 4-7\)"):
        store.features("m", "d", "train", "pre_logits").read()


def test_list_arrays_shows_status(store_url):
    store = FeatureStore(store_url)
    store.write_labels("d", "train", np.array([0, 1]), {"fingerprint": "L"})
    _fill(store, chunks=[0])
    listed = {st.key: st for st in store.list_arrays()}
    assert set(listed) == {"datasets/d/train/labels", KEY}
    assert listed["datasets/d/train/labels"].complete and not listed[KEY].complete
    assert listed[KEY].done_chunks == {0} and listed[KEY].n_chunks == 3
    # keys are plain strings, so a listing serialises as is
    assert json.loads(json.dumps([st.key for st in store.list_arrays()])) == ["datasets/d/train/labels", KEY]


def test_alias_serves_the_target_with_its_own_provenance(store_url, tmp_path):
    store = FeatureStore(store_url)
    data = _fill(store)
    target = store.find_complete("fp1")
    assert target is not None and target.key == KEY
    alias = "features/m2/d/train/pre_logits"
    with store.lease("features/m2/d/train") as lease:
        store.write_alias(lease, alias, target, {"model": "m2"})
    arr = store.open_array(alias, fingerprint="fp1")
    np.testing.assert_array_equal(arr.read(), data)
    assert arr.key == alias and arr.attrs["model"] == "m2" and arr.attrs["alias_of"] == KEY
    assert store.features("m", "d", "train", "pre_logits").attrs.get("model") is None  # the target's own attrs
    assert [st.key for st in store.list_arrays()] == [KEY, alias]
    chunk_file = tmp_path / "store" / KEY / "c" / "2" / "0"
    chunk_file.write_bytes(b"\0" + chunk_file.read_bytes()[1:])
    assert store.damaged_chunks(alias) == [2]  # checked through the array holding the rows
    with pytest.raises(CorruptChunkError, match=r"chunk\(s\) \[2\]"):
        arr.read()
    _fill(store, fp="other")  # the target now holds other features: the alias serves nothing
    assert store.status(alias) is None and store.find_complete("fp1") is None
    with pytest.raises(ArrayNotFoundError):
        store.open_array(alias)


def test_a_real_array_replaces_an_alias(store_url):
    store = FeatureStore(store_url)
    _fill(store)
    alias = "features/m2/d/train/pre_logits"
    with store.lease("features/m2/d/train") as lease:
        store.write_alias(lease, alias, store.status(KEY), {"model": "m2"})
        store.write_arrays(lease, [ArraySpec(alias, (2, 3), 2, "float32", {"fingerprint": "own"})],
                           lambda todo: [(0, {alias: np.ones((2, 3), np.float32)})])
    st = store.status(alias)
    assert st.alias_of is None and st.fingerprint == "own" and st.complete
    np.testing.assert_array_equal(store.open_array(alias).read(), np.ones((2, 3)))


def test_an_object_store_without_credentials_names_the_host_and_what_to_set(monkeypatch):
    """A Dask or Prefect worker started without the store's keys: botocore alone says only
    'Unable to locate credentials'."""
    import os
    import socket

    pytest.importorskip("s3fs")
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookup either
    options = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}  # never reached: signing fails first
    with pytest.raises(StoreError) as info:
        FeatureStore("s3://bucket/no-keys", read_only=True, storage_options=options)
    message = str(info.value)
    assert message.startswith(f"no credentials for the object store 's3://bucket/no-keys' on host "
                              f"{socket.gethostname()} (process {os.getpid()}): NoCredentialsError")
    assert "AWS_ACCESS_KEY_ID" in message and "Dask or Prefect worker" in message
