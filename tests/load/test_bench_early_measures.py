"""The measures ``benchmarks/bench_early.py`` adds to its table, against direct formulas: the
RankMe baseline, the order of the pairs the exact test separates, and a spiked checkpoint.
(The benchmark itself takes minutes: its figures are in benchmarks/RESULTS.md.)"""

from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from benchmarks import bench_early


def test_rankme_is_the_effective_rank_of_the_singular_values():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(50, 8)))
    # equal singular values: the entropy of 8 equal shares, exp(ln 8) = 8
    assert np.isclose(bench_early.rankme(3.0 * q), 8.0, rtol=1e-5)
    # rank one: exp(0) = 1, the other shares at the 1e-7 floor
    assert np.isclose(bench_early.rankme(np.outer(rng.normal(size=50), rng.normal(size=8))), 1.0, rtol=1e-4)
    s = np.array([4.0, 2.0, 1.0, 1.0])
    p = s / s.sum()
    u, _ = np.linalg.qr(rng.normal(size=(20, 4)))
    v, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    assert np.isclose(bench_early.rankme(u @ np.diag(s) @ v.T), np.exp(-np.sum(p * np.log(p))), rtol=1e-5)


def test_separated_pairs_count_right_wrong_and_ties():
    pairs = [("a", "b", "better"), ("a", "c", "worse"), ("b", "c", "better"), ("c", "d", "better")]
    values = {"a": 0.9, "b": 0.5, "c": 0.5}  # a > b right, a > c wrong, b = c a tie, d unknown
    assert bench_early.ordered_share(values, pairs) == (1, 1)


def test_rankme_direction_needs_a_move_beyond_its_step():
    assert bench_early._direction(10.0, 10.0 * (1 + bench_early.RANKME_STEP / 2)) == "no verdict"
    assert bench_early._direction(11.0, 10.0) == "better"
    assert bench_early._direction(9.0, 10.0) == "worse"


def test_a_spike_adds_noise_of_its_size_to_weight_tensors_only(tmp_path):
    torch.manual_seed(0)
    weights = {"conv.weight": torch.randn(64, 3, 3, 3), "bn.weight": torch.ones(64), "fc.bias": torch.zeros(10),
               "bn.num_batches_tracked": torch.tensor(5)}
    path = tmp_path / "step0040.safetensors"
    save_file(weights, str(path))
    out = bench_early.spike(path, 1.5, seed=7)
    assert out.name == "step0040-spike.safetensors"
    spiked = load_file(str(out))
    for name in ("bn.weight", "fc.bias", "bn.num_batches_tracked"):
        assert torch.equal(spiked[name], weights[name])
    noise = spiked["conv.weight"] - weights["conv.weight"]
    rms = weights["conv.weight"].pow(2).mean().sqrt()
    # 1,728 draws: their RMS within 10 % of 1.5 times the tensor's
    assert abs(float(noise.pow(2).mean().sqrt() / rms) - 1.5) < 0.15
    out.unlink()  # drawn again from its seed: the same spike
    assert torch.equal(load_file(str(bench_early.spike(path, 1.5, seed=7)))["conv.weight"], spiked["conv.weight"])
