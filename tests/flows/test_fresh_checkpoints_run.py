"""A folder-only config whose checkpoints were written just before ``repeval run``: the run
waits for them to settle and evaluates them all (lab files: a MoCo ``.pth.tar`` and a
Lightning ``.ckpt``); a file whose done marker never comes is named and the run exits 3.
The lab's image folder has a class without training images and a hidden folder: the run's
output, its summary and the report name them; the report says what was done to each
checkpoint. Real Prefect API, real Dask, real timm."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import timm
import torch
import yaml

from flows.cli.main import main
from tests.pipeline.datasets.layouts import write_image

ARCH = "test_resnet"


def _lab_files(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    moco = timm.create_model(ARCH, num_classes=0).state_dict()
    torch.save({"state_dict": {**{f"module.encoder_q.{k}": v for k, v in moco.items()},
                               **{f"module.encoder_k.{k}": v for k, v in moco.items()}}, "epoch": 9},
               folder / "moco_0009.pth.tar")
    torch.manual_seed(1)
    lit = timm.create_model(ARCH, num_classes=0).state_dict()
    torch.save({"state_dict": {f"model.{k}": v for k, v in lit.items()}, "global_step": 90}, folder / "last.ckpt")
    return [folder / "moco_0009.pth.tar", folder / "last.ckpt"]


@pytest.mark.slow
def test_checkpoints_written_just_before_a_run_are_evaluated_by_it(tmp_path: Path, prefect_harness, capsys) -> None:
    raw = {
        "store": str(tmp_path / "store"),
        "dask": {"n_workers": 1, "processes": False},
        "extract": {"batch_size": 40, "chunk_batches": 2},
        "checkpoints": [
            {"path": str(tmp_path / "ck"), "arch": ARCH, "input_size": 32, "settle_seconds": 2, "pattern": "*"},
            {"path": str(tmp_path / "marked"), "arch": ARCH, "input_size": 32, "settle_seconds": 1,
             "done_suffix": ".done", "pattern": "*.pth"},
        ],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 10, "test": 10}}},
                     {"name": "mine", "adapter": "image_folder", "params": {"root": str(tmp_path / "mine")}}],
        "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 3}}],
        "report": {"path": str(tmp_path / "out" / "report.html")},
    }
    for split, cls, n in (("train", "cat", 4), ("train", "bird", 4), ("test", "cat", 2), ("test", "bird", 2),
                          ("test", "dog", 2), ("train", "..evil", 1)):
        for i in range(n):
            write_image(tmp_path / "mine" / split / cls / f"{i}.png", 40 * i + len(cls))
    (tmp_path / "mine" / "train" / "dog").mkdir()  # an empty class folder: dog is only ever tested
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    _lab_files(tmp_path / "ck")
    unmarked = tmp_path / "marked" / "never_done.pth"
    unmarked.parent.mkdir()
    torch.save(timm.create_model(ARCH, num_classes=0).state_dict(), unmarked)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", str(config), "--json"])
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    err = capsys.readouterr().err
    assert "waiting up to 2 s for 3 checkpoint(s) still being written" in err
    assert summary["computed"] == 4 and summary["failures"] == []  # both fresh files, in this run
    assert summary["extracted"] == 8 and summary["waiting_checkpoints"] == [str(unmarked)]
    assert code == 3 and f"were not evaluated: {unmarked}" in err  # what it still left out is named

    empty = "mine/train: 1 class(es) without any image in split 'train': dog"
    hidden = "mine: 1 hidden folder(s) left out (names starting with '.'): train/..evil"
    assert f"[run] data warning: {empty}" in err and f"[run] data warning: {hidden}" in err  # the run's output
    assert {n["kind"] for n in summary["data_warnings"]} == {"empty_classes", "hidden_folders"}
    assert err.count(f"data warning: {empty}") == 2  # said before the run, and in its summary
    html = (tmp_path / "out" / "report.html").read_text()
    assert "train/..evil" in html and "without any image" in html and "dog" in html
    assert "prefix &#x27;module.encoder_q.&#x27; stripped" in html or "prefix 'module.encoder_q.' stripped" in html
    assert "moco_0009.pth.tar" in html and "last.ckpt" in html
