"""A full disk and a read-only store: a clear error, nothing half-written, the lease free.

Real mechanisms only: a size-limited tmpfs (ENOSPC) or a per-file size limit
(RLIMIT_FSIZE: EFBIG) under a real extraction process, and a read-only bind mount. The
mounts need CAP_SYS_ADMIN (root in this container); where mounting is refused those
variants are skipped, and RLIMIT_FSIZE still runs.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr

from jobs.extraction.extract import extract
from pipeline.encoders import load_encoder
from pipeline.errors import ReadOnlyStoreError
from storage_schema import DEFAULT_TTL, FeatureStore, Lease, features_group_key
from storage_schema.keys import labels_group_key
from tests.helpers.children import (
    CHUNK_BATCHES, KEY, LAYERS, SPEC, SPLIT, context, extract_config, finish_extraction, missing_chunks,
    start_extraction, stored_arrays, textures,
)

TTL = DEFAULT_TTL


@contextlib.contextmanager
def _mounted(target: Path, *args: str):
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount {' '.join(args)} is not permitted here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    url = tmp_path_factory.mktemp("ref") / "store"
    assert finish_extraction(*start_extraction(context(), str(url), TTL))[0] == "report"
    chunk_sizes = [p.stat().st_size for p in (url / KEY / "c").rglob("*") if p.is_file()]
    pages = sum(-(-p.stat().st_size // 4096) for p in url.rglob("*") if p.is_file())
    return url, stored_arrays(str(url)), chunk_sizes, pages


def _check_nothing_half_written(url: Path, expected: dict[str, np.ndarray]) -> int:
    """No array complete, every chunk marked done holds the right rows, no temp file, no lease held."""
    store = FeatureStore(str(url), read_only=True)
    done = 0
    for layer in LAYERS:
        st = store.status(KEY.replace("pre_logits", layer))
        if st is None:
            continue
        assert not st.complete
        raw = zarr.open_array(store.backend.zarr_store(), path=st.key, mode="r")
        for c in st.done_chunks:  # a marker only where the chunk's write returned
            rows = slice(c * st.chunk_rows, (c + 1) * st.chunk_rows)
            assert raw[rows].tobytes() == expected[layer][rows].tobytes()
        done += len(st.done_chunks)
    assert not list(url.rglob("*.partial")), "temp files left behind"
    for key in (features_group_key("r18", "textures", SPLIT), labels_group_key("textures", SPLIT)):
        lease = Lease(store.backend, key).current()
        assert lease is None or lease.released, f"lease on {key} still held"
    return done


def _resume_and_compare(url: Path, expected: dict[str, np.ndarray]) -> dict:
    missing = missing_chunks(FeatureStore(str(url)), 16)
    kind, report = finish_extraction(*start_extraction(context(), str(url), TTL))
    assert kind == "report" and report["forward_batches"] == CHUNK_BATCHES * len(missing)
    resumed = stored_arrays(str(url))
    assert all(resumed[layer].tobytes() == expected[layer].tobytes() for layer in LAYERS)
    return report


@pytest.mark.parametrize("limit", ["tmpfs-full", "rlimit-fsize"])
def test_full_disk_is_a_clear_error_and_leaves_a_resumable_store(tmp_path, reference, limit):
    _, expected, chunk_sizes, pages = reference
    with contextlib.ExitStack() as stack:
        if limit == "tmpfs-full":  # room for about half of the store
            root = stack.enter_context(_mounted(tmp_path / "mnt", "-t", "tmpfs", "-o", f"size={pages // 2 * 4}k",
                                                "tmpfs"))
            rlimit = None
        else:  # every file may grow to just below the largest chunk of the first layer
            root, rlimit = tmp_path, max(chunk_sizes) - 1
        url = root / "store"
        kind, *error = finish_extraction(*start_extraction(context(), str(url), TTL, rlimit_fsize=rlimit))
        assert kind == "error" and error[0] == "StoreFullError", error
        reason = "No space left on device" if limit == "tmpfs-full" else "File too large"
        assert str(url) in error[1] and reason in error[1] and "rerun to resume" in error[1]
        done = _check_nothing_half_written(url, expected)
        if limit == "tmpfs-full":  # make room, on the same file system
            subprocess.run(["mount", "-o", "remount,size=64m", str(root)], check=True)
        report = _resume_and_compare(url, expected)
    print(f"\nfull disk ({limit}): StoreFullError after {done} of 32 layer chunks; no array complete, "
          f"no stray marker or temp file, lease released; the rerun computed the {report['forward_batches']} "
          f"missing batches and is bitwise equal to an uninterrupted run. The error: {error[1]}")


def test_read_only_store_and_read_only_file_system_refuse_writes(tmp_path, reference):
    ref_url, expected = reference[0], reference[1]
    # 1. A store opened read-only: refused before the encoder is even built.
    with pytest.raises(ReadOnlyStoreError, match="opened read-only"):
        extract(FeatureStore(str(ref_url), read_only=True), SPEC, textures(), SPLIT, extract_config())
    # 2. A read-only file system: the complete array reads; writing names the file system.
    source = tmp_path / "src"
    shutil.copytree(ref_url, source)
    before = {str(p.relative_to(source)): p.stat().st_mtime_ns for p in source.rglob("*")}
    encoder = load_encoder(SPEC, device="cpu")
    forward, batches = encoder.forward, []
    encoder.forward = lambda x: batches.append(len(x)) or forward(x)  # counts forward passes
    with _mounted(tmp_path / "ro", "--bind", "-o", "ro", str(source)) as ro:
        reader = FeatureStore(str(ro), read_only=True)
        assert reader.features("r18", "textures", SPLIT, "pre_logits").read().tobytes() == \
            expected["pre_logits"].tobytes()
        assert reader.damaged_chunks(KEY) == []
        writer = FeatureStore(str(ro))  # opening an existing store writes nothing
        with pytest.raises(ReadOnlyStoreError, match="read-only file system") as info:
            extract(writer, encoder, textures(), "test", extract_config())  # the missing split
        assert str(ro) in str(info.value) and not batches
        with pytest.raises(ReadOnlyStoreError, match="read-only file system"):
            FeatureStore(str(ro / "new-store"))  # creating a store there
    assert {str(p.relative_to(source)): p.stat().st_mtime_ns for p in source.rglob("*")} == before
    print(f"\nread-only: FeatureStore(read_only=True) and a read-only bind mount refuse writes with "
          f"ReadOnlyStoreError ({info.value}); no forward pass ran, the mount still reads bitwise, "
          "nothing was written")
