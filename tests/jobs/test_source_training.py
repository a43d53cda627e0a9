"""The demo's source training gives the same checkpoints on every machine: seeded, with
deterministic kernels, on a fixed number of torch threads whatever the caller set (a sum
split over another number of threads rounds differently, and training amplifies that)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from jobs.source_training import train_checkpoints
from pipeline.datasets import make_dataset


def _train(folder, caller_threads: int, caller_seed: int):
    source = make_dataset("textures", name="source", seed=1, n_per_class={"train": 4, "test": 2})
    torch.set_num_threads(caller_threads)
    torch.manual_seed(caller_seed)
    saved = train_checkpoints("resnet18", source, [1, 2], str(folder), input_size=32, batch_size=4, seed=0)
    assert torch.get_num_threads() == caller_threads, "the caller's thread count is restored"
    after = torch.rand(3)
    torch.manual_seed(caller_seed)
    assert torch.equal(after, torch.rand(3)), "the caller's random state is restored"
    return [load_file(c.path) for c in saved], [c.source_accuracy for c in saved]


def test_checkpoints_are_bitwise_equal_whatever_the_callers_threads_and_seed(tmp_path):
    before = torch.get_num_threads()
    try:
        weights_a, accuracy_a = _train(tmp_path / "a", caller_threads=2, caller_seed=7)
        weights_b, accuracy_b = _train(tmp_path / "b", caller_threads=1, caller_seed=8)
    finally:
        torch.set_num_threads(before)
    assert accuracy_a == accuracy_b
    for a, b in zip(weights_a, weights_b, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]
    assert any(not torch.equal(weights_a[0][k], weights_a[1][k]) for k in weights_a[0]), "training changed nothing"
