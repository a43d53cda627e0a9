"""The repeval command line, called in process (store commands) on a real store."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from flows.cli.main import main
from jobs.evaluation.evaluate import Cell, evaluate_cell
from storage_schema import ArraySpec, FeatureStore


def _npz(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 60), ("test", 30)):
        y = np.arange(n) % 3
        arrays[f"{split}_features"] = (rng.normal(size=(n, 5)) + y[:, None]).astype(np.float32)
        arrays[f"{split}_labels"] = y
    np.savez(tmp_path / "f.npz", **arrays)
    return str(tmp_path / "f.npz")


def test_import_ls_results(tmp_path, capsys):
    store = str(tmp_path / "store")
    assert main(["import-features", "--store", store, "--model", "ext", "--path", _npz(tmp_path),
                 "--dataset-name", "blobs"]) == 0
    assert "imported features/ext/blobs/train/pre_logits: 60 x 5" in capsys.readouterr().out
    assert main(["ls", "--store", store]) == 0
    listing = capsys.readouterr().out
    assert "features/ext/blobs/test/pre_logits" in listing and "complete" in listing
    assert main(["ls", "--store", store, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["key"] for r in rows} >= {"datasets/blobs/train/labels", "features/ext/blobs/train/pre_logits"}
    evaluate_cell(FeatureStore(store), Cell("ext", "blobs", "pre_logits", "knn5", "knn", {"n_neighbors": 5}))
    assert main(["results", "--store", store]) == 0
    assert "knn5" in capsys.readouterr().out
    out = tmp_path / "r.csv"
    assert main(["results", "--store", store, "--format", "csv", "--output", str(out)]) == 0
    assert pd.read_csv(out)["setting"].tolist() == ["knn5"]


def test_partial_array_shows_percent(tmp_path, capsys):
    store = FeatureStore(str(tmp_path / "s"))
    key = "features/m/d/train/pre_logits"
    with store.lease("features/m/d/train") as lease:
        store.write_arrays(lease, [ArraySpec(key, (8, 2), 2, "float32", {"fingerprint": "f"})],
                           lambda todo: [(0, {key: np.zeros((2, 2), np.float32)})], complete=False)
    assert main(["ls", "--store", str(tmp_path / "s")]) == 0
    assert "partial 25%" in capsys.readouterr().out


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["extract", "--store", str(tmp_path / "s"), "--arch", "resnt18", "--dataset", "digits"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("repeval: error: Unknown timm architecture") and "resnet18" in err
    assert not (tmp_path / "s").exists()  # refused before the store was touched
    assert main(["ls", "--store", str(tmp_path / "missing")]) == 2
    assert "no repeval store" in capsys.readouterr().err
    assert main(["results", "--store", str(tmp_path / "missing"), "--format", "xml"]) == 2
    assert "--format 'xml'" in capsys.readouterr().err


def test_verify_reports_damaged_and_incomplete_arrays(tmp_path, capsys):
    store = str(tmp_path / "store")
    assert main(["import-features", "--store", store, "--model", "ext", "--path", _npz(tmp_path),
                 "--dataset-name", "blobs"]) == 0
    assert main(["verify", "--store", store]) == 0
    assert "0 problem(s)" in capsys.readouterr().out
    chunk = tmp_path / "store" / "features" / "ext" / "blobs" / "train" / "pre_logits" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    assert main(["verify", "--store", store]) == 1
    out = capsys.readouterr().out
    assert "damaged    features/ext/blobs/train/pre_logits: chunk(s) [0]" in out and "1 problem(s)" in out


def _features_config(tmp_path, k: int, models=("ext",)) -> str:
    import yaml

    raw = {"store": str(tmp_path / "store"),
           "encoders": [{"name": m, "arch": "resnet18"} for m in models],
           "datasets": [{"name": "blobs", "adapter": "features", "params": {"path": str(tmp_path / "f.npz")}}],
           "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": k}}],
           "report": {"path": str(tmp_path / "report.html")}}
    path = tmp_path / f"config-k{k}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _import(tmp_path, model: str) -> FeatureStore:
    store = str(tmp_path / "store")
    assert main(["import-features", "--store", store, "--model", model, "--path", str(tmp_path / "f.npz"),
                 "--dataset-name", "blobs"]) == 0
    return FeatureStore(store)


def test_results_show_the_current_settings_and_all_shows_history(tmp_path, capsys):
    _npz(tmp_path)
    store = _import(tmp_path, "ext")
    old = evaluate_cell(store, Cell("ext", "blobs", "pre_logits", "knn", "knn", {"n_neighbors": 5}))
    new = evaluate_cell(store, Cell("ext", "blobs", "pre_logits", "knn", "knn", {"n_neighbors": 7}))
    capsys.readouterr()
    config = _features_config(tmp_path, 7)
    assert main(["results", "--config", config]) == 0
    out = capsys.readouterr().out
    assert new.cell_id in out and old.cell_id not in out and "settings" not in out
    assert main(["results", "--config", config, "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[-4:] == ["current", "settings", "recorded", "cell_id"]
    rows = {line.split()[-1]: line for line in lines[1:]}
    assert " True " in rows[new.cell_id] and '"n_neighbors":7' in rows[new.cell_id]
    assert " False " in rows[old.cell_id] and '"n_neighbors":5' in rows[old.cell_id]
    assert main(["results", "--store", str(tmp_path / "store")]) == 0  # no config: the latest per cell
    out = capsys.readouterr().out
    assert new.cell_id in out and old.cell_id not in out
    assert main(["report", config]) == 0
    assert "(1 cells; 0 failed; 0 not evaluated yet" in capsys.readouterr().out
    text = (tmp_path / "report.html").read_text()
    assert "records set aside (older, or of changed settings)</td><td>1</td>" in text


def test_each_config_name_keeps_its_rows_when_weights_are_identical(tmp_path, capsys):
    import yaml

    from jobs.config import ExtractConfig
    from jobs.extraction.extract import extract
    from pipeline.datasets import make_dataset
    from pipeline.encoders import EncoderSpec

    store = FeatureStore(str(tmp_path / "store"))
    params = {"n_per_class": {"train": 8, "test": 4}}
    data = make_dataset("textures", name="tex", **params)
    for name in ("mine-ep2", "mine-ep2-pth"):  # identical weights (same seed) under two names
        for split in ("train", "test"):
            extract(store, EncoderSpec(name=name, arch="resnet18", input_size=32), data, split,
                    ExtractConfig(batch_size=16, progress=False))
    rec = evaluate_cell(store, Cell("mine-ep2", "tex", "pre_logits", "knn", "knn", {"n_neighbors": 5}))
    raw = {"store": str(tmp_path / "store"),
           "encoders": [{"name": n, "arch": "resnet18", "input_size": 32} for n in ("mine-ep2", "mine-ep2-pth")],
           "datasets": [{"name": "tex", "adapter": "textures", "params": params}],
           "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 5}}],
           "report": {"path": str(tmp_path / "report.html")}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["results", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "recorded_as" in out and out.count(rec.cell_id) == 2
    table = [line for line in out.splitlines()[1:] if not line.startswith("unreliable: ")]  # notes under it
    assert {line.split()[0] for line in table} == {"mine-ep2", "mine-ep2-pth"}
    path = tmp_path / "r.csv"
    assert main(["results", "--config", str(config), "--format", "csv", "--output", str(path)]) == 0
    frame = pd.read_csv(path)
    assert sorted(frame["model"]) == ["mine-ep2", "mine-ep2-pth"] and set(frame["cell_id"]) == {rec.cell_id}


def test_results_failed_lists_the_failures_on_record(tmp_path, capsys):
    from storage_schema.ledger import FailureLog, failure_id

    _npz(tmp_path)
    store = _import(tmp_path, "ext")
    capsys.readouterr()
    assert main(["results", "--store", str(tmp_path / "store"), "--failed"]) == 0
    assert "no failures on record" in capsys.readouterr().out
    FailureLog(store).record("cell", failure_id("ext", "blobs", "pre_logits", "few"), {
        "label": "ext/blobs/pre_logits:few", "model": "ext", "dataset": "blobs", "layer": "pre_logits",
        "setting": "few", "reason": "DataValidationError: n_way=5 needs at least 5 classes, but y has only 3"})
    assert main(["results", "--store", str(tmp_path / "store"), "--failed"]) == 0
    out = capsys.readouterr().out
    assert "ext/blobs/pre_logits:few" in out and "n_way=5 needs" in out and "attempts" in out
