"""The demo's source training gives the same checkpoints on every machine: seeded, with
deterministic kernels, on a fixed number of torch threads whatever the caller set (a sum
split over another number of threads rounds differently, and training amplifies that)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from flows.demo_sources import train_checkpoints
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


# An AVX2 machine's kernels, here: ATen's vector code, oneDNN and MKL held to AVX2 (on an
# AVX-512 machine each sums in other orders; on a machine without AVX-512 the test compares
# a kernel set with itself and still holds).
OTHER_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}
# ... and ATen without vector code (its scalar samplers drew other initial weights before
# flows.demo_sources.portable_init)
SCALAR_KERNELS = {"ATEN_CPU_CAPABILITY": "default"}
# the kernel sets are chosen when torch loads: each other set trains in a process of its own
_TRAIN_SCRIPT = "import sys\nfrom tests.jobs.test_source_training import train_source\nprint(*train_source(sys.argv[1]))"


def train_source(folder: str) -> list[float]:
    """The kernels test's training, checkpoints into ``folder``; their source accuracies."""
    source = make_dataset("textures", name="source", seed=1, n_per_class={"train": 8, "test": 8})
    return [c.source_accuracy for c in
            train_checkpoints("resnet18", source, [4, 12], folder, input_size=32, batch_size=8, seed=0)]


@pytest.mark.slow
def test_checkpoints_agree_under_another_machines_kernels(tmp_path):
    """Float32 training on other kernels ends in other checkpoints (rounding differences
    amplified by each step: the demo's differed by up to 10 in a weight); the float64
    training leaves differences of about a float32 ulp, and the same source accuracies.

    The other kernel sets train in subprocesses, started together; meanwhile this process
    trains on its own kernels (on train_checkpoints' one thread, like the subprocesses),
    unless its caller set a kernel variable: then a subprocess without them does."""
    import os
    import subprocess
    import sys

    from tests.helpers.cli import REPO, cli_env

    def start(name: str, extra: dict[str, str]) -> subprocess.Popen:
        env = {k: v for k, v in cli_env().items() if k not in OTHER_KERNELS} | extra
        with open(tmp_path / f"{name}.log", "w") as log:  # a file: a full pipe would stall the run
            return subprocess.Popen([sys.executable, "-c", _TRAIN_SCRIPT, str(tmp_path / name)],
                                    stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=REPO)

    kernel_sets = {"other": OTHER_KERNELS, "scalar": SCALAR_KERNELS}
    if any(k in os.environ for k in OTHER_KERNELS):
        kernel_sets["here"] = {}
    procs = {name: start(name, extra) for name, extra in kernel_sets.items()}
    try:
        accuracies = {} if "here" in procs else {"here": train_source(str(tmp_path / "here"))}
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"{name}: {(tmp_path / f'{name}.log').read_text()[-3000:]}"
            accuracies[name] = [float(v) for v in out.split()]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    runs = {name: (acc, [load_file(str(p)) for p in sorted((tmp_path / name).glob("*.safetensors"))])
            for name, acc in accuracies.items()}
    acc_here, here = runs["here"]
    assert len(here) == 2
    for acc_other, other in (runs["other"], runs["scalar"]):
        assert acc_here == acc_other
        _agree_to_an_ulp(here, other)


def _agree_to_an_ulp(here: list[dict], other: list[dict]) -> None:
    for a, b in zip(here, other, strict=True):
        moved = [k for k in a if a[k].is_floating_point() and not torch.equal(a[k], b[k])]
        worst = max((float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-30)) for k in moved), default=0.0)
        assert worst < 1e-6, (moved[:3], worst)  # a float32 ulp relative to the tensor's scale


def test_portable_init_draws_the_distributions_asked_for_and_puts_torchs_back():
    from flows.demo_sources import portable_init

    normal, uniform = torch.Tensor.normal_, torch.Tensor.uniform_
    torch.manual_seed(0)
    with portable_init():
        w = torch.empty(400, 500)
        torch.nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
        u = torch.empty(200_000).uniform_(-0.5, 2.0)
        draws = [torch.empty(1000).normal_(generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.Tensor.normal_ is normal and torch.Tensor.uniform_ is uniform
    assert abs(float(w.std()) / (2 / 400) ** 0.5 - 1) < 0.01 and abs(float(w.mean())) < 1e-3
    assert float(u.min()) >= -0.5 and float(u.max()) < 2.0 and abs(float(u.mean()) - 0.75) < 0.01
    assert torch.equal(draws[0], draws[1])  # a generator given is the one used
