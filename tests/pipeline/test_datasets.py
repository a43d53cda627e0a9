"""Dataset adapters: a contract every registered adapter passes, then per-adapter checks."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

from pipeline.datasets.base import DESCRIBED_ONLY
from pipeline.datasets import METRICS, DatasetAdapter, TorchImageDataset, list_datasets, make_dataset, register_dataset
from pipeline.datasets import registry as _registry
from tests.helpers.adapter_copies import COPIES, csv_dataset_files, features_npz, image_tree, manifest, png
from tests.pipeline.datasets.layouts import FIXED_NS, freeze_times
from pipeline.errors import (
    ConfigError,
    CorruptImageError,
    DatasetError,
    DataValidationError,
    InvalidNameError,
    UnknownNameError,
)


# --- small on-disk fixtures (one copy per registered adapter: tests/helpers/adapter_copies.py) ---

# One builder per registered adapter; the contract tests below fail for an adapter without one.
BUILDERS: dict[str, Callable[[Path], DatasetAdapter]] = {
    name: (lambda tmp, name=name, copy=copy: make_dataset(name, **copy(tmp))) for name, copy in COPIES.items()}


def test_every_registered_adapter_has_a_builder() -> None:
    assert set(list_datasets()) == set(BUILDERS)


# --- contract over every registered adapter -----------------------------------------------------

@pytest.mark.parametrize("adapter", list_datasets())
def test_adapter_contract(adapter: str, tmp_path: Path) -> None:
    ds = BUILDERS[adapter](tmp_path)
    again = BUILDERS[adapter](tmp_path / "again")
    assert ds.adapter == adapter and ds.splits and ds.class_names
    assert isinstance(ds.mean_per_class, bool) and ds.mean_per_class == (ds.metric == "mean_per_class")
    assert ds.metric in METRICS and (ds.metric == "map11") == ds.multi_label
    for role in (ds.train_split, ds.val_split, ds.test_split, ds.pooled_split):
        assert role is None or role in ds.splits or adapter in ("image_folder", "csv_manifest", "webdataset",
                                                                "hf", "features", "digits", "textures")
    assert ds.fingerprint_mode in ("stat", "content", "generated")
    for split in ds.splits:
        labels, ids = ds.labels(split), ds.sample_ids(split)
        assert labels.dtype == np.int64 and labels.ndim == (2 if ds.multi_label else 1)
        assert len(labels) == len(ids) == ds.num_samples(split) > 0
        assert len(set(ids)) == len(ids) and all(isinstance(i, str) for i in ids)
        if ds.multi_label:  # 1 present, 0 absent, -1 difficult; one column per class
            assert labels.shape[1] == len(ds.class_names) and set(np.unique(labels)) <= {-1, 0, 1}
        else:
            assert labels.min() >= 0 and labels.max() < len(ds.class_names)
        # Deterministic order and content hash: a second construction agrees exactly.
        assert ids == again.sample_ids(split)
        np.testing.assert_array_equal(labels, again.labels(split))
        assert ds.fingerprint(split) == again.fingerprint(split) and len(ds.fingerprint(split)) == 64
        assert ds.skipped(split) == []
        if ds.has_images:
            img = ds.load_image(split, 0)
            assert isinstance(img, Image.Image) and img.mode == "RGB"
            with pytest.raises(DatasetError):
                ds.features(split)
        else:
            feats = ds.features(split)
            assert feats.ndim == 2 and feats.shape[0] == len(labels)
            with pytest.raises(DatasetError):
                ds.load_image(split, 0)
    assert len({ds.fingerprint(s) for s in ds.splits}) == len(ds.splits)
    json.dumps(ds.describe())
    assert ds.describe()["adapter"] == adapter and ds.metadata()["metric"] == ds.metric
    json.dumps(ds.metadata())
    # describe() holds the constructor parameters: the dataset can be rebuilt from it (repair does)
    params = {k: v for k, v in ds.describe().items() if k not in DESCRIBED_ONLY}
    rebuilt = make_dataset(adapter, name=ds.name, **params)
    assert [rebuilt.fingerprint(s) for s in rebuilt.splits] == [ds.fingerprint(s) for s in ds.splits]
    info = ds.info(ds.splits[0])
    assert info["samples"] == ds.num_samples(ds.splits[0]) and info["fingerprint"] == ds.fingerprint(ds.splits[0])
    json.dumps(info)


@pytest.mark.parametrize("adapter", list_datasets())
def test_unknown_split_lists_splits(adapter: str, tmp_path: Path) -> None:
    ds = BUILDERS[adapter](tmp_path)
    with pytest.raises(UnknownNameError) as info:
        ds.labels("validation")
    for split in ds.splits:
        assert split in str(info.value)


@pytest.mark.parametrize("adapter", list_datasets())
def test_adapter_pickles(adapter: str, tmp_path: Path) -> None:
    ds = BUILDERS[adapter](tmp_path)
    clone = pickle.loads(pickle.dumps(ds))
    split = ds.splits[0]
    assert clone.fingerprint(split) == ds.fingerprint(split)
    assert clone.sample_ids(split) == ds.sample_ids(split)


@pytest.mark.parametrize("adapter", list_datasets())
@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".hidden"])
def test_bad_dataset_names_rejected(adapter: str, bad: str, tmp_path: Path) -> None:
    ds = BUILDERS[adapter](tmp_path)
    accepted = inspect.signature(type(ds).__init__).parameters
    params = {k: v for k, v in ds.describe().items() if k in ("root", "csv_path", "path") and k in accepted}
    with pytest.raises(InvalidNameError):
        make_dataset(adapter, name=bad, **params)


# --- registry -----------------------------------------------------------------------------

def test_unknown_adapter_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError, match="digit.*digits"):
        make_dataset("digit")


def test_unknown_parameter_is_named() -> None:
    with pytest.raises(ConfigError, match="n_per_klass.*seed"):
        make_dataset("textures", n_per_klass=3)


def test_duplicate_registration_warns() -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            register_dataset("_tmp_test_adapter")(type("A", (), {}))
        with pytest.warns(UserWarning, match="_tmp_test_adapter"):
            register_dataset("_tmp_test_adapter")(type("B", (), {}))
    finally:
        _registry._ADAPTERS.pop("_tmp_test_adapter", None)


# --- digits --------------------------------------------------------------------------------

def test_digits_split_is_fixed_and_stratified() -> None:
    ds = make_dataset("digits")
    assert ds.num_samples("train") == 1347 and ds.num_samples("test") == 450
    train, test = set(ds.sample_ids("train")), set(ds.sample_ids("test"))
    assert not train & test and len(train | test) == 1797
    all_counts = np.bincount(np.concatenate([ds.labels("train"), ds.labels("test")]), minlength=10)
    test_counts = np.bincount(ds.labels("test"), minlength=10)
    assert np.all(np.abs(test_counts - 0.25 * all_counts) <= 1)
    img = np.asarray(ds.load_image("train", 0))
    assert img.shape == (8, 8, 3) and img.dtype == np.uint8
    assert (img[..., 0] == img[..., 2]).all() and img.max() <= 255
    assert max(np.asarray(ds.load_image("test", i)).max() for i in range(20)) == 255
    assert ds.class_names == [str(k) for k in range(10)]
    assert make_dataset("digits", seed=1).fingerprint("test") != ds.fingerprint("test")


# --- textures ------------------------------------------------------------------------------------

def test_textures_are_deterministic_per_seed_split_index() -> None:
    a = make_dataset("textures", n_per_class={"train": 5, "test": 5}, seed=3)
    b = make_dataset("textures", n_per_class={"test": 5, "train": 5, "extra": 2}, seed=3)
    c = make_dataset("textures", n_per_class={"train": 5, "test": 5}, seed=4)
    np.testing.assert_array_equal(a.render("train", 7), b.render("train", 7))  # other splits do not matter
    np.testing.assert_array_equal(np.asarray(a.load_image("test", 2)), np.asarray(b.load_image("test", 2)))
    assert not np.array_equal(a.render("train", 7), c.render("train", 7))
    assert not np.array_equal(a.render("train", 7), a.render("test", 7))
    assert a.fingerprint("train") != c.fingerprint("train")
    assert a.class_names == ["disk", "ring", "bar", "cross"]
    np.testing.assert_array_equal(a.labels("train"), np.repeat(np.arange(4), 5))


def test_textures_are_fast_valid_and_learnable() -> None:
    from sklearn.linear_model import LogisticRegression

    ds = make_dataset("textures")  # defaults: 200 train, 100 test per class
    start = time.perf_counter()
    train, test = ds.images("train"), ds.images("test")
    assert time.perf_counter() - start < 2.0
    assert train.shape == (800, 32, 32) and test.shape == (400, 32, 32)
    assert train.min() >= 0.0 and train.max() <= 1.0
    # Element shapes differ in how many pixels they brighten: sorted pixel values suffice.
    features = lambda x: np.sort(x.reshape(len(x), -1), axis=1)[:, ::8]
    clf = LogisticRegression(max_iter=3000).fit(features(train), ds.labels("train"))
    assert clf.score(features(test), ds.labels("test")) > 0.45  # chance is 0.25


# --- image folder -----------------------------------------------------------------------------

def _corrupt(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a png")


def _truncated(path: Path) -> None:
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:200])


def test_image_folder_layout(tmp_path: Path) -> None:
    ds = make_dataset("image_folder", root=image_tree(tmp_path / "tree"))
    assert ds.name == "tree" and ds.splits == ("test", "train")
    assert ds.class_names == ["a", "b", "c"]  # union over splits, sorted
    assert ds.sample_ids("train") == ["a/1.png", "a/2.png", "b/1.png", "b/sub/2.png", "c/1.png"]
    np.testing.assert_array_equal(ds.labels("train"), [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(ds.labels("test"), [0, 1])
    assert np.asarray(ds.load_image("train", 3))[0, 0, 0] == 40


def test_image_folder_fingerprint_follows_file_bytes(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "tree")
    before = make_dataset("image_folder", root=root, content_hash=True)
    assert before.fingerprint_mode == "content" and before.describe()["content_hash"] is True
    before_fp = before.fingerprint("train")
    target = root / "train" / "b" / "1.png"
    png(target, 31)
    os.utime(target, ns=(FIXED_NS, FIXED_NS))  # same size and time: only the bytes tell
    assert make_dataset("image_folder", root=root, content_hash=True).fingerprint("train") != before_fp
    assert make_dataset("image_folder", root=root).fingerprint("train") == make_dataset(
        "image_folder", root=image_tree(tmp_path / "copy")).fingerprint("train")  # stat mode cannot tell


def test_image_folder_stat_fingerprint_follows_size_and_time(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "tree")
    before = make_dataset("image_folder", root=root)
    assert before.fingerprint_mode == "stat"
    target = root / "train" / "b" / "1.png"
    os.utime(target, ns=(FIXED_NS + 1, FIXED_NS + 1))
    touched = make_dataset("image_folder", root=root).fingerprint("train")
    assert touched != before.fingerprint("train")
    assert make_dataset("image_folder", root=root).fingerprint("test") == before.fingerprint("test")
    target.write_bytes(target.read_bytes() + b"\0")
    os.utime(target, ns=(FIXED_NS + 1, FIXED_NS + 1))
    assert make_dataset("image_folder", root=root).fingerprint("train") not in (touched, before.fingerprint("train"))


def test_image_folder_corrupt_file_named_or_skipped(tmp_path: Path) -> None:
    root = image_tree(tmp_path / "tree")
    _corrupt(root / "train" / "b" / "broken.png")
    _truncated(root / "test" / "a" / "cut.png")
    ds = make_dataset("image_folder", root=root)
    i = ds.sample_ids("train").index("b/broken.png")
    with pytest.raises(CorruptImageError, match="broken.png"):
        ds.load_image("train", i)
    with pytest.raises(CorruptImageError, match="cut.png"):
        ds.load_image("test", ds.sample_ids("test").index("a/cut.png"))

    safe = make_dataset("image_folder", root=root, skip_bad=True)
    assert safe.skipped("train") == ["b/broken.png"] and safe.skipped("test") == ["a/cut.png"]
    assert "b/broken.png" not in safe.sample_ids("train")
    assert safe.num_samples("train") == ds.num_samples("train") - 1
    for split in safe.splits:
        for k in range(safe.num_samples(split)):
            safe.load_image(split, k)
    clean = make_dataset("image_folder", root=image_tree(tmp_path / "clean"))
    assert safe.sample_ids("train") == clean.sample_ids("train")
    assert safe.fingerprint("train") != clean.fingerprint("train")  # the skip is part of the content


def test_image_folder_missing_split(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"val.*found: \['test', 'train'\]"):
        make_dataset("image_folder", root=image_tree(tmp_path / "tree"), splits=["train", "val"])


# --- csv manifest --------------------------------------------------------------------------------

def test_csv_manifest_class_names_and_order(tmp_path: Path) -> None:
    ds = make_dataset("csv_manifest", csv_path=csv_dataset_files(tmp_path / "csv"), name="pets")
    assert ds.name == "pets" and ds.class_names == ["cat", "dog"] and ds.splits == ("test", "train")
    assert ds.sample_ids("train") == ["img/cat1.png", "img/cat2.png", "img/dog1.png", "img/dog2.png"]
    np.testing.assert_array_equal(ds.labels("train"), [0, 0, 1, 1])
    assert np.asarray(ds.load_image("train", 2))[0, 0, 0] == 3


def test_csv_manifest_integer_labels(tmp_path: Path) -> None:
    for k in range(3):
        png(tmp_path / f"{k}.png", k)
    csv_path = manifest(tmp_path, [("0.png", "2", "train"), ("1.png", "0", "train"), ("2.png", "1", "test")])
    ds = make_dataset("csv_manifest", csv_path=csv_path)
    assert ds.class_names == ["0", "1", "2"]
    np.testing.assert_array_equal(ds.labels("train"), [2, 0])
    named = make_dataset("csv_manifest", csv_path=csv_path, class_names=["zero", "one", "two"])
    np.testing.assert_array_equal(named.labels("train"), [2, 0])


def test_csv_manifest_corrupt_and_missing_files(tmp_path: Path) -> None:
    png(tmp_path / "ok.png", 9)
    _corrupt(tmp_path / "bad.png")
    csv_path = manifest(tmp_path, [("ok.png", "a", "train"), ("bad.png", "b", "train"), ("gone.png", "a", "train")])
    with pytest.raises(DatasetError, match="gone.png"):
        make_dataset("csv_manifest", csv_path=csv_path)
    safe = make_dataset("csv_manifest", csv_path=csv_path, skip_bad=True)
    assert safe.skipped("train") == ["bad.png", "gone.png"] and safe.sample_ids("train") == ["ok.png"]
    csv_path.write_text("path,label,split\nok.png,a,train\nbad.png,b,train\n")
    ds = make_dataset("csv_manifest", csv_path=csv_path)
    with pytest.raises(CorruptImageError, match="bad.png"):
        ds.load_image("train", ds.sample_ids("train").index("bad.png"))


def test_csv_manifest_missing_column(tmp_path: Path) -> None:
    csv_path = tmp_path / "m.csv"
    csv_path.write_text("file,label,split\na.png,a,train\n")
    with pytest.raises(DatasetError, match=r"\['path'\]"):
        make_dataset("csv_manifest", csv_path=csv_path)


# --- precomputed features ------------------------------------------------------------------------

def test_features_npz_round_trip(tmp_path: Path) -> None:
    path = features_npz(tmp_path / "f.npz")
    ds = make_dataset("features", path=path)
    with np.load(path) as raw:
        np.testing.assert_array_equal(ds.features("train"), raw["train_features"])
        np.testing.assert_array_equal(ds.labels("test"), raw["test_labels"])
    assert ds.name == "f" and ds.class_names == ["x", "y", "z"] and not ds.has_images


def test_features_npy_folder_round_trip(tmp_path: Path) -> None:
    folder = tmp_path / "feats"
    folder.mkdir()
    x = np.arange(20, dtype=np.float64).reshape(10, 2)
    np.save(folder / "train_features.npy", x)
    np.save(folder / "train_labels.npy", np.array([0, 1] * 5))
    ds = make_dataset("features", path=folder)
    np.testing.assert_array_equal(ds.features("train"), x)
    assert ds.class_names == ["0", "1"] and ds.splits == ("train",) and ds.name == "feats"


def test_features_nan_is_named(tmp_path: Path) -> None:
    x = np.ones((8, 3), dtype=np.float32)
    x[2, 1] = np.nan
    x[5, 0] = np.inf
    path = tmp_path / "nan.npz"
    np.savez(path, train_features=x, train_labels=np.zeros(8, dtype=np.int64))
    with pytest.raises(ValueError) as info:
        make_dataset("features", path=path)
    assert isinstance(info.value, DataValidationError)
    msg = str(info.value)
    assert "nan.npz" in msg and "1 NaN" in msg and "1 Inf" in msg and "2, 5" in msg


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"train_features": np.ones((3, 2)), "train_labels": np.zeros(4, dtype=int)}, "4 labels for 3"),
        ({"train_features": np.ones((3, 2))}, "train_labels"),
        ({"train_features": np.ones(3), "train_labels": np.zeros(3, dtype=int)}, "2-D"),
        ({"train_features": np.ones((3, 2)), "train_labels": np.zeros(3, dtype=int), "X_test": np.ones(2)}, "X_test"),
        ({"train_features": np.ones((3, 2)), "train_labels": np.zeros(3)}, "integer"),
    ],
)
def test_features_bad_arrays(arrays: dict, match: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DatasetError, match=match):
        make_dataset("features", path=path)


# --- torch dataset -----------------------------------------------------------------------------

def test_torch_dataset_with_workers(tmp_path: Path) -> None:
    ds = make_dataset("textures", n_per_class={"train": 4, "test": 2})
    transform = create_transform(input_size=(3, 16, 16), interpolation="bilinear", crop_pct=1.0, is_training=False)
    tds = TorchImageDataset(ds, "train", transform, indices=[3, 1, 15])
    clone = pickle.loads(pickle.dumps(tds))
    assert len(clone) == 3
    loader = torch.utils.data.DataLoader(tds, batch_size=2, num_workers=2)
    batches = list(loader)
    images = torch.cat([b[0] for b in batches])
    indices = torch.cat([b[1] for b in batches])
    assert images.shape == (3, 3, 16, 16) and indices.tolist() == [3, 1, 15]
    assert torch.equal(images[0], transform(ds.load_image("train", 3)))


def test_torch_dataset_rejects_features_and_bad_indices(tmp_path: Path) -> None:
    feats = make_dataset("features", path=features_npz(tmp_path / "f.npz"))
    with pytest.raises(DatasetError, match="precomputed"):
        TorchImageDataset(feats, "train", lambda img: img)
    ds = make_dataset("textures", n_per_class={"train": 1})
    with pytest.raises(DatasetError, match="out of range"):
        TorchImageDataset(ds, "train", lambda img: img, indices=[0, 4])
