"""A fine-tuning run SIGKILLed between two saves resumes from the last save and ends with
bitwise the same weights, optimizer state, losses and metrics as an uninterrupted run."""

from __future__ import annotations

import random
import signal

import numpy as np
import pytest
import torch

from pipeline.protocols.finetune.state import STATE_FILE, capture_rng, load_state, restore_rng, run_identity, save_state
from pipeline.errors import CheckpointError
from tests.pipeline._finetune_child import SETTINGS, context, run_child


def _state(folder) -> dict:
    return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)


def _assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_sigkill_between_saves_then_resume_is_bitwise_equal(tmp_path):
    ctx = context()
    code, reference = run_child(ctx, str(tmp_path / "ref"), kill_after=None)
    assert code == 0 and reference["resumed_from_step"] is None

    victim = tmp_path / "victim"
    code, result = run_child(ctx, str(victim), kill_after=5)
    assert code == -signal.SIGKILL and result is None
    assert _state(victim)["step"] == 3  # the save after step 3; steps 4 and 5 are lost

    code, resumed = run_child(ctx, str(victim), kill_after=None)
    assert code == 0 and resumed["resumed_from_step"] == 3
    assert np.array_equal(resumed.pop("logits"), reference.pop("logits"))
    resumed.pop("resumed_from_step"), reference.pop("resumed_from_step")
    for key in reference:
        if isinstance(reference[key], np.ndarray):
            assert np.array_equal(resumed[key], reference[key]), key
        else:
            assert resumed[key] == reference[key], key

    ref_state, res_state = _state(tmp_path / "ref"), _state(victim)
    assert ref_state["step"] == res_state["step"] == SETTINGS.steps
    assert ref_state["losses"] == res_state["losses"] and len(ref_state["losses"]) == SETTINGS.steps
    _assert_same_tensors(ref_state["model"], res_state["model"])
    ref_buffers = {k: v["momentum_buffer"] for k, v in ref_state["optimizer"]["state"].items()}
    res_buffers = {k: v["momentum_buffer"] for k, v in res_state["optimizer"]["state"].items()}
    _assert_same_tensors(ref_buffers, res_buffers)
    assert ref_state["scheduler"] == res_state["scheduler"]
    assert torch.equal(ref_state["rng"]["torch"], res_state["rng"]["torch"])


def test_rng_states_round_trip_through_a_saved_state(tmp_path):
    device = torch.device("cpu")
    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    save_state(tmp_path, {"identity": "x", "rng": capture_rng(device)})
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(9), random.seed(9), np.random.seed(9)
    restore_rng(load_state(tmp_path, "x")["rng"], device)
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]  # no temporary file left behind


def test_a_damaged_or_foreign_state_is_an_error_not_a_fresh_start(tmp_path):
    identity = run_identity({"run": 1})
    assert load_state(tmp_path, identity) is None
    save_state(tmp_path, {"identity": identity, "step": 2})
    assert load_state(tmp_path, identity)["step"] == 2
    with pytest.raises(CheckpointError, match="holds the state of another fine-tuning run"):
        load_state(tmp_path, run_identity({"run": 2}))
    (tmp_path / STATE_FILE).write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_state(tmp_path, identity)
