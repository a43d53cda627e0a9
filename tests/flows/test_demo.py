"""``make demo`` prints the same figures on every machine, so the README can quote them.

A fresh run of the demo at test size, and a second run beside it that does not train: its
checkpoints are the first run's, every float32 weight moved by up to a few ulps, as another
machine's kernels (which sum in another order) would leave them, and its process runs
another number of BLAS and OpenMP threads, as another machine would (the test-sized demo's
Dask workers are threads of that process, ``flows.demo.SMALL``: the extraction and the fits
run on those threads too). Its stored features
must differ from the first run's, so that the perturbation is seen to reach the numbers the
figures come from, and it must print the same source accuracies, correlations and best
accuracies. It does because each figure is printed at the precision its data have: a single
best layer is not (the best layers lie within a point of each other, and which comes first
moved with the last bits), so the best accuracy is printed at its standard error's digit
with every layer McNemar's test cannot tell from it (``jobs.analysis.leaders``). That the
training gives the same checkpoints bit for bit whatever the caller's threads is
tests/jobs/test_source_training.py's (in one process: a third demo here cost the suite a
minute of both cores).

Both runs report to the session's Prefect API (the figures never depend on which API
records the run; `make demo`'s own temporary API is what every `repeval run` starts,
tests/faults/test_kill_run.py among others): the start-up of a temporary API is saved.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers.cli import REPO, cli_env

#: The checkpoints the test-sized demo trains (flows.demo.SMALL).
TRAINED = ("seed0-resnet18-step0002", "seed0-resnet18-step0008", "seed1-resnet18-step0004")
#: How far each weight of the second run moves, in float32 ulps.
ULPS = 4


def _start(folder, threads: str) -> subprocess.Popen:
    from prefect.settings import PREFECT_API_URL

    folder.mkdir(parents=True, exist_ok=True)
    env = cli_env() | {"REPEVAL_DEMO_DIR": str(folder), "REPEVAL_DEMO_SMALL": "1", "OMP_NUM_THREADS": threads,
                       "PREFECT_HOME": str(folder / "prefect"), "REPEVAL_HOME": str(folder / "repeval-home"),
                       "PREFECT_API_URL": PREFECT_API_URL.value()}  # the session's API
    return subprocess.Popen([sys.executable, "-m", "flows.demo"], stdout=open(folder / "stdout.txt", "w"),
                            stderr=open(folder / "stderr.txt", "w"), env=env, cwd=REPO)


def _figures(proc: subprocess.Popen, folder) -> tuple[dict, list[str]]:
    proc.wait(timeout=1200)
    out, err = (folder / "stdout.txt").read_text(), (folder / "stderr.txt").read_text()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    printed = [line for line in (err + out).splitlines()
               if "source accuracy" in line or "Pearson" in line or "accuracy on" in line]
    return json.loads((folder / "figures.json").read_text()), printed


def _wait_for_training(proc: subprocess.Popen, folder, timeout: float = 600) -> None:
    """Until the run has written every checkpoint and its sidecar (the sidecar comes last)."""
    deadline = time.monotonic() + timeout
    while not all((folder / "checkpoints" / f"{name}.json").exists() for name in TRAINED):
        assert proc.poll() is None, (folder / "stderr.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, "the demo trained no checkpoints in time"
        time.sleep(0.5)


def _perturbed_copy(source, target, seed: int = 0) -> None:
    """``source``'s checkpoints with every nonzero float32 weight moved by -ULPS..ULPS ulps."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(seed)
    target.mkdir(parents=True)
    for name in TRAINED:
        tensors = load_file(str(source / f"{name}.safetensors"))
        for key, value in tensors.items():
            if value.dtype == np.float32:
                bits = value.view(np.int32).copy()
                moved = value != 0  # zero stays zero: a step from it is a denormal, not an ulp
                bits[moved] += rng.integers(-ULPS, ULPS + 1, size=int(moved.sum()), dtype=np.int32)
                tensors[key] = bits.view(np.float32)
        save_file(tensors, str(target / f"{name}.safetensors"))
        shutil.copy(source / f"{name}.json", target / f"{name}.json")


@pytest.mark.slow
@pytest.mark.timeout(900)  # two demos at once, one training in float64, on a shared machine
def test_a_demo_from_weights_a_few_ulps_away_prints_the_same_figures(tmp_path, prefect_harness):
    from storage_schema.store import FeatureStore

    fresh, moved = tmp_path / "fresh", tmp_path / "moved"
    runs = {fresh: _start(fresh, "1")}
    try:
        _wait_for_training(runs[fresh], fresh)
        _perturbed_copy(fresh / "checkpoints", moved / "checkpoints")
        runs[moved] = _start(moved, "2")
        (figures_a, printed_a), (figures_c, printed_c) = (_figures(proc, folder) for folder, proc in runs.items())
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert figures_a["correlation"] and figures_a["best_linear"] and len(figures_a["source_accuracy"]) == 3
    assert any("Pearson r" in line for line in printed_a)
    # the perturbation reached the features: close, but not the same numbers
    a, c = (FeatureStore(str(folder / "store"), read_only=True).features(
        TRAINED[1], "textures", "test", "pre_logits").read() for folder in (fresh, moved))
    assert not np.array_equal(a, c)
    np.testing.assert_allclose(a, c, rtol=1e-3, atol=1e-4)
    assert figures_a["source_accuracy"] == figures_c["source_accuracy"]
    # another machine's rounding and threads move no printed figure: each is printed at the precision
    # its data have (the best accuracy as the group of layers tied with it, at its standard error's digit)
    assert printed_c == printed_a, [f"{x.strip()}  ->  {y.strip()}" for x, y in zip(printed_a, printed_c) if x != y]
    assert any("test images" in line for line in printed_a)
