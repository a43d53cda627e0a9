"""Evaluation jobs on arrays in a real store: records, caching, streaming k-NN."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from jobs.evaluation.evaluate import Cell, evaluate_cell
from jobs.extraction.import_features import import_features
from pipeline.datasets import make_dataset
from pipeline.errors import ConfigError
from pipeline.protocols.neighbours.knn import KNNClassifier
from pipeline.protocols.registry import get_protocol, headline_value, list_protocols
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger

QUICK = {
    "logistic": {"Cs": [0.01, 0.1, 1.0, 10.0]},
    "fewshot": {"n_episodes": 40, "n_shot": 5},
    "lowshot": {"shots": [1, 4, "all"], "n_seeds": 2},
    "invariance": {"max_train": 300},
    "mlp": {"hidden_units": 64, "weight_decays": [0.0, 1e-3], "max_epochs": 20, "linear_Cs": [0.1, 1.0, 10.0]},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Digits pixels imported as features: a real, small, labelled feature array."""
    root = tmp_path_factory.mktemp("eval")
    X, y = load_digits(return_X_y=True)
    # Continuous values like real features: integer pixels make exact distance ties,
    # which floating-point translation then breaks in either direction.
    X = X + np.random.default_rng(0).normal(scale=0.05, size=X.shape)
    Xtr, Xte, ytr, yte = train_test_split(X.astype(np.float32), y, test_size=0.3, stratify=y, random_state=0)
    path = root / "digits.npz"
    np.savez(path, train_features=Xtr, train_labels=ytr, test_features=Xte, test_labels=yte)
    st = FeatureStore(str(root / "store"))
    ds = make_dataset("features", name="digitsnpz", path=str(path))
    for split in ("train", "test"):
        import_features(st, "pixels", ds, split)
    return st


# pooled features here (token protocols: test_token_features_*, dense ones: test_dense_*); the invariance audit fits ~50 probes: minutes
@pytest.mark.parametrize("protocol", [pytest.param(p, marks=pytest.mark.slow) if p == "invariance" else p
                                      for p in list_protocols() if get_protocol(p).reads == "pooled"])
def test_every_protocol_runs_on_the_store_and_is_recorded(store, protocol):
    cell = Cell("pixels", "digitsnpz", "pre_logits", f"{protocol}-quick", protocol, QUICK.get(protocol, {}))
    first = evaluate_cell(store, cell)
    assert first.status == "computed"
    rec = first.record
    if protocol == "invariance":  # every map a readout must ignore (EXPECTED_INVARIANCE) changes nothing on real data
        assert rec["metrics"]["violations"] == 0 and len(rec["metrics"]["records"]) == 50
    else:  # its headline (the entry's primary metric): digits pixels are far above chance
        assert 0.1 < headline_value(rec) <= 1.0
    assert rec["settings"] == {**rec["settings"], **QUICK.get(protocol, {})}
    assert rec["fingerprints"]["train.features"] and rec["fingerprints"]["test.labels"]
    assert rec["n_train"] == 1257 and rec["n_test"] == 540 and rec["dim"] == 64
    again = evaluate_cell(store, cell)
    assert again.status == "cached" and again.record == Ledger(store).get(first.cell_id)


def test_changed_setting_is_a_new_cell_and_old_one_stays(store):
    a = evaluate_cell(store, Cell("pixels", "digitsnpz", "pre_logits", "knn", "knn", {"n_neighbors": 10}))
    b = evaluate_cell(store, Cell("pixels", "digitsnpz", "pre_logits", "knn", "knn", {"n_neighbors": 11}))
    assert a.cell_id != b.cell_id and b.status == "computed"
    assert Ledger(store).has(a.cell_id)
    same = evaluate_cell(store, Cell("pixels", "digitsnpz", "pre_logits", "knn-other-name", "knn", {"n_neighbors": 10}))
    assert same.cell_id == a.cell_id  # the id is content: features + protocol + settings


@pytest.mark.parametrize("block_rows", [64, 200, 5000])
def test_streamed_knn_equals_in_memory_knn(store, block_rows):
    settings = {"n_neighbors": 20, "metric": "cosine", "weights": "exp"}
    rec = evaluate_cell(store, Cell("pixels", "digitsnpz", "pre_logits", "k", "knn", settings),
                        block_rows=block_rows, record=False).record
    Xtr = store.features("pixels", "digitsnpz", "train", "pre_logits").read()
    Xte = store.features("pixels", "digitsnpz", "test", "pre_logits").read()
    ytr, yte = store.labels("digitsnpz", "train").read(), store.labels("digitsnpz", "test").read()
    pred = KNNClassifier(n_neighbors=20, block_size=10**6).fit(Xtr, ytr).predict(Xte)
    assert rec["metrics"]["top1"] == pytest.approx(np.mean(pred == yte), abs=0)


def test_bad_settings_fail_before_reading(store):
    with pytest.raises(ConfigError, match="n_neighbours"):
        evaluate_cell(store, Cell("pixels", "digitsnpz", "pre_logits", "k", "knn", {"n_neighbours": 3}))
    with pytest.raises(ConfigError, match="'logistic'"):
        evaluate_cell(store, Cell("pixels", "digitsnpz", "pre_logits", "k", "logistic", {"transform": "zca"}))


def test_missing_array_names_what_exists(store):
    with pytest.raises(KeyError, match="pre_logits"):
        evaluate_cell(store, Cell("pixels", "digitsnpz", "block2", "k", "knn"))


def test_ledger_table_and_exports(store, tmp_path):
    evaluate_cell(store, Cell("pixels", "digitsnpz", "pre_logits", "knn5", "knn", {"n_neighbors": 5}))
    ledger = Ledger(store)
    frame = ledger.to_frame()
    assert {"cell_id", "model", "dataset", "protocol", "metric.top1"} <= set(frame.columns)
    assert frame["cell_id"].is_unique and len(frame) == len(ledger)
    ledger.export(str(tmp_path / "r.csv"), "csv")
    ledger.export(str(tmp_path / "r.parquet"), "parquet")
    import pandas as pd

    assert len(pd.read_csv(tmp_path / "r.csv")) == len(frame)
    assert len(pd.read_parquet(tmp_path / "r.parquet")) == len(frame)


def test_logistic_uses_a_dataset_defined_validation_split(tmp_path):
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 6)) * 2

    def split(n):
        y = np.arange(n) % 3
        return (centres[y] + rng.normal(size=(n, 6))).astype(np.float32), y

    arrays = {}
    for name, n in (("train", 90), ("val", 30), ("test", 60)):
        arrays[f"{name}_features"], arrays[f"{name}_labels"] = split(n)
    np.savez(tmp_path / "f.npz", **arrays)
    store = FeatureStore(str(tmp_path / "store"))
    ds = make_dataset("features", name="blobs", path=str(tmp_path / "f.npz"))
    for s in ("train", "val", "test"):
        import_features(store, "m", ds, s)
    cell = Cell("m", "blobs", "pre_logits", "linear", "logistic", {"Cs": [0.01, 1.0]}, val_split="val")
    rec = evaluate_cell(store, cell).record
    assert rec["diagnostics"]["validation"] == "dataset split"
    assert "val.features" in rec["fingerprints"] and rec["metrics"]["top1"] > 0.8
