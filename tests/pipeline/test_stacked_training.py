"""The grid-at-once trainer: AdamW per member equals torch's, labels, splits, devices."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.utils.estimator_checks import parametrize_with_checks

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.nets.mlp import MLPProbe
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.inputs.labels import encode_labels, validation_split
from pipeline.protocols.nets.stacked_training import GridRecord, StackedAdamW, select_member

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_stacked_adamw_follows_torch_adamw_per_member():
    """Three members with their own (lr, wd) move exactly as three torch.optim.AdamW runs."""
    rng = np.random.default_rng(0)
    lrs, wds = [1e-3, 1e-2, 5e-2], [0.0, 0.1, 1.0]
    start = torch.from_numpy(rng.standard_normal((4, 3)))
    bias0 = torch.from_numpy(rng.standard_normal(3))
    target = torch.from_numpy(rng.standard_normal((5, 4)))
    W = start.expand(3, 4, 3).clone().requires_grad_(True)
    b = bias0.expand(3, 3).clone().requires_grad_(True)
    ours = StackedAdamW({"W": W, "b": b}, torch.tensor(lrs, dtype=torch.float64),
                        torch.tensor(wds, dtype=torch.float64), decayed=frozenset({"W"}))
    solo = []
    for lr, wd in zip(lrs, wds):
        Wg, bg = start.clone().requires_grad_(True), bias0.clone().requires_grad_(True)
        opt = torch.optim.AdamW([{"params": [Wg], "weight_decay": wd}, {"params": [bg], "weight_decay": 0.0}],
                                lr=lr, foreach=False)
        solo.append((Wg, bg, opt))
    for _ in range(25):
        loss = sum(((target @ W[g] + b[g]) ** 2).mean() for g in range(3))
        ours.zero_grad()
        loss.backward()
        ours.step()
        for Wg, bg, opt in solo:
            opt.zero_grad()
            ((target @ Wg + bg) ** 2).mean().backward()
            opt.step()
    for g, (Wg, bg, _) in enumerate(solo):
        torch.testing.assert_close(W[g].detach(), Wg.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b[g].detach(), bg.detach(), rtol=1e-12, atol=1e-12)


def test_encode_labels_any_sortable_type():
    classes, codes = encode_labels(["b", "a", "c", "a"], 4)
    assert list(classes) == ["a", "b", "c"]
    np.testing.assert_array_equal(codes, [1, 0, 2, 0])
    classes, codes = encode_labels(np.array([True, False, True]), 3)
    np.testing.assert_array_equal(classes[codes], [True, False, True])
    with pytest.warns(UserWarning, match="column-vector"):
        encode_labels(np.array([[0], [1]]), 2)
    with pytest.raises(DataValidationError, match="3 labels, but X has 4"):
        encode_labels([0, 1, 1], 4)
    with pytest.raises(DataValidationError, match="Unusable class labels"):
        encode_labels(np.array([1, "a"], dtype=object), 2)


def test_validation_split_is_stratified_seeded_or_given():
    codes = np.repeat([0, 1, 2], 20)
    tr, va = validation_split(codes, 0.25, 3)
    tr2, va2 = validation_split(codes, 0.25, 3)
    np.testing.assert_array_equal(va, va2)
    np.testing.assert_array_equal(np.bincount(codes[va]), [5, 5, 5])
    assert np.intersect1d(tr, va).size == 0 and tr.size + va.size == 60
    mask = np.zeros(60, bool)
    mask[:7] = True
    tr, va = validation_split(codes, 0.25, 3, val_mask=mask)
    np.testing.assert_array_equal(va, np.arange(7))
    with pytest.raises(DataValidationError, match="smallest class: 1"):
        validation_split(np.array([0, 0, 0, 1]), 0.5, 0)


def test_selection_breaks_ties_towards_stronger_decay_then_smaller_lr():
    acc = np.array([0.9, 0.9, 0.9, 0.8])
    loss = np.array([0.3, 0.3, 0.3, 0.1])
    record = GridRecord(acc[:, None], loss[:, None], np.ones(4, int), acc, loss, np.zeros(4, bool), 1)
    lrs, wds = np.array([1e-2, 1e-3, 1e-2, 1e-3]), np.array([1e-3, 1e-1, 1e-1, 1e-1])
    assert select_member(record, lrs, wds) == 1
    better_loss = GridRecord(acc[:, None], loss[:, None] - [[0], [0], [0.1], [0]], np.ones(4, int), acc,
                             loss - [0, 0, 0.1, 0], np.zeros(4, bool), 1)
    assert select_member(better_loss, lrs, wds) == 2


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(None) == resolve_device("auto")  # one contract: None is auto, as in the config
    for bad in ("gpu", 0, "mps"):
        with pytest.raises(ConfigError, match="valid choices|supported"):
            resolve_device(bad)


@parametrize_with_checks([MLPProbe(hidden_units=16, learning_rate=1e-2, batch_size=16, max_epochs=30, patience=5,
                                   device="cpu")])
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_mlp_sklearn_conformance(estimator, check):
    check(estimator)
