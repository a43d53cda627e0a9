"""Relative paths in a config file mean the same from any working folder: each resolves
against the config file's folder (store, report, reference CSV, checkpoint folders,
encoder weights, and every adapter parameter that names a file or folder)."""

from __future__ import annotations

import os

import yaml

from jobs.config import load_config
from pipeline.datasets.catalog import path_parameters


def test_every_relative_path_resolves_against_the_config_file(tmp_path, monkeypatch):
    folder = tmp_path / "configs"
    folder.mkdir()
    config = {
        "store": "store", "report": {"path": "out/report.html"}, "reference": {"csv": "ref.csv"},
        "encoders": [{"name": "mine", "arch": "resnet18", "weights": "ckpts/mine.safetensors"},
                     {"name": "hub", "arch": "resnet18", "weights": "pretrained"}],
        "checkpoints": [{"path": "nightly", "arch": "resnet18"}],
        "datasets": [{"name": "imgs", "adapter": "image_folder", "params": {"root": "data/imgs", "skip_bad": True}},
                     {"name": "csv", "adapter": "csv_manifest", "params": {"csv_path": "lists/all.csv"}},
                     {"name": "net", "adapter": "imagenet",
                      "params": {"root": "/data/ilsvrc", "val_ground_truth": "~/gt.txt"}},
                     {"name": "d", "adapter": "digits", "params": {"test_size": 0.5}}],
        "protocols": [{"name": "knn20", "protocol": "knn"}],
    }
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)  # another working folder than the config's
    cfg = load_config("configs/bench.yaml")
    here = str(folder.resolve())
    assert cfg.store == f"{here}/store" and cfg.report.path == f"{here}/out/report.html"
    assert cfg.reference.csv == f"{here}/ref.csv" and cfg.checkpoints[0].path == f"{here}/nightly"
    assert cfg.encoders[0].weights == f"{here}/ckpts/mine.safetensors" and cfg.encoders[1].weights == "pretrained"
    params = {d.name: d.params for d in cfg.datasets}
    assert params["imgs"] == {"root": f"{here}/data/imgs", "skip_bad": True}
    assert params["csv"] == {"csv_path": f"{here}/lists/all.csv"}
    assert params["net"] == {"root": "/data/ilsvrc", "val_ground_truth": os.path.expanduser("~/gt.txt")}
    assert params["d"] == {"test_size": 0.5}


def test_path_parameters_are_those_annotated_as_paths():
    assert path_parameters("image_folder") == ("root",)
    assert path_parameters("csv_manifest") == ("csv_path",)
    assert path_parameters("features") == ("path",)
    assert path_parameters("imagenet") == ("root", "val_ground_truth")
    assert path_parameters("digits") == () and path_parameters("no-such-adapter") == ()
