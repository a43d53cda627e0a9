"""What each cell needs in memory, known at planning; a cell no worker can hold refused
before the run with the numbers; features imported in blocks and evaluated through
``source: store`` encoders; float16 per encoder."""

from __future__ import annotations

import numpy as np
import pytest

from flows.benchmark import run_plan
from jobs.evaluation.cell_memory import check_cells_fit, parse_bytes, task_bytes
from jobs.config import load_config
from jobs.evaluation.evaluate import evaluate_cells
from jobs.extraction.import_features import import_features
from jobs.run.plan import make_plan, run_extract_unit
from pipeline.datasets import make_dataset
from pipeline.errors import CellTooLargeError, ConfigError, DataValidationError
from pipeline.protocols import get_protocol
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger

N_TRAIN, N_TEST, DIM, K = 3000, 400, 24, 6


def _npy_folder(folder, dtype=np.float16, bad_row: int | None = None):
    """Class-clustered features as a folder of .npy files (the import's streaming form)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 2, (K, DIM))
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        y = np.arange(n) % K
        X = (centres[y] + rng.normal(0, 1, (n, DIM))).astype(dtype)
        if bad_row is not None and split == "train":
            X[bad_row, 3] = np.nan
        np.save(folder / f"{split}_features.npy", X)
        np.save(folder / f"{split}_labels.npy", y)
    return folder


def _import(store, folder, model="lab", name="blobs"):
    dataset = make_dataset("features", name=name, path=str(folder))
    return {split: import_features(store, model, dataset, split) for split in dataset.splits}


def _stored_config(tmp_path, **dask) -> dict:
    return {
        "store": str(tmp_path / "store"),
        "dask": {"n_workers": 1, "processes": False, **dask},
        "encoders": [{"name": "lab", "source": "store"}],
        "datasets": [{"name": "blobs", "adapter": "features", "params": {"path": str(tmp_path / "gone")}}],
        "protocols": [{"name": "knn10", "protocol": "knn", "settings": {"n_neighbors": 10}},
                      {"name": "ridge", "protocol": "ridge"},
                      {"name": "few", "protocol": "fewshot", "settings": {"n_way": 5, "n_shot": 5, "n_episodes": 20}}],
        "report": {"path": str(tmp_path / "report.html")},
    }


def test_sizes_parse_with_units_and_bad_ones_are_refused():
    assert parse_bytes("8GiB") == 8 * 2**30 and parse_bytes("500 MB") == 500 * 10**6 and parse_bytes(4096) == 4096
    for bad in ("lots", "-3GB", 0, True):
        with pytest.raises(ConfigError):
            parse_bytes(bad, "config.dask.memory_limit")
    with pytest.raises(ConfigError, match="memory_limit"):
        load_config({**_stored_config_stub(), "dask": {"memory_limit": "a lot"}})


def _stored_config_stub() -> dict:
    return {"encoders": [{"name": "a", "arch": "resnet18"}], "datasets": [{"name": "d", "adapter": "digits"}],
            "protocols": [{"name": "k", "protocol": "knn"}]}


def test_import_streams_float16_through_memory_maps_and_keeps_the_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setattr("jobs.extraction.import_features.IMPORT_CHUNK_ROWS", 512)
    folder = _npy_folder(tmp_path / "npy")
    dataset = make_dataset("features", name="blobs", path=str(folder))
    assert isinstance(dataset.features("train"), np.memmap)  # never loaded whole
    assert dataset.feature_rows("train", 5, 9).dtype == np.float16
    # the folder and the same arrays in one .npz are the same data: the same fingerprint
    np.savez(tmp_path / "same.npz", **{f"{s}_{k}": np.load(folder / f"{s}_{k}.npy") for s in ("train", "test")
                                       for k in ("features", "labels")})
    npz = make_dataset("features", name="blobs", path=str(tmp_path / "same.npz"))
    assert npz.fingerprint("train") == dataset.fingerprint("train")
    store = FeatureStore(str(tmp_path / "store"))
    reports = _import(store, folder)
    stored = store.features("lab", "blobs", "train", "pre_logits")
    assert stored.status.dtype == "float16" and stored.attrs["dtype"] == "float16"
    assert reports["train"].rows == N_TRAIN
    assert stored.status.chunk_rows == 512  # written chunk by chunk
    np.testing.assert_array_equal(stored.read(), np.load(folder / "train_features.npy"))
    assert _import(store, folder)["train"].status == "cached"


def test_a_bad_value_in_a_mapped_file_is_named_before_anything_is_written(tmp_path):
    folder = _npy_folder(tmp_path / "npy", bad_row=2345)
    store = FeatureStore(str(tmp_path / "store"))
    with pytest.raises(DataValidationError, match="2345"):
        _import(store, folder)
    assert store.status("features/lab/blobs/train/pre_logits") is None


def test_stored_features_are_evaluated_without_extraction_and_their_cells_sized_from_the_store(tmp_path):
    store = FeatureStore(str(tmp_path / "store"))
    _import(store, _npy_folder(tmp_path / "npy"))
    plan = make_plan(load_config(_stored_config(tmp_path)))  # the source folder is gone: not needed
    assert plan.units == [] and len(plan.cells) == 3
    for cell in plan.cells:
        expected = get_protocol(cell.protocol).memory_bytes(N_TRAIN, N_TEST, 0, DIM, K, 2, cell.settings)
        assert plan.cell_memory[cell.label()] == expected
    assert task_bytes([c.label() for c in plan.cells], plan.cell_memory) == max(plan.cell_memory.values())
    outcomes = evaluate_cells(store, plan.cells)
    assert [o["status"] for o in outcomes] == ["computed"] * 3
    records = Ledger(store).to_frame()
    assert set(records["setting"]) == {"knn10", "ridge", "few"} and (records["metric.score"] > 0.5).all()


def test_stored_features_that_are_not_there_are_refused_at_planning(tmp_path):
    with pytest.raises(ConfigError) as info:
        make_plan(load_config(_stored_config(tmp_path)))
    message = str(info.value)
    assert "config.encoders[0] (lab, source: store)" in message and "repeval import-features" in message
    raw = _stored_config(tmp_path)
    raw["encoders"].append({"name": "r18", "arch": "resnet18"})  # an extracted encoder cannot read features
    store = FeatureStore(str(tmp_path / "store"))
    _import(store, _npy_folder(tmp_path / "npy"))
    with pytest.raises(ConfigError, match="holds precomputed features"):
        make_plan(load_config({**raw, "datasets": [{"name": "blobs", "adapter": "features",
                                                    "params": {"path": str(tmp_path / "npy")}}]}))
    with pytest.raises(ConfigError, match=r"encoders\[0\].arch: missing"):
        load_config({**raw, "encoders": [{"name": "x"}]})


def test_a_cell_no_worker_can_hold_fails_before_the_run_with_the_numbers(tmp_path):
    store = FeatureStore(str(tmp_path / "store"))
    _import(store, _npy_folder(tmp_path / "npy"))
    plan = make_plan(load_config(_stored_config(tmp_path, memory_limit="40MiB")))
    with pytest.raises(CellTooLargeError) as info:
        run_plan(plan)  # raises before Prefect or Dask start: nothing runs
    message = str(info.value)
    need = max(plan.cell_memory.values())
    assert f"({need} bytes)" in message and f"({int(40 * 2**20 * 0.75)} bytes)" in message
    assert "lab/blobs/pre_logits:" in message and "dask.memory_limit" in message
    assert len(Ledger(store)) == 0
    check_cells_fit(plan.cell_memory, [need], "a cluster")  # exactly enough is enough


def test_cells_to_be_extracted_are_sized_from_the_dataset_and_the_encoder_on_the_meta_device(tmp_path):
    raw = {
        "store": str(tmp_path / "store"),
        "extract": {"batch_size": 16, "chunk_batches": 2},
        "encoders": [{"name": "r18", "arch": "resnet18", "input_size": 32, "layers": ["pre_logits", "block3"],
                      "dtype": "float16"},
                     {"name": "r18b", "arch": "resnet18", "input_size": 32, "seed": 1}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 12, "test": 6}}}],
        "protocols": [{"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}}],
        "report": {"path": str(tmp_path / "report.html")},
    }
    plan = make_plan(load_config(raw))
    knn = get_protocol("knn")
    settings = plan.cells[0].settings
    assert plan.cell_memory["r18/tex/pre_logits:knn5"] == knn.memory_bytes(48, 24, 0, 512, 4, 2, settings)
    assert plan.cell_memory["r18/tex/block3:knn5"] == knn.memory_bytes(48, 24, 0, 256, 4, 2, settings)
    assert plan.cell_memory["r18b/tex/pre_logits:knn5"] == knn.memory_bytes(48, 24, 0, 512, 4, 4, settings)
    # the encoder's own dtype is what extraction stores, recorded and fingerprinted
    store = FeatureStore(raw["store"])
    half = [run_extract_unit(store, u, plan.config) for u in plan.units if u.encoder.name == "r18"]
    full = [run_extract_unit(store, u, plan.config) for u in plan.units if u.encoder.name == "r18b"]
    a, b = store.features("r18", "tex", "test", "pre_logits"), store.features("r18b", "tex", "test", "pre_logits")
    assert a.read().dtype == np.float16 and a.attrs["dtype"] == "float16" and b.read().dtype == np.float32
    assert half[0].fingerprints["pre_logits"] != full[0].fingerprints["pre_logits"]
