"""FeatureRows: the virtual row order over in-memory, streamed and device parts, its
subsets, caches and blocks; every way of reading gives the same rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import FeatureRows


def _parts(seed: int):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(23, 4)).astype(np.float32)
    B = rng.normal(size=(17, 4))  # float64
    C = rng.normal(size=(11, 4)).astype(np.float16)
    reads = []

    def blocks():
        reads.append(1)
        for i in range(0, 17, 5):
            yield B[i:i + 5], i

    return A, B, C, blocks, reads


def _read(rows: FeatureRows, block: int) -> np.ndarray:
    out = np.full((len(rows), rows.n_features), np.nan)
    for X, start in rows.blocks(dtype=torch.float64, rows=block):
        out[start:start + len(X)] = X.cpu().numpy()
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 20), block=st.integers(1, 30), data=st.data())
def test_every_reading_gives_the_concatenated_rows(seed, block, data):
    A, B, C, blocks, reads = _parts(seed)
    whole = np.concatenate([A, B, C]).astype(np.float64)
    streamed = FeatureRows([A, (blocks, 17), C], 4)
    assert len(streamed) == 51 and not streamed.in_memory
    np.testing.assert_array_equal(_read(streamed, block), whole)
    pick = np.sort(data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=40, unique=True)))
    np.testing.assert_array_equal(_read(streamed.select(pick), block), whole[pick])
    cached = streamed.cached(pick)
    assert cached.in_memory
    np.testing.assert_array_equal(cached.take(pick).astype(np.float64), whole[pick])
    shuffled = np.random.default_rng(seed).permutation(pick)  # in-memory rows may come in any order
    in_memory = FeatureRows([A, B, C], 4)
    np.testing.assert_array_equal(_read(in_memory.select(shuffled), block), whole[shuffled])
    on_device = in_memory.on_device(torch.device("cpu"), copy=True)  # the GPU code path, on the CPU
    np.testing.assert_array_equal(_read(on_device.select(shuffled), block), whole[shuffled])
    np.testing.assert_array_equal(_read(on_device, block), whole)


def test_row_map_sees_each_blocks_position_and_streamed_parts_are_checked():
    A, B, C, blocks, reads = _parts(1)
    starts = []
    rows = FeatureRows([A, (blocks, 17)], 4).with_map(lambda X, start: starts.append(start) or X * 2)
    np.testing.assert_array_equal(_read(rows, 10), 2 * np.concatenate([A, B]).astype(np.float64))
    assert starts == [0, 10, 20, 23, 28, 33, 38]
    with pytest.raises(DataValidationError, match="increasing order"):
        list(FeatureRows([(blocks, 17)], 4).select(np.array([3, 1])).blocks())
    bad = B.copy()
    bad[7, 2] = np.nan
    with pytest.raises(DataValidationError, match=r"train features contains NaN .*\(7, 2\)"):
        list(FeatureRows([(lambda: [(bad, 0)], 17)], 4).blocks())
    with pytest.raises(DataValidationError, match=r"train block at row 5 has shape \(5, 3\)"):
        list(FeatureRows([(lambda: [(B[:5], 0), (B[5:10, :3], 5)], 17)], 4).blocks())
    with pytest.raises(DataValidationError, match="only after FeatureRows.cached"):
        FeatureRows([(blocks, 17)], 4).take(np.array([1]))


def test_logistic_on_device_parts_equals_numpy_parts():
    from pipeline.protocols.linear.logistic import LogisticProbe

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(120, 5)), rng.integers(0, 3, 120)
    rows = FeatureRows.of(X)
    a = LogisticProbe(C=1.0, tol=1e-9, Cs=[0.1, 1.0]).fit_rows(rows, y)
    b = LogisticProbe(C=1.0, tol=1e-9, Cs=[0.1, 1.0]).fit_rows(rows.on_device(torch.device("cpu"), copy=True), y)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-12, atol=1e-14)
