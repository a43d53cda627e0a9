"""Every record's validation count is what the protocol did: a share held out of train is
counted (``n_val``, ``n_val_images``), a validation split that selected is counted, one
that was only trained on is not, and no selection reads ``none``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pipeline.protocols import get_protocol, resolve_settings
from pipeline.protocols.registry import EvalData
from tests.helpers.protocols import CHEAP, dense_data


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():  # tiny arrays: a torch thread pool only adds waiting on shared cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(name, data, **settings):
    return get_protocol(name)(data, resolve_settings(name, {**CHEAP.get(name, {}), **settings}))


def _blobs(n: int, seed: int, d: int = 6, K: int = 3) -> tuple[np.ndarray, np.ndarray]:
    centres = np.random.default_rng(99).normal(size=(K, d)) * 2
    y = np.arange(n) % K
    return (centres[y] + np.random.default_rng(seed).normal(size=(n, d))).astype(np.float32), y


def test_segmentation_counts_the_images_it_held_out_or_read():
    seg = dense_data("segmentation")  # 12 train images, no validation split
    held = _run("segmentation", seg, val_fraction=0.25).diagnostics
    assert held["validation"] == "seeded 0.25 of train images"
    assert held["n_val_images"] == 3 and held["n_selection_images"] == 9  # 12 x 0.25 held out of the grid's fits
    assert held["n_train_images"] == 12  # the refit: every train image

    other = dense_data("segmentation", n_train=4, seed=1)
    split = _run("segmentation", dataclasses.replace(seg, X_val=other.X_train, y_val=other.y_train)).diagnostics
    assert split["validation"] == "dataset split"
    assert split["n_val_images"] == 4 and split["n_selection_images"] == 12
    assert split["n_train_images"] == 16  # the refit is trained on train + validation


def test_normals_select_nothing_and_count_no_validation():
    normals = dense_data("normals")
    other = dense_data("normals", n_train=4, seed=1)
    diag = _run("normals", dataclasses.replace(normals, X_val=other.X_train, y_val=other.y_train)).diagnostics
    assert diag["n_val_images"] == 0 and diag["n_train_images"] == 16
    assert diag["validation"] == "none: one learning rate; the validation split is trained on"


def test_logistic_counts_its_validation_rows():
    X, y = _blobs(60, 0)
    X_te, y_te = _blobs(30, 1)
    X_val, y_val = _blobs(15, 2)
    data = EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=3, X_train=X)

    held = _run("logistic", data, val_fraction=0.2, device="cpu").diagnostics
    assert held["validation"] == "stratified 0.2 of train" and held["n_val"] == 12  # 60 x 0.2, 4 per class
    split = _run("logistic", dataclasses.replace(data, X_val=X_val, y_val=y_val), device="cpu").diagnostics
    assert split["validation"] == "dataset split" and split["n_val"] == 15
    fixed = _run("logistic", dataclasses.replace(data, X_val=X_val, y_val=y_val), Cs=None, device="cpu").diagnostics
    assert fixed["n_val"] == 0 and fixed["validation"] == "none: C fixed; the validation split is trained on"


def test_ridge_spends_no_rows_on_validation():
    X, y = _blobs(60, 0)
    X_te, y_te = _blobs(30, 1)
    diag = _run("ridge", EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=3, X_train=X), device="cpu").diagnostics
    assert diag["n_val"] == 0 and diag["validation"] == "exact leave-one-out on train"
    fixed = _run("ridge", EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=3, X_train=X), alphas=None,
                 alpha=0.5, device="cpu")
    assert fixed.diagnostics["validation"] == "none: alpha fixed" and fixed.diagnostics["alpha"] == 0.5
    assert "press" not in fixed.diagnostics and not [w for w in fixed.warnings if w["code"].startswith("grid")]


def test_mlp_counts_the_validation_rows_of_its_grid_and_its_linear_baseline():
    X, y = _blobs(90, 0)
    X_te, y_te = _blobs(30, 1)
    X_val, y_val = _blobs(21, 2)
    data = EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=3, X_train=X, X_val=X_val, y_val=y_val)
    diag = _run("mlp", data, device="cpu").diagnostics
    assert diag["validation"] == "dataset split" and diag["n_val"] == 21
    assert diag["linear"]["n_val"] == 21  # a grid of one C is still scored (and calibrated) on the split
