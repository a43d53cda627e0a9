"""``benchmarks/gpu_checks.py`` runs end to end at toy sizes on the CPU (every GPU check,
``--smoke``; test_lab_scale.py runs ``benchmarks/bench_lab_scale.py``). Its figures are
printed by the script, never asserted here."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu_checks


def test_gpu_checks_agreement_writes_its_results_and_agrees_with_itself_on_the_cpu(tmp_path):
    gpu_checks.main(["--smoke", "--out", str(tmp_path), "--only", "agreement"])
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["device"] == "cpu" and results["smoke"] is True
    rows = {r["protocol"]: r for r in results["agreement"]}
    assert {"ridge", "knn", "logistic", "fewshot", "lowshot"} <= set(rows)
    for row in rows.values():  # the CPU against itself: the same numbers, bitwise
        assert row["difference"] == 0 and row["agree"] is True and 0 < row["cpu_score"] <= 1
    assert "| ridge |" in (tmp_path / "results.markdown").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_gpu_checks_without_a_gpu_say_so(tmp_path):
    with pytest.raises(SystemExit, match="no GPU is visible"):
        gpu_checks.main(["--out", str(tmp_path)])
    assert not (tmp_path / "results.json").exists()


@pytest.mark.slow
def test_gpu_checks_smoke_runs_every_check(tmp_path):
    results = gpu_checks.main(["--smoke", "--out", str(tmp_path), "--only", "knn", "logistic", "extraction"])
    for name in ("knn", "logistic"):
        assert not results[name].get("failed") and 0 < results[name]["score"] <= 1
    sides = {r["side"]: r for r in results["extraction"]}
    assert set(sides) == {"bare timm loop", "extract (PIL decode)", "extract (decode on device)"}
    assert all(r["images"] == 8 and r["images_per_s"] > 0 for r in sides.values())
    assert json.loads((tmp_path / "results.json").read_text())["extraction"] == results["extraction"]
