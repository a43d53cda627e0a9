"""``benchmarks/bench_lab_scale.py`` runs end to end at toy sizes on the CPU: import and
``repeval run`` with bounded memory, ``--rows`` small. Its figures are printed by the
script, never asserted here.

The script's ``repeval run`` reports to the session's Prefect API (through PREFECT_API_URL,
which its stages inherit), as a lab's run reports to its server: no temporary API is started
for it. (A file of its own: ``make test-order`` runs the fast tests of every file on the
session's API, and this one has none.)
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_lab_scale


@pytest.mark.slow
def test_lab_scale_bench_imports_float16_and_runs_a_protocol_through_repeval_run(tmp_path, prefect_harness,
                                                                                   monkeypatch):
    from prefect.settings import PREFECT_API_URL

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())
    rows = bench_lab_scale.main(["--rows", "3000", "--dim", "16", "--classes", "10", "--test", "300",
                                 "--logistic-rows", "600", "--only", "knn", "--work", str(tmp_path), "--keep"])
    assert [r["stage"] for r in rows] == ["generate", "import lab", "import lab_logistic", "run knn"]
    assert all(r["rc"] == 0 and r["peak_tree"] > 0 for r in rows)
    assert rows[-1]["score"] > 0.2 and rows[-1]["fit_s"] > 0 and rows[-1]["threads"] >= 1
    assert np.load(tmp_path / "lab" / "train_features.npy", mmap_mode="r").dtype == np.float16
    from storage_schema import FeatureStore

    stored = FeatureStore(str(tmp_path / "store")).features("lab", "lab", "train", "pre_logits")
    assert stored.status.dtype == "float16" and stored.status.shape == (3000, 16)
