"""Two names whose checkpoint files hold the same weights share one record, and each keeps
its own file in what the report says was done to it (real files, extraction, ledger)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path
from types import SimpleNamespace

import timm
import torch

from jobs.config import ExtractConfig
from jobs.evaluation.evaluate import Cell, evaluate_cell
from jobs.extraction.extract import extract
from jobs.report.sections.overview import checkpoints_read
from jobs.report.inputs import run_records
from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec
from storage_schema import FeatureStore

ARCH = "test_resnet"


def test_a_name_sharing_another_names_record_keeps_its_own_checkpoint_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    sd = timm.create_model(ARCH, num_classes=0).state_dict()
    moco = tmp_path / "ck" / "moco.pth.tar"
    copy = tmp_path / "runs" / "moco_ep10.pth.tar"  # the same weights, written again by the lab's scan folder
    for path in (moco, copy):
        path.parent.mkdir()
        torch.save({"state_dict": {f"module.encoder_q.{k}": v for k, v in sd.items()}, "epoch": 10}, path)
    store = FeatureStore(str(tmp_path / "store"))
    data = make_dataset("textures", name="tex", n_per_class={"train": 4, "test": 4})
    statuses = []
    for name, path in (("moco", moco), ("r-moco_ep10", copy)):
        spec = EncoderSpec(name, ARCH, weights=str(path), input_size=32)
        statuses += [extract(store, spec, data, s, ExtractConfig(batch_size=16, progress=False)).status
                     for s in ("train", "test")]
    assert statuses[2:] == ["aliased", "aliased"]
    rec = evaluate_cell(store, Cell("moco", "tex", "pre_logits", "knn", "knn", {"n_neighbors": 3}))
    cells = [{"cell_id": rec.cell_id, "model": m, "dataset": "tex", "layer": "pre_logits", "setting": "knn"}
             for m in ("moco", "r-moco_ep10")]
    first, second = run_records(store, cells)
    assert second["recorded_as"] == "moco" and second["metrics"] == first["metrics"]
    assert first["provenance"]["weights"]["file"] == "moco.pth.tar"
    assert second["provenance"]["weights"]["file"] == "moco_ep10.pth.tar"  # its own, not moco's
    assert second["provenance"]["weights_fingerprint"] == first["provenance"]["weights_fingerprint"]
    table = str(checkpoints_read(SimpleNamespace(records=[first, second])))
    assert table.count("moco_ep10.pth.tar") == 1 and table.count("moco.pth.tar") == 1
