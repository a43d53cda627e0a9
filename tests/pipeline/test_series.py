"""Checkpoint series: steps from names and metadata, best-so-far bookkeeping, regression flags."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from pipeline.analysis.compare import compare_predictions, decide_verdicts
from pipeline.errors import CheckpointError, ConfigError, DataValidationError
from pipeline.analysis.series import (
    BestSoFar,
    best_checkpoints,
    best_so_far,
    check_newest,
    checkpoint_step,
    compile_step_pattern,
    order_series,
    read_step_metadata,
    series_name,
    step_from_name,
)

WEIGHTS = {"w": torch.zeros(2, 2)}


@pytest.mark.parametrize(
    ("name", "pattern", "step"),
    [
        ("step1200.pth", "step{step}", 1200),
        ("step1200", "step{step}", 1200),
        ("model_step1200.pth", "step{step}", None),  # a template matches the whole name or stem
        ("model_step1200.pth", "*step{step}", 1200),
        ("vit-ep12.safetensors", "*-ep{step}.safetensors", 12),
        ("vit-ep12.pth", "*-ep{step}.safetensors", None),
        ("vit-ep12.safetensors.bak", "*-ep{step}", None),  # only the last extension is dropped
        ("ckpt_0042.safetensors", "ckpt_{step}", 42),
        ("run7/ckpt_19.pt", "ckpt_{step}", 19),  # only the file name is matched
        ("a1_b22.pt", "a?_b{step}", 22),
        ("a1_b22.pt", "*{step}", 22),  # '*' is non-greedy: every digit goes to the step
        ("ckpt_x.pt", "ckpt_{step}", None),
        ("weights-iter_300-final.pt", r"iter_(?P<step>\d+)", 300),  # a regex is searched anywhere
        ("weights.pt", r"iter_(?P<step>\d+)", None),
        ("e5.pt", re.compile(r"e(?P<step>\d+)"), 5),
    ],
)
def test_step_from_name(name: str, pattern: str, step: int | None) -> None:
    assert step_from_name(name, pattern) == step


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("ckpt-*.pt", r"must hold \{step\} exactly once"),
        ("{step}-{step}", "exactly once"),
        ("", "non-empty"),
        (r"(?P<step>\d+", "not a valid regular expression"),
        (re.compile(r"(\d+)"), "no named group 'step'"),
    ],
)
def test_bad_step_patterns(pattern: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compile_step_pattern(pattern)


def test_step_from_safetensors_metadata(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    save_file(WEIGHTS, str(path), metadata={"step": "1200", "epoch": "3"})
    assert read_step_metadata(path) == (1200, "step")
    save_file(WEIGHTS, str(path), metadata={"epoch": "3", "global_step": "900"})
    assert read_step_metadata(path) == (900, "global_step")
    save_file(WEIGHTS, str(path), metadata={"epoch": "3"})
    assert read_step_metadata(path) == (3, "epoch")
    save_file(WEIGHTS, str(path), metadata={"author": "me"})
    assert read_step_metadata(path) is None
    save_file(WEIGHTS, str(path))
    assert read_step_metadata(path) is None
    save_file(WEIGHTS, str(path), metadata={"step": "12a"})
    with pytest.raises(CheckpointError, match=r"'step' must be a whole number >= 0, got '12a'"):
        read_step_metadata(path)
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        read_step_metadata(path)


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ({"state_dict": WEIGHTS, "epoch": 7}, (7, "epoch")),
        ({"model": WEIGHTS, "step": torch.tensor(1200), "epoch": 2}, (1200, "step")),
        ({"model": WEIGHTS, "global_step": np.int64(40)}, (40, "global_step")),
        ({"model": WEIGHTS, "epoch": 3.0}, (3, "epoch")),
        (WEIGHTS, None),
    ],
)
def test_step_from_pickle_top_level(tmp_path: Path, entries: dict, expected: tuple | None) -> None:
    path = tmp_path / "c.pth"
    torch.save(entries, path)
    # a numpy scalar is read as the plain number it is (pipeline.encoders.checkpoints.reading: inert stand-ins)
    assert read_step_metadata(path) == expected


class _WritesMarker:
    """Unpickling this runs code that creates ``marker``: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("name", ["ckpt.pth", "ckpt.safetensors"])
def test_reading_the_step_never_runs_a_payload(tmp_path: Path, name: str) -> None:
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_WritesMarker(control)))
    assert control.exists()  # the payload is live
    marker, path = tmp_path / "pwned", tmp_path / name
    torch.save({"model": WEIGHTS, "step": 3, "extra": _WritesMarker(marker)}, path)
    with pytest.raises(CheckpointError, match=name):  # refused pickle, or not a safetensors header
        read_step_metadata(path)
    assert not marker.exists()


def test_step_from_legacy_pickle_format(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    torch.save({"model": WEIGHTS, "step": 5}, path, _use_new_zipfile_serialization=False)
    assert read_step_metadata(path) == (5, "step")


def test_step_metadata_refusals(tmp_path: Path) -> None:
    for value, shown in ((-3, "-3"), (2.5, "2.5"), (True, "True")):
        torch.save({"model": WEIGHTS, "step": value}, tmp_path / "bad.pt")
        with pytest.raises(CheckpointError, match=f"got {shown}"):
            read_step_metadata(tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="does not exist"):
        read_step_metadata(tmp_path / "missing.pth")
    (tmp_path / "x.onnx").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"unsupported extension '.onnx'.*\.safetensors"):
        read_step_metadata(tmp_path / "x.onnx")


def test_checkpoint_step_prefers_the_name_then_metadata(tmp_path: Path) -> None:
    named = tmp_path / "ckpt_500.safetensors"
    save_file(WEIGHTS, str(named), metadata={"step": "7"})
    assert checkpoint_step(named, "ckpt_{step}").step == 500
    assert checkpoint_step(named, "ckpt_{step}").source == "name"
    assert checkpoint_step(named).step == 7 and checkpoint_step(named).source == "metadata:step"
    assert checkpoint_step(named, "iter{step}").source == "metadata:step"  # no match: metadata
    bare = tmp_path / "final.safetensors"
    save_file(WEIGHTS, str(bare))
    with pytest.raises(CheckpointError, match=r"'final.safetensors'.*does not match.*'iter\{step\}'.*step, global_step, epoch"):
        checkpoint_step(bare, "iter{step}")


def test_order_series(tmp_path: Path) -> None:
    paths = []
    for step in (1000, 200, 30):
        paths.append(tmp_path / f"run-ep{step}.safetensors")
        save_file(WEIGHTS, str(paths[-1]))
    ordered = order_series(paths, "*-ep{step}.safetensors")
    assert [s.step for s in ordered] == [30, 200, 1000]  # numeric, not lexical, order
    assert [Path(s.path).name for s in ordered] == ["run-ep30.safetensors", "run-ep200.safetensors",
                                                     "run-ep1000.safetensors"]
    duplicate = tmp_path / "other-ep0200.safetensors"
    save_file(WEIGHTS, str(duplicate))
    with pytest.raises(CheckpointError, match="both have step 200"):
        order_series(paths + [duplicate], "*-ep{step}.safetensors")
    by_epoch, by_step = tmp_path / "e.safetensors", tmp_path / "s.safetensors"
    save_file(WEIGHTS, str(by_epoch), metadata={"epoch": "2"})
    save_file(WEIGHTS, str(by_step), metadata={"step": "2000"})
    with pytest.raises(CheckpointError, match="metadata:epoch.*metadata:step|cannot be ordered together"):
        order_series([by_epoch, by_step])


def test_series_name(tmp_path: Path) -> None:
    folder = tmp_path / "vit-run3"
    folder.mkdir()
    assert series_name(folder / "ckpt_1.pt") == "vit-run3"
    assert series_name(folder / "ckpt_1.pt", declared="nightly") == "nightly"
    with pytest.raises(ConfigError, match="series name"):
        series_name(folder / "ckpt_1.pt", declared=" ")


def _running_best_direct(scores: dict[int, float], higher: bool) -> list[tuple[int, int]]:
    out, steps = [], sorted(scores)
    for i, step in enumerate(steps):
        seen = steps[: i + 1]
        target = (max if higher else min)(scores[s] for s in seen)
        out.append((step, next(s for s in seen if scores[s] == target)))  # earliest of the ties
    return out


@pytest.mark.parametrize("higher", [True, False])
def test_best_so_far_matches_direct_running_best(higher: bool) -> None:
    rng = np.random.default_rng(0)
    scores = {int(s): float(v) for s, v in zip(rng.permutation(40) * 100, np.round(rng.random(40), 1))}
    running = best_so_far(scores, higher_is_better=higher)
    assert [(r.step, r.best_step) for r in running] == _running_best_direct(scores, higher)
    assert all(r.best_score == scores[r.best_step] and r.score == scores[r.step] for r in running)


def test_best_so_far_ties_keep_the_earlier_checkpoint() -> None:
    running = best_so_far({300: 0.8, 100: 0.7, 200: 0.8})
    assert running == [BestSoFar(100, 0.7, 100, 0.7), BestSoFar(200, 0.8, 200, 0.8), BestSoFar(300, 0.8, 200, 0.8)]
    with pytest.raises(DataValidationError, match="step 200.*finite"):
        best_so_far({100: 0.7, 200: float("nan")})
    with pytest.raises(DataValidationError, match="integers >= 0"):
        best_so_far({-1: 0.7})


SCORES = {
    ("linear", "cifar"): {100: 0.70, 200: 0.75, 300: 0.72},  # best 200, newest worse?
    ("linear", "pets"): {100: 0.60, 200: 0.62, 300: 0.66},  # newest is best
    ("fewshot", "cifar"): {100: 0.50, 300: 0.49},  # best 100
    ("fewshot", "pets"): {100: 0.40, 200: 0.45},  # no score at the newest step
}


def test_best_checkpoints_upto() -> None:
    best = best_checkpoints(SCORES)
    assert {c: b.best_step for c, b in best.items()} == {
        ("linear", "cifar"): 200, ("linear", "pets"): 300, ("fewshot", "cifar"): 100, ("fewshot", "pets"): 200}
    assert best_checkpoints(SCORES, upto=100)[("linear", "pets")].best_step == 100
    assert ("fewshot", "pets") not in best_checkpoints({("fewshot", "pets"): {200: 0.4}}, upto=100)


def test_check_newest_flags_significant_regressions() -> None:
    pending = check_newest(SCORES)
    assert pending.newest_step == 300
    assert pending.to_compare == {("linear", "cifar"): 200, ("fewshot", "cifar"): 100}
    assert pending.unchecked == (("linear", "cifar"), ("fewshot", "cifar")) and not pending.flagged
    assert pending.newest_is_best == (("linear", "pets"),) and pending.missing == (("fewshot", "pets"),)

    done = check_newest(SCORES, {("linear", "cifar"): "worse", ("fewshot", "cifar"): "indistinguishable"})
    assert done.flagged and done.regressed == (("linear", "cifar"),) and done.unchecked == ()
    assert not check_newest(SCORES, {("linear", "cifar"): "indistinguishable"}).flagged
    assert check_newest(SCORES, newest_step=200).newest_is_best == (
        ("linear", "cifar"), ("linear", "pets"), ("fewshot", "pets"))
    with pytest.raises(DataValidationError, match=r"unknown verdict.*better, worse, indistinguishable"):
        check_newest(SCORES, {("linear", "cifar"): "regressed"})
    with pytest.raises(DataValidationError, match="cells without scores"):
        check_newest(SCORES, {("linear", "imagenet"): "worse"})
    with pytest.raises(DataValidationError, match="no step"):
        check_newest({})


def test_series_regression_from_paired_predictions() -> None:
    # The whole pure path: newest vs best on each cell, BH verdicts, then the flag.
    rng = np.random.default_rng(3)
    y = rng.integers(0, 10, 1500)
    best_pred = np.where(rng.random(1500) < 0.8, y, (y + 1) % 10)
    newest = {"clear": np.where(rng.random(1500) < 0.7, y, (y + 1) % 10),
              "same": np.where(rng.random(1500) < 0.8, y, (y + 1) % 10)}  # as good, other mistakes
    scores = {cell: {1: float(np.mean(best_pred == y)), 2: float(np.mean(pred == y))} for cell, pred in newest.items()}
    pending = check_newest(scores)
    assert set(pending.to_compare) == {"clear", "same"}
    comparisons = {cell: compare_predictions(y, newest[cell], best_pred, n_resamples=100) for cell in pending.to_compare}
    verdicts = decide_verdicts(comparisons)
    check = check_newest(scores, {cell: v.verdict for cell, v in verdicts.items()})
    assert check.flagged and check.regressed == ("clear",)
