"""``make demo`` prints the same figures on every run, so the README can quote them.

Two fresh runs of the demo at test size, in separate processes whose BLAS/OpenMP thread
counts differ (as two machines' would), must print the same source accuracies,
correlations and best accuracies, and write the same full-precision ``figures.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.cli import REPO, cli_env


def _demo(folder, threads: str) -> tuple[dict, list[str]]:
    env = cli_env() | {"REPEVAL_DEMO_DIR": str(folder), "REPEVAL_DEMO_SMALL": "1", "OMP_NUM_THREADS": threads,
                       "PREFECT_HOME": str(folder / "prefect"),
                       # a shared, loaded machine can take longer than Prefect's 20 s to start its API
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    out = subprocess.run([sys.executable, "-m", "flows.demo"], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=1200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    printed = [line for line in (out.stderr + out.stdout).splitlines()
               if "source accuracy" in line or "Pearson" in line or "accuracy on" in line]
    return json.loads((folder / "figures.json").read_text()), printed


@pytest.mark.slow
def test_two_fresh_demo_runs_print_identical_figures(tmp_path):
    figures_a, printed_a = _demo(tmp_path / "a", threads="1")
    figures_b, printed_b = _demo(tmp_path / "b", threads="2")
    assert printed_a == printed_b
    assert figures_a == figures_b
    assert figures_a["correlation"] and figures_a["best_linear"] and len(figures_a["source_accuracy"]) == 3
    assert any("Pearson r" in line for line in printed_a)
