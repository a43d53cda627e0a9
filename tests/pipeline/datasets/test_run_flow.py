"""Publisher layouts read end to end through `repeval run`: the real flow (Prefect test
harness API, Dask LocalCluster, Zarr store, random-init timm encoders)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from flows.cli.main import main
from pipeline.datasets import make_dataset
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.pipeline.datasets import layouts as L
from tests.pipeline.datasets import layouts_more as M


@pytest.mark.slow
def test_voc2007_and_webdataset_through_repeval_run(tmp_path: Path, prefect_harness, capsys) -> None:
    voc, wds = M.voc2007(tmp_path / "voc"), L.webdataset(tmp_path / "wds")
    config = {
        "store": str(tmp_path / "store"),
        "dask": {"n_workers": 1, "processes": False},
        "extract": {"batch_size": 4, "chunk_batches": 1},
        "encoders": [{"name": "r18a", "arch": "resnet18", "input_size": 32, "seed": 0},
                     {"name": "r18b", "arch": "resnet18", "input_size": 32, "seed": 1}],
        "datasets": [
            {"name": "voc", "adapter": "voc2007", "params": {"root": str(voc.root)}, "val_split": "val"},
            {"name": "shards", "adapter": "webdataset", "params": {"root": str(wds.root)}},
        ],
        "protocols": [
            {"name": "linear", "protocol": "logistic", "settings": {"Cs": [0.1, 1.0, 10.0], "val_fraction": 0.4},
             "datasets": ["voc"]},
            {"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 3}, "datasets": ["shards"]},
        ],
        "report": {"path": str(tmp_path / "report.html")},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["units"] == 2 * (3 + 2) and summary["computed"] == 4 and not summary["failed"]

    store = FeatureStore(config["store"], read_only=True)
    labels = store.labels("voc", "test")
    expected = make_dataset("voc2007", root=voc.root).labels("test")
    np.testing.assert_array_equal(labels.read(), expected)  # (n, 20) with the difficult -1 entries
    assert labels.shape == (5, 20) and (labels.read() == -1).any()
    records = list(Ledger(store))
    voc_records = [r for r in records if r["dataset"] == "voc"]
    assert len(voc_records) == 2 and len(records) == 4
    for rec in voc_records:
        metrics = rec["metrics"]
        assert 0.0 <= metrics["map11"] <= 1.0 and metrics["score"] == metrics["map11"]
        assert rec["diagnostics"]["validation"] == "dataset split" and rec["diagnostics"]["multi_label"]
