"""The dense readouts through `repeval run`: tiny ADE20K and NYUv2 copies in their publishers'
layouts, three random-init encoders with map layers, `segmentation` and `normals` cells
run by the real flow (Prefect test harness API, Dask LocalCluster, Zarr store), correlated
with the seed's conventions, shown in the report and compared by `repeval compare`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import pearsonr

from flows.cli.main import main
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.dense_layouts import write_ade20k, write_nyuv2


@pytest.mark.slow
def test_segmentation_and_normals_through_repeval_run(tmp_path: Path, prefect_harness, capsys) -> None:
    encoders = [{"name": "r18a", "arch": "resnet18", "input_size": 32, "seed": 0, "layers": ["block1.map"]},
                {"name": "r18b", "arch": "resnet18", "input_size": 32, "seed": 1, "layers": ["block1.map"]},
                {"name": "vit", "arch": "vit_tiny_patch16_224", "input_size": 32, "layers": ["block1.map"]}]
    config = {
        "store": str(tmp_path / "store"),
        "dask": {"n_workers": 1, "processes": False},
        "extract": {"batch_size": 4, "chunk_batches": 1},
        "encoders": encoders,
        "datasets": [{"name": "ade", "adapter": "ade20k", "params": {"root": str(write_ade20k(tmp_path / "a"))},
                      "test_split": "val"},
                     {"name": "nyu", "adapter": "nyuv2_normals", "params": {"root": str(write_nyuv2(tmp_path / "n"))}}],
        "protocols": [
            {"name": "seg", "protocol": "segmentation",
             "settings": {"learning_rates": [0.5, 2.0], "epochs": 4, "batch_size": 4, "device": "cpu"}},
            {"name": "nrm", "protocol": "normals",
             "settings": {"head": "linear", "learning_rate": 0.5, "epochs": 4, "batch_size": 4, "device": "cpu"}},
        ],
        "reference": {"scores": {"r18a": 0.4, "r18b": 0.5, "vit": 0.6}},
        "correlation": {"bootstrap": 0, "settings": [
            {"name": "seg miou", "protocol": "seg", "datasets": ["ade"], "layer": "block1.map", "metric": "miou"},
            {"name": "normals median", "protocol": "nrm", "datasets": ["nyu"], "layer": "block1.map",
             "metric": "median_angle_error"}]},
        "report": {"path": str(tmp_path / "report.html"), "baseline": "r18a"},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["computed"] == 6 and not summary["failed"], summary

    store = FeatureStore(config["store"], read_only=True)
    records = {(r["model"], r["setting"]): r for r in Ledger(store)}
    assert set(records) == {(e["name"], s) for e in encoders for s in ("seg", "nrm")}
    for (model, setting), rec in records.items():
        maps = store.open_array(rec["predicted_maps"]["key"]).read()
        assert maps.shape[:3] == (4, 32, 32) and rec["layer"] == "block1.map"
        assert np.isfinite(rec["metrics"]["score"]) and rec["evidence"]["kind"] == "pixel_counts"
    assert records["vit", "seg"]["grid"] == [2, 2] and records["r18a", "seg"]["grid"] == [8, 8]

    html = (tmp_path / "report.html").read_text()
    dense = html[html.index('<section id="dense">'):]
    assert "Semantic segmentation" in dense and "Surface normals" in dense and "data:image/png" in dense
    # the seed's conventions: mIoU logit-transformed, the median angular error negated, raw
    seg, nrm = summary["correlation"]["settings"]
    assert seg["status"] == nrm["status"] == "ok" and seg["n"] == nrm["n"] == 3
    models = nrm["models"]
    ref = [nrm["reference_logit"][m] for m in models]
    errors = [records[m, "nrm"]["metrics"]["median_angle_error"] for m in models]
    miou = np.array([records[m, "seg"]["metrics"]["miou"] for m in models])
    assert nrm["setting"]["pearson"] == pytest.approx(pearsonr(ref, -np.array(errors)).statistic)
    assert seg["setting"]["pearson"] == pytest.approx(pearsonr(ref, np.log(miou / (1 - miou))).statistic)

    assert main(["compare", "r18b", "r18a", "--config", str(path), "--json"]) == 0
    comparison = json.loads(capsys.readouterr().out)
    assert {c["setting"] for c in comparison["cells"]} == {"seg", "nrm"} and not comparison["not_compared"]
