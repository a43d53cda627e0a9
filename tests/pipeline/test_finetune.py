"""Fine-tuning: settings, schedule, weight-decay rule, sample stream, selection, refit and
the result record, on a random-init tiny timm model (test_resnet at 32 px) on CPU."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec
from pipeline.errors import CheckpointError, ConfigError, DataValidationError
from pipeline.protocols.finetune import (
    CENTER_CROP,
    RANDOM_RESIZED_CROP_FLIP,
    DatasetSplits,
    FinetuneSettings,
    GridPoint,
    cosine_lr,
    finetune_result,
    grid_points,
    make_optimizer,
    make_scheduler,
    optimizer_weight_decay,
    run_finetune,
    run_grid_point,
    select_best,
)
from pipeline.protocols.finetune.data import SeededTrainingImages, StepBatchSampler, held_out_validation, train_transform
from pipeline.protocols.audits.calibration import calibration_report
from pipeline.protocols.metrics import accuracy_metrics
from pipeline.plain import to_plain

SPEC = EncoderSpec(name="tiny", arch="test_resnet", input_size=32)
SMALL = {"steps": 4, "batch_size": 8, "save_every": 2, "num_workers": 0, "eval_batch_size": 64,
         "augmentations": (RANDOM_RESIZED_CROP_FLIP,)}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def textures():
    return make_dataset("textures", n_per_class={"train": 10, "test": 5})


@pytest.fixture(scope="module")
def textures_with_val():
    return make_dataset("textures", n_per_class={"train": 8, "val": 3, "test": 4})


def _settings(**overrides) -> FinetuneSettings:
    return FinetuneSettings(**{**SMALL, "lrs": (0.01,), "weight_decays": (1e-4,), **overrides})


# -- settings and grid ---------------------------------------------------------------

def test_default_settings_are_the_papers():
    s = FinetuneSettings()
    assert (s.steps, s.batch_size, s.momentum, s.calibration_bins) == (5000, 64, 0.9, 15)
    np.testing.assert_allclose(s.lrs, [1e-4, 1e-3, 1e-2, 1e-1], rtol=1e-12)
    np.testing.assert_allclose(s.weight_decays, [0.0, 1e-6, 1e-5, 1e-4, 1e-3], rtol=1e-12)
    points = grid_points(s)
    assert s.augmentations == (RANDOM_RESIZED_CROP_FLIP, CENTER_CROP)  # the augmentation is a grid choice
    assert len(points) == 4 * 5 * 2
    assert points[:2] == [GridPoint(s.lrs[0], 0.0, RANDOM_RESIZED_CROP_FLIP), GridPoint(s.lrs[0], 0.0, CENTER_CROP)]
    one = FinetuneSettings(augmentations=(RANDOM_RESIZED_CROP_FLIP,))
    assert len(grid_points(one)) == 20
    assert FinetuneSettings.from_dict(to_plain(s)) == s


@pytest.mark.parametrize(("overrides", "fragment"), [
    ({"steps": 0}, "steps must be an integer >= 1, got 0"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"lrs": ()}, "lrs must not be empty"),
    ({"lrs": (0.1, -1.0)}, "finite number > 0 and <= 1e+30, got -1.0"),
    ({"weight_decays": (float("nan"),)}, "weight_decays"),
    ({"weight_decays": (1e-4, 1e-4)}, "duplicate"),
    ({"augmentations": ("mixup",)},
     "unknown augmentation 'mixup'; valid choices: random_resized_crop_flip, center_crop"),
    ({"augmentations": "center_crop"}, "non-empty sequence"),
    ({"momentum": 1.0}, "momentum must be in [0, 1)"),
    ({"val_fraction": 1.0}, "val_fraction must be in (0, 1)"),
    ({"precision": "float16"}, "precision must be one of float32, bfloat16"),
    ({"save_every": 0}, "save_every"),
])
def test_bad_settings_name_the_value_and_the_choices(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        FinetuneSettings(**overrides)
    assert fragment in str(err.value)


def test_unknown_setting_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="Unknown finetune setting.*'stepz'.*valid settings: steps, batch_size"):
        FinetuneSettings.from_dict({"stepz": 3})


# -- optimizer and schedule ------------------------------------------------------------

def test_cosine_schedule_matches_the_closed_form_also_across_a_state_reload():
    steps, lr = 37, 0.1
    point = GridPoint(lr, 1e-4, CENTER_CROP)
    param = torch.nn.Parameter(torch.zeros(3))
    opt = make_optimizer([param], point, _settings())
    sched = make_scheduler(opt, steps)
    seen = []
    for t in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        if t == 14:  # a resume rebuilds optimizer and scheduler from their state dicts
            o_state, s_state = opt.state_dict(), sched.state_dict()
            opt = make_optimizer([param], point, _settings())
            sched = make_scheduler(opt, steps)
            opt.load_state_dict(o_state)
            sched.load_state_dict(s_state)
    expected = [lr * 0.5 * (1 + math.cos(math.pi * t / steps)) for t in range(steps)]
    np.testing.assert_allclose(seen, expected, rtol=0, atol=lr * 1e-12)
    assert seen[0] == lr and 0 < seen[-1] < lr * 1e-2
    assert [cosine_lr(lr, t, steps) for t in range(steps)] == pytest.approx(expected, abs=0)


def test_optimizer_is_nesterov_sgd_with_weight_decay_divided_by_the_learning_rate():
    point = GridPoint(0.01, 1e-4, CENTER_CROP)
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(2))], point, _settings())
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.SGD)
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.01, 0.9, True)
    assert group["weight_decay"] == optimizer_weight_decay(point) == pytest.approx(1e-4 / 0.01, rel=1e-15)


@pytest.mark.parametrize("lr", [1e-4, 1e-2, 0.1])
def test_decay_per_step_does_not_depend_on_the_learning_rate(lr):
    """With a zero gradient only the decay moves the weights. Without momentum the first
    step scales them by 1 - lr * (wd / lr) = 1 - wd; with Nesterov momentum 0.9 the decay
    term enters the buffer and the step too: 1 - (1 + 0.9) * wd. Neither depends on lr."""
    wd = 1e-3
    for momentum, factor in ((0.0, 1 - wd), (0.9, 1 - 1.9 * wd)):
        theta = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
        opt = make_optimizer([theta], GridPoint(lr, wd, CENTER_CROP), _settings(momentum=momentum))
        theta.grad = torch.zeros_like(theta)
        opt.step()
        np.testing.assert_allclose(theta.detach().numpy(), np.array([1.0, -2.0]) * factor, rtol=1e-12)


# -- data --------------------------------------------------------------------------------

def test_held_out_validation_is_sklearns_stratified_draw():
    from sklearn.model_selection import StratifiedShuffleSplit

    y = np.repeat(np.arange(4), 10)
    train, val = held_out_validation(y, 0.2, seed=3)
    ref_train, ref_val = next(StratifiedShuffleSplit(1, test_size=0.2, random_state=3).split(y[:, None], y))
    assert train.tolist() == sorted(ref_train) and val.tolist() == sorted(ref_val)
    assert np.bincount(y[val]).tolist() == [2, 2, 2, 2]
    with pytest.raises(DataValidationError, match="stratified 0.2 validation split from 5 train samples"):
        held_out_validation(np.array([0, 0, 0, 1, 2]), 0.2, seed=0)


def test_batches_are_a_pure_function_of_the_step():
    full = list(StepBatchSampler(n=10, batch_size=4, steps=9, seed=5))
    tail = list(StepBatchSampler(n=10, batch_size=4, steps=9, seed=5, start_step=4))
    assert tail == full[4:]
    stream = [k for batch in full for _, k in batch]
    assert [p for batch in full for p, _ in batch] == list(range(36))
    for epoch in range(3):  # each epoch is a permutation of all samples
        assert sorted(stream[epoch * 10:(epoch + 1) * 10]) == list(range(10))
    assert stream[:10] != stream[10:20]
    assert full != list(StepBatchSampler(n=10, batch_size=4, steps=9, seed=6))


def test_augmentation_is_seeded_per_draw_and_leaves_global_rngs_alone(textures):
    cfg = {"input_size": (3, 32, 32), "interpolation": "bilinear", "mean": (0.5,) * 3, "std": (0.5,) * 3,
           "crop_pct": 0.95, "crop_mode": "center"}
    images = SeededTrainingImages(textures, [("train", 0), ("train", 1)], np.array([0, 0]),
                                  train_transform(cfg, RANDOM_RESIZED_CROP_FLIP), seed=0)
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    a, label = images[(7, 0)]
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == py_state
    assert torch.equal(a, images[(7, 0)][0]) and label == 0
    assert not torch.equal(a, images[(8, 0)][0])  # another draw of the same image: another crop
    centre = SeededTrainingImages(textures, [("train", 0)], np.array([0]), train_transform(cfg, CENTER_CROP), 0)
    assert torch.equal(centre[(1, 0)][0], centre[(2, 0)][0])  # the centre crop has no randomness


# -- one grid point --------------------------------------------------------------------

def test_selection_run_result_record(tmp_path, textures):
    s = _settings()
    point = grid_points(s)[0]
    r = run_grid_point(SPEC, textures, s, point, tmp_path / "a", "cpu")
    assert r["stage"] == "select" and r["point"] == to_plain(point)
    assert r["validation"] == "stratified 0.2 of train" and r["eval_split"] == "train"
    assert (r["n_train"], r["n_eval"]) == (32, 8)
    assert (r["steps"], r["steps_done"], r["batch_size"], r["diverged"]) == (4, 4, 8, False)
    assert r["optimizer_weight_decay"] == pytest.approx(1e-4 / 0.01)
    assert r["train_loss_first"] == pytest.approx(math.log(4), rel=1e-6)  # zero-initialised head
    assert r["logits"].shape == (8, 4) and r["logits"].dtype == np.float32
    _, val = held_out_validation(textures.labels("train"), 0.2, 0)
    assert r["labels"].tolist() == textures.labels("train")[val].tolist()
    expected = accuracy_metrics(r["labels"], r["logits"].argmax(axis=1), mean_per_class=False)
    assert {k: r[k] for k in expected} == expected
    assert r["resumed_from_step"] is None and r["timing"]["device"] == "cpu" and r["timing"]["steps_per_second"] > 0
    again = run_grid_point(SPEC, textures, s, point, tmp_path / "a", "cpu")  # finished state: no training
    assert again["resumed_from_step"] == 4 and again["timing"]["steps_per_second"] is None
    assert np.array_equal(again["logits"], r["logits"])


def test_refit_trains_on_train_plus_validation_and_scores_test(tmp_path, textures, textures_with_val):
    s = _settings(steps=2)
    point = grid_points(s)[0]
    splits = DatasetSplits(textures_with_val, val_split="val")
    sel = run_grid_point(SPEC, splits, s, point, tmp_path / "s", "cpu")
    ref = run_grid_point(SPEC, splits, s, point, tmp_path / "r", "cpu", stage="refit")
    assert (sel["n_train"], sel["eval_split"], sel["n_eval"]) == (32, "val", 12)
    assert sel["validation"] == "dataset split 'val'"
    assert (ref["n_train"], ref["eval_split"], ref["n_eval"]) == (32 + 12, "test", 16)
    assert ref["labels"].tolist() == textures_with_val.labels("test").tolist()
    held = run_grid_point(SPEC, textures, s, point, tmp_path / "h", "cpu", stage="refit")
    assert (held["n_train"], held["eval_split"], held["n_eval"]) == (40, "test", 20)  # held-out part back in


def test_the_refit_stream_draws_validation_samples(textures_with_val):
    """The refit's training set is train + val: over one epoch every sample of both
    splits is drawn exactly once."""
    from pipeline.protocols.finetune.unit import training_plan

    plan = training_plan(DatasetSplits(textures_with_val, val_split="val"), _settings(), "refit")
    sampler = StepBatchSampler(len(plan["samples"]), 4, steps=11, seed=0)
    drawn = [plan["samples"][k] for batch in sampler for _, k in batch]
    assert sorted(drawn) == sorted([("train", i) for i in range(32)] + [("val", i) for i in range(12)])


def test_diverged_run_is_recorded_and_never_selected(tmp_path, textures):
    s = _settings(lrs=(1e-2, 1e6), weight_decays=(0.0,))
    results = [run_grid_point(SPEC, textures, s, p, tmp_path / str(i), "cpu") for i, p in enumerate(grid_points(s))]
    stable, wild = results
    assert not stable["diverged"] and wild["diverged"] and wild["diverged_at_step"] < s.steps
    assert math.isnan(wild["score"]) and np.isnan(wild["logits"]).all()
    assert wild["steps_done"] == wild["diverged_at_step"]
    assert select_best(results, s)["point"] == stable["point"]


def test_another_runs_state_in_the_scratch_folder_is_refused(tmp_path, textures):
    s = _settings(lrs=(0.01, 0.02), steps=2)
    a, b = grid_points(s)
    run_grid_point(SPEC, textures, s, a, tmp_path, "cpu")
    with pytest.raises(CheckpointError, match="holds the state of another fine-tuning run"):
        run_grid_point(SPEC, textures, s, b, tmp_path, "cpu")


@pytest.mark.parametrize(("kwargs", "error", "fragment"), [
    ({"device": "tpu9"}, ConfigError, "is not a torch device"),
    ({"stage": "final"}, ConfigError, "stage must be one of select, refit"),
    ({"point": {"lr": 0.0, "weight_decay": 0.0, "augmentation": "center_crop"}}, ConfigError, "lr must be"),
    ({"settings": {"steps": -1}}, ConfigError, "steps must be an integer >= 1"),
])
def test_bad_input_fails_before_any_work(tmp_path, textures, kwargs, error, fragment):
    args = {"spec": SPEC, "dataset": textures, "settings": _settings(), "point": grid_points(_settings())[0],
            "scratch_dir": tmp_path / "never", "device": "cpu", **kwargs}
    with pytest.raises(error, match=fragment):
        run_grid_point(**args)
    assert not (tmp_path / "never").exists()


def test_splits_are_checked(tmp_path, textures):
    with pytest.raises(ValueError, match="Unknown split of dataset 'textures' 'val'"):
        DatasetSplits(textures, val_split="val")
    with pytest.raises(ConfigError, match="splits must differ"):
        DatasetSplits(textures, test_split="train")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "f.npz", train_features=rng.normal(size=(6, 3)), train_labels=np.array([0, 1] * 3),
             test_features=rng.normal(size=(4, 3)), test_labels=np.array([0, 1] * 2))
    with pytest.raises(ConfigError, match="holds precomputed features"):
        DatasetSplits(make_dataset("features", path=tmp_path / "f.npz"))


# -- selection and the record ------------------------------------------------------------

def _fake_select(point: GridPoint, score: float, rng, diverged: bool = False) -> dict:
    return {"stage": "select", "point": to_plain(point), "score": score, "diverged": diverged,
            "train_loss_last": 1.0, "optimizer_weight_decay": optimizer_weight_decay(point),
            "validation": "stratified 0.2 of train", "logits": rng.normal(size=(30, 3)),
            "labels": rng.integers(0, 3, 30)}


def test_select_best_takes_the_highest_validation_score_ties_to_the_earlier_point():
    rng = np.random.default_rng(0)
    s = FinetuneSettings(lrs=(1e-3, 1e-2, 1e-1), weight_decays=(0.0, 1e-4),
                         augmentations=(RANDOM_RESIZED_CROP_FLIP,))
    points = grid_points(s)
    scores = [0.5, 0.7, 0.9, 0.6, 0.9, 0.2]
    results = [_fake_select(p, v, rng) for p, v in zip(points, scores)]
    assert select_best(results[::-1], s)["point"] == to_plain(points[2])  # order of the list does not matter
    results[2] = _fake_select(points[2], float("nan"), rng, diverged=True)
    assert select_best(results, s)["point"] == to_plain(points[4])
    with pytest.raises(DataValidationError, match="1 grid point\\(s\\) have no selection result"):
        select_best(results[:-1], s)
    with pytest.raises(DataValidationError, match="appears twice"):
        select_best(results + [results[0]], s)
    with pytest.raises(DataValidationError, match="every one of the 6 grid points diverged"):
        select_best([_fake_select(p, float("nan"), rng, True) for p in points], s)


def test_finetune_result_calibrates_with_the_selection_runs_validation_logits():
    rng = np.random.default_rng(1)
    s = FinetuneSettings(lrs=(1e-3, 1e-2), weight_decays=(0.0,), calibration_bins=10,
                         augmentations=(RANDOM_RESIZED_CROP_FLIP,))
    points = grid_points(s)
    results = [_fake_select(points[0], 0.4, rng), _fake_select(points[1], 0.8, rng)]
    test_logits, test_labels = rng.normal(size=(40, 3)) * 3, rng.integers(0, 3, 40)
    refit = {"stage": "refit", "point": to_plain(points[1]), "score": 0.5, "top1": 0.5, "mean_per_class": 0.45,
             "diverged": False, "n_train": 100, "n_eval": 40, "weights_fingerprint": "abc",
             "logits": test_logits, "labels": test_labels}
    out = finetune_result(results, refit, s)
    cal = calibration_report(results[1]["logits"], results[1]["labels"], test_logits, test_labels, n_bins=10)
    assert out["metrics"] == {"score": 0.5, "top1": 0.5, "mean_per_class": 0.45, "ece": cal.ece_before,
                              "ece_temperature_scaled": cal.ece_after, "nll": cal.nll_before,
                              "nll_temperature_scaled": cal.nll_after}
    d = out["diagnostics"]
    assert d["selected"] == to_plain(points[1]) and d["temperature"] == cal.temperature
    assert [v["score"] for v in d["val_scores"]] == [0.4, 0.8] and d["converged"] and d["diverged_points"] == 0
    assert d["n_val"] == 30  # the validation images the selection runs were scored on
    with pytest.raises(DataValidationError, match="the refit ran point"):
        finetune_result(results, {**refit, "point": to_plain(points[0])}, s)


def test_run_finetune_selects_the_best_validation_point_and_refits_it(tmp_path, textures):
    s = _settings(lrs=(1e-3, 0.05), weight_decays=(0.0,), augmentations=(CENTER_CROP, RANDOM_RESIZED_CROP_FLIP),
                  steps=3)
    out = run_finetune(SPEC, textures, s, tmp_path, "cpu")
    scores = [v["score"] for v in out["diagnostics"]["val_scores"]]
    best = int(np.argmax(scores))  # argmax: the first of equal maxima, as selection breaks ties
    assert out["diagnostics"]["selected"] == to_plain(grid_points(s)[best])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["refit", "select-000", "select-001", "select-002",
                                                           "select-003"]
    m = out["metrics"]
    assert set(m) == {"score", "top1", "mean_per_class", "ece", "ece_temperature_scaled", "nll",
                      "nll_temperature_scaled"}
    assert all(np.isfinite(v) for v in m.values()) and out["diagnostics"]["n_test"] == 20


def test_dataloader_workers_do_not_change_the_result(tmp_path, textures):
    """Every draw seeds its own augmentation, so worker processes see the same crops."""
    s = _settings(lrs=(0.05,), steps=3)
    point = grid_points(s)[0]
    alone = run_grid_point(SPEC, textures, s, point, tmp_path / "w0", "cpu")
    workers = run_grid_point(SPEC, textures, _settings(lrs=(0.05,), steps=3, num_workers=2), point,
                             tmp_path / "w2", "cpu")
    assert workers["identity"] == alone["identity"]  # num_workers is not part of the run's identity
    assert np.array_equal(workers["logits"], alone["logits"])
    assert workers["train_loss_last"] == alone["train_loss_last"]


def test_bfloat16_autocast_runs_on_any_device(tmp_path, textures):
    s = _settings(steps=2, precision="bfloat16")
    r = run_grid_point(SPEC, textures, s, grid_points(s)[0], tmp_path, "cpu")
    assert not r["diverged"] and np.isfinite(r["logits"]).all() and r["logits"].dtype == np.float32
    assert r["identity"] != run_grid_point(SPEC, textures, _settings(steps=2), grid_points(s)[0],
                                           tmp_path / "f32", "cpu")["identity"]
