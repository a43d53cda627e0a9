"""ECE and temperature scaling (Guo 2017, Ericsson 4.7)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.special import softmax

from pipeline.errors import DataValidationError
from pipeline.protocols.audits.calibration import (
    CalibrationReport,
    apply_temperature,
    calibration_report,
    expected_calibration_error,
    fit_temperature,
    negative_log_likelihood,
)
from pipeline.plain import to_plain


def _hand_ece(conf: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    """Guo et al.'s loop: bins (lo, hi] over equal-width edges, 0 in the first bin."""
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for b in range(n_bins):
        lo, hi = edges[b], edges[b + 1]
        inside = (conf > lo) & (conf <= hi)
        if b == 0:
            inside |= conf == 0.0
        if inside.any():
            total += inside.mean() * abs(correct[inside].mean() - conf[inside].mean())
    return total


def _overconfident(n: int, k: int, seed: int, scale: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """Logits whose softmax is sharper than the true label distribution (true T = scale)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0, 1.5, size=(n, k))
    p_true = softmax(base, axis=1)
    y = (rng.random(n)[:, None] > np.cumsum(p_true, axis=1)).sum(axis=1)
    return base * scale, y


def test_ece_matches_hand_computation_from_probs() -> None:
    logits, y = _overconfident(500, 4, 0)
    probs = softmax(logits, axis=1)
    got = expected_calibration_error(probs, y)
    want = _hand_ece(probs.max(axis=1), probs.argmax(axis=1) == y, 15)
    assert got == pytest.approx(want, abs=1e-12)
    assert got > 0.05  # over-confident


def test_ece_from_confidences_and_edges() -> None:
    # values exactly on bin edges go to the bin below them (right-closed bins); 0 to bin 0
    conf = np.array([0.0, 0.2, 0.4, 0.4000001, 1.0, 0.5, 0.5])
    correct = np.array([0, 1, 1, 0, 1, 1, 0], dtype=bool)
    for n_bins in (1, 5, 15):
        got = expected_calibration_error(conf, correct, n_bins)
        assert got == pytest.approx(_hand_ece(conf, correct, n_bins), abs=1e-12)
    # a single bin: |mean accuracy - mean confidence|
    assert expected_calibration_error(conf, correct, 1) == pytest.approx(abs(correct.mean() - conf.mean()))
    # perfectly calibrated per bin -> 0
    assert expected_calibration_error([1.0, 1.0], [1, 1]) == pytest.approx(0.0)
    assert expected_calibration_error(conf, correct.astype(int)) == expected_calibration_error(conf, correct)


def test_ece_input_errors() -> None:
    logits, y = _overconfident(20, 3, 1)
    with pytest.raises(DataValidationError, match="sum to 1.*not logits"):
        expected_calibration_error(logits, y)
    with pytest.raises(DataValidationError, match=r"labels must lie in \[0, 2\]"):
        expected_calibration_error(softmax(logits, axis=1), y + 1)
    with pytest.raises(DataValidationError, match="correctness flags"):
        expected_calibration_error(np.full(3, 0.5), [0, 2, 1])
    with pytest.raises(DataValidationError, match="n_bins"):
        expected_calibration_error(np.full(3, 0.5), [0, 1, 1], n_bins=0)
    with pytest.raises(DataValidationError, match=r"\[0, 1\]"):
        expected_calibration_error(np.array([0.5, 1.5]), [0, 1])


def test_temperature_lowers_nll_and_matches_grid_search() -> None:
    logits, y = _overconfident(800, 5, 2, scale=4.0)
    t = fit_temperature(logits, y)
    assert t > 1.5  # over-confident logits are softened
    grid = np.exp(np.linspace(np.log(0.2), np.log(20.0), 4001))
    nlls = np.array([negative_log_likelihood(logits, y, g) for g in grid])
    t_grid = grid[nlls.argmin()]
    assert t == pytest.approx(t_grid, rel=2e-3)
    assert negative_log_likelihood(logits, y, t) <= nlls.min() + 1e-12
    assert negative_log_likelihood(logits, y, t) < negative_log_likelihood(logits, y, 1.0) - 0.05


def test_apply_temperature_keeps_predictions() -> None:
    logits, _ = _overconfident(50, 4, 3)
    p = apply_temperature(logits, 3.0)
    np.testing.assert_allclose(p, softmax(logits / 3.0, axis=1), rtol=1e-12)
    np.testing.assert_array_equal(p.argmax(axis=1), logits.argmax(axis=1))
    with pytest.raises(DataValidationError, match="temperature must be"):
        apply_temperature(logits, 0.0)


def test_calibration_report_improves_ece() -> None:
    logits, y = _overconfident(3000, 5, 4, scale=4.0)
    rep = calibration_report(logits[:1500], y[:1500], logits[1500:], y[1500:])
    assert isinstance(rep, CalibrationReport)
    assert rep.temperature == pytest.approx(fit_temperature(logits[:1500], y[:1500]))
    assert rep.ece_after < rep.ece_before / 2
    assert rep.nll_after < rep.nll_before
    assert rep.accuracy == pytest.approx(np.mean(logits[1500:].argmax(1) == y[1500:]))
    assert not rep.temperature_at_bound
    assert to_plain(rep)["n_bins"] == 15


def test_separable_validation_hits_the_bound() -> None:
    y = np.array([0, 1, 2, 0, 1, 2])
    logits = np.eye(3)[y] * 5.0
    with pytest.warns(RuntimeWarning, match="lower bound"):
        assert fit_temperature(logits, y) == pytest.approx(1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = calibration_report(logits, y, logits, y)
    assert rep.temperature_at_bound
    with pytest.raises(DataValidationError, match="constant within every row"):
        fit_temperature(np.zeros((4, 3)), [0, 1, 2, 0])
    with pytest.raises(DataValidationError, match="4 classes but logits_test has 3"):
        calibration_report(np.zeros((4, 4)) + np.eye(4), [0, 1, 2, 3], logits, y)


def test_report_from_blocks_equals_report_from_arrays() -> None:
    import torch

    from pipeline.protocols.audits.calibration import calibration_report_blocks

    logits, y = _overconfident(3000, 5, 4, scale=4.0)
    whole = calibration_report(logits[:1500], y[:1500], logits[1500:], y[1500:])
    Z, Y = torch.from_numpy(logits), torch.from_numpy(y.astype(np.int64))

    def blocks(lo, hi, size):
        return lambda: ((Z[i:min(i + size, hi)], Y[i:min(i + size, hi)]) for i in range(lo, hi, size))

    parts = calibration_report_blocks(blocks(0, 1500, 128), blocks(1500, len(y), 97))
    assert parts.temperature == pytest.approx(whole.temperature, rel=1e-10)
    for field in ("ece_before", "ece_after", "nll_before", "nll_after", "accuracy"):
        assert getattr(parts, field) == pytest.approx(getattr(whole, field), rel=1e-10, abs=1e-14)
