"""The dense protocols on in-memory maps: maps that carry the labels beat noise on both tasks,
an interrupted training resumes to bitwise the same result, bad input and settings are
refused before any work, and the memory estimate covers what a cell holds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pipeline.errors import CheckpointError, ConfigError, DataValidationError
from pipeline.protocols import get_protocol, resolve_settings
from pipeline.protocols.registry import EvalData
from tests.helpers.protocols import CHEAP, dense_data

TASKS = ("segmentation", "normals")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():  # tiny arrays: a torch thread pool only adds waiting on shared cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(task, data, **settings):
    return get_protocol(task)(data, resolve_settings(task, {**CHEAP[task], **settings}))


@pytest.mark.parametrize("task", TASKS)
def test_maps_that_carry_the_labels_beat_noise(task):
    good, noise = _run(task, dense_data(task)), _run(task, dense_data(task, informative=False))
    if task == "segmentation":
        assert good.metrics["miou"] > 0.8 > 0.5 > noise.metrics["miou"], (good.metrics, noise.metrics)
        assert good.metrics["pixel_accuracy"] > noise.metrics["pixel_accuracy"]
        assert good.maps.dtype == np.uint8 and good.maps.shape == (6, 16, 16)
        assert good.evidence.kind == "pixel_counts" and good.evidence.values.shape == (6, 3, 3)
    else:
        # bilinear upsampling blends neighbouring cells' normals (90 degrees apart) near cell borders
        assert good.metrics["within_30"] > 0.55 > 0.2 > noise.metrics["within_30"], (good.metrics, noise.metrics)
        assert good.metrics["median_angle_error"] < 26 < 50 < noise.metrics["median_angle_error"]
        assert good.maps.dtype == np.float16 and good.maps.shape == (6, 16, 16, 3)
        assert good.evidence.values.shape == (6, 4) and good.evidence.metric == "within_11_25"
    assert good.metrics["score"] == good.metrics["miou" if task == "segmentation" else "within_11_25"]
    assert good.diagnostics["grid"] == [4, 4] and good.diagnostics["target_size"] == [16, 16]


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("task", TASKS)
def test_an_interrupted_training_resumes_to_bitwise_the_same_result(task, tmp_path):
    data = dense_data(task)
    reference = _run(task, dataclasses.replace(data, scratch_dir=tmp_path / "ref"), save_every=2)
    part = "refit" if task == "segmentation" else "train"

    def stop(run, steps):
        if run == part and steps == 5:
            raise Interrupted

    victim = dataclasses.replace(data, scratch_dir=tmp_path / "victim", on_step=stop)
    with pytest.raises(Interrupted):
        _run(task, victim, save_every=2)
    resumed = _run(task, dataclasses.replace(victim, on_step=None), save_every=2)
    run = resumed.diagnostics["refit" if task == "segmentation" else "train"]
    assert run["resumed_from"] == 4 and run["steps"] == run["total_steps"] == 12  # 3 batches x 4 epochs
    assert resumed.metrics == reference.metrics
    np.testing.assert_array_equal(resumed.maps, reference.maps)
    np.testing.assert_array_equal(resumed.evidence.values, reference.evidence.values)
    with pytest.raises(CheckpointError, match="holds the state of another dense training run"):
        _run(task, dataclasses.replace(victim, on_step=None), save_every=2, epochs=3)


def test_bad_input_is_refused_before_training():
    seg = dense_data("segmentation")
    pooled = EvalData(y_train=np.arange(4) % 2, X_test=np.ones((2, 3)), y_test=np.arange(2), n_classes=2,
                      X_train=np.ones((4, 3)))
    with pytest.raises(DataValidationError, match="reads spatial maps and per-pixel targets of a dense dataset"):
        get_protocol("segmentation")(pooled, CHEAP["segmentation"])
    with pytest.raises(DataValidationError, match="cannot read spatial maps and per-pixel targets; protocols that "
                                                  "do: normals, segmentation"):
        get_protocol("knn")(seg)
    with pytest.raises(DataValidationError, match="needs normals targets; this cell's dataset has segmentation"):
        get_protocol("normals")(seg, CHEAP["normals"])
    nan = seg.X_train.copy()
    nan[3, 1, 2, 0] = np.nan
    with pytest.raises(DataValidationError, match=r"X_train contains 1 NaN or inf value\(s\)"):
        get_protocol("segmentation")(dataclasses.replace(seg, X_train=nan), CHEAP["segmentation"])
    beyond = seg.y_test.copy()
    beyond[0, 5, 5] = 7
    with pytest.raises(DataValidationError, match="y_test holds class 7; classes are 0 to 2 and 255"):
        get_protocol("segmentation")(dataclasses.replace(seg, y_test=beyond), CHEAP["segmentation"])
    with pytest.raises(DataValidationError, match=r"X_test has shape \(6, 16, 8\); 'segmentation' reads spatial"):
        get_protocol("segmentation")(dataclasses.replace(seg, X_test=seg.X_test.reshape(6, 16, 8)),
                                     CHEAP["segmentation"])
    with pytest.raises(DataValidationError, match="spatial maps, which protocol 'logistic' cannot take"):
        maps = dataclasses.replace(pooled, X_train=np.ones((4, 2, 2, 3)), X_test=np.ones((2, 2, 2, 3)))
        get_protocol("logistic")(maps)


@pytest.mark.parametrize("task, settings, message", [
    ("segmentation", {"learning_rates": []}, "learning_rates=.* must be a list of 1 to 64 finite numbers > 0"),
    ("segmentation", {"learning_rates": [0.1, -1.0]}, "must be a list of 1 to 64 finite numbers > 0"),
    ("segmentation", {"val_fraction": 1.0}, "val_fraction: 1.0 is out of range"),
    ("normals", {"head": "ppm"}, "head: 'ppm' is not one of 'pspnet', 'conv', 'linear'"),
    ("normals", {"momentum": 1.0}, "momentum: 1.0 is out of range"),
    ("normals", {"epochs": 0}, "epochs: 0 is out of range"),
    ("normals", {"device": "gpu"}, "device='gpu' is not a device"),
])
def test_bad_settings_are_refused_at_config_load(task, settings, message):
    with pytest.raises(ConfigError, match=message):
        resolve_settings(task, settings)


def test_selection_warns_at_the_edge_of_the_grid_and_diverged_fits_are_not_scored():
    result = _run("segmentation", dense_data("segmentation"), learning_rates=[1e-2, 1e-1])  # still improving at 0.1
    # a two-value grid always picks an edge: a caution saying what to widen, the score stands
    assert [w["code"] for w in result.warnings] == ["short_grid"]
    assert "two-value grid" in result.warnings[0]["message"] and "widen `learning_rates`" in result.warnings[0][
        "message"]
    selection = result.diagnostics["selection"]
    best = max(r["val_miou"] for r in selection)
    assert result.diagnostics["learning_rate"] == next(r["learning_rate"] for r in selection if r["val_miou"] == best)
    assert result.diagnostics["validation"] == "seeded 0.1 of train images" and len(selection) == 2
    with pytest.raises(DataValidationError, match="training diverged"):
        _run("normals", dense_data("normals"), learning_rate=1e30)  # the largest allowed


@pytest.mark.parametrize("task", TASKS)
def test_memory_estimate_covers_the_maps_targets_predictions_and_a_batch(task):
    proto = get_protocol(task)
    K = 150 if task == "segmentation" else 3
    shape = dict(n_val=0, dim=256, n_classes=K, itemsize=2, n_tokens=28 * 28, target_pixels=224 * 224)
    small = proto.memory_bytes(795, 654, **shape)
    more = proto.memory_bytes(1590, 654, **shape)
    per_pixel = 1 if task == "segmentation" else 6  # uint8 classes, or three float16
    held = (795 + 654) * (28 * 28 * 256 * 2 + 224 * 224 * per_pixel) + 654 * 224 * 224 * per_pixel
    if task == "segmentation":  # one batch's upsampled logits dominate: log-softmax and gradients too
        extra = batch = 8 * K * 224 * 224 * 4
        doubled = proto.memory_bytes(795, 654, **shape, settings={"batch_size": 16})
        assert 3 * batch < doubled - small < 8 * batch
    else:  # every valid test pixel's angular error in float64, for the exact median
        extra = 654 * 224 * 224 * 8
    assert held + 3 * extra < small < held + 8 * extra + 2**30
    assert more - small == pytest.approx(795 * (28 * 28 * 256 * 2 + 224 * 224 * per_pixel), rel=0.01)
