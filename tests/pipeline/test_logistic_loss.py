"""The logistic probe's fast paths equal the plain computations they replace: the l2 row
scale applied to the logits (not to a copy of the rows), float16 blocks converted into
kept buffers, consecutive rows read as views, L-BFGS pairs moved to a new penalty in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.linear.lbfgs import LBFGSMemory
from pipeline.protocols.linear.linear_loss import LinearLoss, gram_matrix, linear_score_blocks, split_row_scale
from pipeline.protocols.linear.logistic import LogisticProbe
from pipeline.protocols.transforms.transformers import l2_normalize, l2_normalize_block

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")


def _features(n, d, k, seed=0, dtype=np.float64):
    """Class-clustered, non-negative rows of unequal norms, and their labels."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    rng.shuffle(y)
    X = np.maximum(rng.standard_normal((k, d))[y] + rng.standard_normal((n, d)), 0.0) * rng.uniform(0.5, 3.0, (n, 1))
    return X.astype(dtype), y


def _gradient(X, y, coef, intercept, C):
    """Gradient of mean CE + ||W||^2 / (2 C n), in numpy (float64)."""
    n = X.shape[0]
    Z = X @ coef.T + intercept
    P = np.exp(Z - Z.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    P[np.arange(n), y] -= 1.0
    return np.hstack([P.T @ X / n + coef / (C * n), P.sum(axis=0)[:, None] / n])


def _theta(k, d, seed=1):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((k, d + 1)) * 0.3)


@pytest.mark.parametrize("multilabel", [False, True])
def test_row_scale_on_the_logits_equals_the_scaled_rows(multilabel):
    # d = 1100: blocks of ~950 rows, so 3000 rows span four blocks, the last one partial
    X, y = _features(3000, 1100, 5, dtype=np.float32)
    targets = np.eye(5, dtype=np.uint8)[y] if multilabel else y
    mapped = LinearLoss(FeatureRows.of(X).with_map(l2_normalize_block), torch.from_numpy(targets), 5, CPU)
    # the same map, wrapped so that it is not recognised: every block scaled, as before
    scaled = LinearLoss(FeatureRows.of(X).with_map(lambda block, start: l2_normalize_block(block, start)),
                        torch.from_numpy(targets), 5, CPU)
    assert mapped.scales is not None and mapped.rows.row_map is None and scaled.scales is None
    assert mapped.block < 3000 and 3000 % mapped.block
    theta = _theta(5, 1100)
    for fast, rtol in ((True, 1e-5), (False, 1e-12)):
        for _ in range(2):  # the second pass reuses the first one's buffers
            f, g, c = mapped.evaluate(theta, fast)
            f_ref, g_ref, c_ref = scaled.evaluate(theta, fast)
            assert f == pytest.approx(f_ref, rel=rtol)
            np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=rtol, atol=rtol * float(g_ref.abs().max()))
            np.testing.assert_allclose(c.numpy(), c_ref.numpy(), rtol=rtol)


def test_row_scale_gram_and_scores_equal_the_scaled_rows():
    X, y = _features(1500, 40, 4)
    rows = FeatureRows.of(X).with_map(l2_normalize_block)
    plain = FeatureRows.of(X).with_map(lambda block, start: l2_normalize_block(block, start))
    np.testing.assert_allclose(gram_matrix(rows, CPU).numpy(), gram_matrix(plain, CPU).numpy(), rtol=1e-5, atol=1e-6)
    coef, intercept = _theta(4, 40).numpy()[:, :-1], _theta(4, 40).numpy()[:, -1]
    for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        a = torch.cat([z for z, _ in linear_score_blocks(rows, coef, intercept, CPU, dtype)])
        b = torch.cat([z for z, _ in linear_score_blocks(plain, coef, intercept, CPU, dtype)])
        assert a.dtype == dtype
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=rtol)


def test_row_scale_is_taken_only_from_the_l2_map():
    X, _ = _features(50, 6, 2)
    rows = FeatureRows.of(X).with_map(lambda block, start: block * 2.0)
    assert split_row_scale(rows, CPU) == (rows, None)
    raw, scale = split_row_scale(FeatureRows.of(X).with_map(l2_normalize_block).select(np.arange(10, 40)), CPU)
    np.testing.assert_allclose(scale.numpy(), 1.0 / np.linalg.norm(X[10:40], axis=1), rtol=1e-14)
    np.testing.assert_array_equal(raw.numpy(), X[10:40])


def test_probe_with_the_l2_map_fits_what_it_fits_on_normalised_rows():
    X, y = _features(600, 20, 4, seed=3)
    rows, Xn = FeatureRows.of(X).with_map(l2_normalize_block), l2_normalize(X)
    for kwargs in ({"C": 3.0}, {"Cs": [0.1, 1.0, 10.0, 100.0]}):
        a = LogisticProbe(tol=1e-8, **kwargs).fit_rows(rows, y)
        b = LogisticProbe(tol=1e-8, **kwargs).fit(Xn, y)
        assert a.C_ == b.C_ and a.converged_ and b.converged_
        np.testing.assert_array_equal(a.val_scores_, b.val_scores_)
        # the optimum of the normalised rows' objective, to the fit's tolerance ...
        assert np.abs(_gradient(Xn, y, a.coef_, a.intercept_, a.C_)).max() <= 1.5e-8
        # ... so the same model as far as that tolerance fixes it (C = 100 leaves a flat loss)
        np.testing.assert_allclose(a.coef_, b.coef_, atol=1e-4 * np.abs(b.coef_).max())
        np.testing.assert_array_equal(a.predict_rows(rows), b.predict(Xn))


def test_a_zero_row_under_the_l2_map_is_named():
    X, y = _features(100, 5, 2)
    X[17] = 0.0
    with pytest.raises(DataValidationError, match="rows 17"):
        LogisticProbe(C=1.0).fit_rows(FeatureRows.of(X).with_map(l2_normalize_block), y)


def test_float16_blocks_through_the_kept_buffer_equal_their_float32_values():
    X16, y = _features(3000, 1100, 3, seed=4, dtype=np.float16)
    half = LinearLoss(FeatureRows.of(X16), torch.from_numpy(y), 3, CPU)
    full = LinearLoss(FeatureRows.of(X16.astype(np.float32)), torch.from_numpy(y), 3, CPU)
    theta = _theta(3, 1100) * 0.01
    for fast in (True, False, True):  # both buffers' dtypes, each used again
        a, b = half.evaluate(theta, fast), full.evaluate(theta, fast)
        assert a[0] == b[0]
        np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())
        np.testing.assert_array_equal(a[2].numpy(), b[2].numpy())


def test_blocks_into_a_buffer_and_consecutive_rows_as_views():
    X16 = np.arange(40 * 3, dtype=np.float16).reshape(40, 3)
    X32 = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    buffer = torch.empty((16, 3), dtype=torch.float32)
    rows = FeatureRows.of(X16)
    seen = [(block.clone(), start, block.data_ptr() == buffer.data_ptr())
            for block, start in rows.blocks(CPU, torch.float32, rows=16, buffer=buffer)]
    assert [s for _, s, _ in seen] == [0, 16, 32] and all(in_buffer for *_, in_buffer in seen)
    np.testing.assert_array_equal(torch.cat([b for b, _, _ in seen]).numpy(), X32)
    # no conversion needed: the stored rows themselves, not the buffer
    block, _ = next(FeatureRows.of(X32).blocks(CPU, torch.float32, rows=16, buffer=buffer))
    assert block.data_ptr() == X32.ctypes.data
    # consecutive selected rows are a view of the array; scattered ones, or rows across parts, a gathered copy
    block, start = next(FeatureRows.of(X32).select(np.arange(5, 30)).blocks(CPU, torch.float32, rows=64))
    assert start == 0 and block.data_ptr() == X32[5:].ctypes.data
    two = FeatureRows([X32, X32 + 1000], 3).select(np.arange(30, 50))
    np.testing.assert_array_equal(two.numpy(np.float32), np.concatenate([X32[30:], X32[:10] + 1000]))
    scattered = FeatureRows.of(X32).select(np.array([1, 3, 4, 9]))
    np.testing.assert_array_equal(scattered.numpy(np.float32), X32[[1, 3, 4, 9]])


def test_penalty_shift_in_place_is_the_formula():
    rng = np.random.default_rng(5)
    memory = LBFGSMemory(size=4)
    pairs = []
    for _ in range(6):  # more pairs than slots: the ring has wrapped
        s = torch.from_numpy(rng.standard_normal((3, 5)))
        y = s * 2.0 + torch.from_numpy(rng.standard_normal((3, 5))) * 0.1
        memory.push(s, y)
        pairs.append((s, y))
    mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    memory.shift_penalty(0.25, mask)
    for slot, (s, y) in zip(memory.order, pairs[-4:]):
        moved = y + 0.25 * s * mask
        np.testing.assert_allclose(memory.buf[slot].numpy(), s.ravel().numpy(), rtol=0)
        np.testing.assert_allclose(memory.buf[4 + slot].numpy(), moved.ravel().numpy(), rtol=1e-15)
        assert memory.rho[slot] == pytest.approx(1.0 / float(torch.sum(s * moved)), rel=1e-13)
    memory.shift_penalty(-50.0, mask)  # curvature no longer positive: every pair dropped
    assert len(memory) == 0
