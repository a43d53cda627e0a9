"""``make demo`` prints the same figures on every run, so the README can quote them.

Two fresh runs of the demo at test size, in separate processes whose BLAS/OpenMP thread
counts differ (as two machines' would), must print the same source accuracies,
correlations and best accuracies, and write the same full-precision ``figures.json``.

Both runs go at once, each in a folder of its own, and report to the session's Prefect
API (the figures never depend on which API records the run; `make demo`'s own temporary
API is what every `repeval run` starts, tests/faults/test_kill_run.py among others): the
two start-ups of a temporary API are saved, and while one run waits on its Dask workers
the other computes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.cli import REPO, cli_env


def _start(folder, threads: str) -> subprocess.Popen:
    from prefect.settings import PREFECT_API_URL

    folder.mkdir(parents=True)
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


@pytest.mark.slow
@pytest.mark.timeout(900)  # two demos at once, each training in float64, on a shared machine
def test_two_fresh_demo_runs_print_identical_figures(tmp_path, prefect_harness):
    runs = {folder: _start(folder, threads) for folder, threads in ((tmp_path / "a", "1"), (tmp_path / "b", "2"))}
    try:
        (figures_a, printed_a), (figures_b, printed_b) = (_figures(proc, folder) for folder, proc in runs.items())
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert printed_a == printed_b
    assert figures_a == figures_b
    assert figures_a["correlation"] and figures_a["best_linear"] and len(figures_a["source_accuracy"]) == 3
    assert any("Pearson r" in line for line in printed_a)
