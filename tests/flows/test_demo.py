"""``make demo`` gives the same answers on every machine: what must not move does not, and
every figure stays within what another machine's rounding can move.

A fresh run of the demo at test size, and a second run beside it that does not train: its
checkpoints are the first run's, every float32 weight moved by up to a few ulps, as another
machine's kernels (which sum in another order) would leave them, and its process runs
another number of BLAS and OpenMP threads, as another machine would (the test-sized demo's
Dask workers are threads of that process, ``flows.demo.SMALL``: the extraction and the fits
run on those threads too). Its stored features must differ from the first run's, so that
the perturbation is seen to reach the numbers the figures come from.

Compared exactly: the source accuracies (the training is bitwise the same whatever the
caller's threads, tests/jobs/test_source_training.py), every logistic cell's choice of C
that its record says withstands far more noise than separates the two runs' features,
and every cell's test predictions up to one test image (the probes' own standard, see
benchmarks/bench_stability.py). Compared within a tolerance derived from that: each
correlation figure against the range it takes when every encoder's score on every dataset
moves by up to one test image (recomputed from the figures' own inputs, which must give the
figure itself), and each dataset's best linear accuracy within one test image. No figure is
compared by its printed digits: a value near a rounding boundary prints differently after any
change in its last bits.

Both runs report to the session's Prefect API (the figures never depend on which API
records the run; `make demo`'s own temporary API is what every `repeval run` starts,
tests/faults/test_kill_run.py among others): the start-up of a temporary API is saved.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from tests.helpers.cli import REPO, cli_env

#: The checkpoints the test-sized demo trains (flows.demo.SMALL).
TRAINED = ("seed0-resnet18-step0002", "seed0-resnet18-step0008", "seed1-resnet18-step0004")
#: The warnings a record carries when rounding, not the features, decides some of its predictions.
ROUNDING_DECIDES = {"selection_fragile", "tie_decided"}
#: How far each weight of the second run moves, in float32 ulps.
ULPS = 4
#: How far the two runs' features may differ, relative (asserted below): another extraction
#: moves every row of a channel alike, so a logistic cell whose choice of C withstands less
#: than this much of such noise (its ``selection_coherent_margin_ulps``, per standard
#: deviation) may choose another C from the second run's features.
FEATURES_RTOL = 1e-3
HELD_ULPS = FEATURES_RTOL / float(np.finfo(np.float32).eps)


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


def _logit(p: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    p = np.clip(p, eps, 1 - eps)
    return np.log(p) - np.log1p(-p)


def _correlation_range(figure: dict, n_test: dict[str, int],
                       allowed: dict[str, int]) -> tuple[float, float, float, float]:
    """(lowest r, highest r, lowest rho, highest rho) when each encoder's score on each dataset
    moves by up to the test images its cell may move by (``allowed``, by cell id), every encoder
    independently (the corners of that box); the unmoved scores must give the figure itself."""
    models = sorted(figure["reference_logit"])  # the encoders with a reference score
    reference = np.array([figure["reference_logit"][m] for m in models])

    def summary(shift: tuple[int, ...]) -> tuple[float, float]:
        x = np.array([np.mean([_logit(np.array(figure["scores"][m][d]
                                               + s * allowed[figure["cells"][m][d]] / n_test[d]))
                               for d in figure["scores"][m]]) for m, s in zip(models, shift)])
        return float(pearsonr(reference, x).statistic), float(spearmanr(reference, x).statistic)

    r, rho = summary((0,) * len(models))
    assert r == pytest.approx(figure["pearson"], abs=1e-9) and rho == pytest.approx(figure["spearman"], abs=1e-9)
    corners = [summary(shift) for shift in itertools.product((-1, 1), repeat=len(models))]
    rs, rhos = [c[0] for c in corners] + [r], [c[1] for c in corners] + [rho]
    return min(rs), max(rs), min(rhos), max(rhos)


def _cells(folder) -> dict:
    from storage_schema.ledger import Ledger
    from storage_schema.store import FeatureStore

    store = FeatureStore(str(folder / "store"), read_only=True)
    out = {}
    for rec in Ledger(store):
        key = (rec["model"], rec["dataset"], rec["layer"], rec["setting"])
        predictions = store.open_array(rec["evidence"]["key"]).read() if rec.get("evidence") else None
        out[key] = (rec, predictions)
    return out


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
    np.testing.assert_allclose(a, c, rtol=FEATURES_RTOL, atol=1e-4)
    assert figures_a["source_accuracy"] == figures_c["source_accuracy"]
    # what must not move, cell by cell: the choice of C, and the test predictions up to one image;
    # a cell whose record says rounding decides it (selection_fragile, tie_decided) may move, by
    # the images it names, and a logistic choice closer than HELD_ULPS of coherent noise may move
    cells_a, cells_c = _cells(fresh), _cells(moved)
    assert set(cells_a) == set(cells_c) and len(cells_a) >= 10
    n_test, allowed, held = {}, {}, []
    for key, (rec_a, pred_a) in cells_a.items():
        rec_c, pred_c = cells_c[key]
        assert pred_a is not None and pred_a.shape == pred_c.shape, key
        n_test[key[1]] = n = len(pred_a)
        said = {w["code"] for rec in (rec_a, rec_c) for w in rec.get("warnings", [])} & ROUNDING_DECIDES
        if any(rec["diagnostics"].get("selection_coherent_margin_ulps", np.inf) < HELD_ULPS for rec in (rec_a, rec_c)):
            said.add("selection_fragile")  # close enough for another extraction to move it
        allowed[key] = 1 if not said else n if "selection_fragile" in said else max(
            1, *(rec["diagnostics"].get("tie_decided", 0) for rec in (rec_a, rec_c)))
        if rec_a["protocol"] == "logistic" and not said:
            assert rec_a["diagnostics"]["C"] == rec_c["diagnostics"]["C"], key
            held.append(key)
        assert int(np.sum(pred_a != pred_c)) <= allowed[key], (key, int(np.sum(pred_a != pred_c)), said)
        assert abs(rec_a["metrics"]["score"] - rec_c["metrics"]["score"]) <= allowed[key] / n + 1e-12, key
    # most logistic choices hold far beyond what another extraction moves: they were compared
    logistic = [key for key, (rec, _) in cells_a.items() if rec["protocol"] == "logistic"]
    assert len(held) >= len(logistic) / 2, (len(held), len(logistic))
    # each figure within the range one test image per cell can move it
    assert set(figures_a["correlation"]) == set(figures_c["correlation"])
    by_id = {rec["cell_id"]: allowed[key] for key, (rec, _) in cells_a.items()}
    for name, figure in figures_a["correlation"].items():
        r_low, r_high, rho_low, rho_high = _correlation_range(figure, n_test, by_id)
        other = figures_c["correlation"][name]
        assert r_low - 1e-9 <= other["pearson"] <= r_high + 1e-9, (name, r_low, other["pearson"], r_high)
        assert rho_low - 1e-9 <= other["spearman"] <= rho_high + 1e-9, (name, rho_low, other["spearman"], rho_high)
    for dataset, group in figures_a["best_linear"].items():
        other = figures_c["best_linear"][dataset]
        images = max(allowed[key] for key in allowed if key[1] == dataset and key[3] == "linear")
        assert abs(group["accuracy"] - other["accuracy"]) <= images / n_test[dataset] + 1e-12, (dataset, group, other)
    assert any("test images" in line for line in printed_a) and len(printed_a) == len(printed_c)
