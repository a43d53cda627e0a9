"""The repeval command line, called in process (store commands) on a real store."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from flows.cli import main
from jobs.evaluate import Cell, evaluate_cell
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
