"""Dense inputs are read exactly or refused naming the file: NYUv2's split indices (whole
numbers in range, none twice, train and test disjoint), annotations by their real format
and every value before any cast, a normal map or mask of another size than its image, every
target checked by ``repeval datasets show`` and before a run stores any, and no per-class
image count for per-pixel datasets."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat

from flows.cli.main import main
from jobs.extraction.dense_targets import store_targets
from pipeline.datasets import make_dataset
from pipeline.datasets.inspection import dataset_notes
from pipeline.errors import DatasetError
from storage_schema import FeatureStore
from tests.helpers.dense_layouts import write_ade20k, write_nyuv2

TRAIN, TEST = (1, 3, 4, 6), (2, 5, 8)


@pytest.fixture
def nyu(tmp_path):
    return write_nyuv2(tmp_path / "nyu", train=TRAIN, test=TEST)


def _splits(root, train, test) -> None:
    savemat(root / "splits.mat", {"trainNdxs": np.array(train, dtype=np.float64)[:, None],
                                  "testNdxs": np.array(test, dtype=np.float64)[:, None]})


@pytest.mark.parametrize("test, message", [
    ((9.5, 10.2, 11.7, 12.9), "holds 9.5 (4 value(s) not whole numbers)"),  # never truncated to 9-12
    ((2, float("nan"), 8), "holds nan"),
    ((2, 0, 8), "lists frame 0; frames are 1 to 1449"),
    ((2, 5, 5), "lists frame 5 more than once"),
    ((2, 3, 8), "1 frame(s) in both train and test, e.g. 3"),
])
def test_nyuv2_split_indices_are_exact_or_refused_naming_the_file(nyu, test, message):
    _splits(nyu, TRAIN, test)
    with pytest.raises(DatasetError, match="splits.mat") as err:
        make_dataset("nyuv2_normals", root=str(nyu))
    assert message in str(err.value)


def test_nyuv2_text_splits_are_checked_alike(nyu):
    (nyu / "splits.mat").unlink()
    (nyu / "train.txt").write_text("1\n3\n4\n6\n")
    (nyu / "test.txt").write_text("2\n4\n")
    with pytest.raises(DatasetError, match=r"train.txt.*test.txt.*both train and test, e.g. 4"):
        make_dataset("nyuv2_normals", root=str(nyu))
    (nyu / "test.txt").write_text("2\n5\n")
    assert make_dataset("nyuv2_normals", root=str(nyu)).num_samples("test") == 2


def test_a_normal_map_of_another_size_is_named_not_its_mask(nyu):
    normals = nyu / "normals" / "0003.png"
    Image.open(normals).resize((32, 24)).save(normals)
    dataset = make_dataset("nyuv2_normals", root=str(nyu))
    with pytest.raises(DatasetError) as err:
        dataset.load_target("train", TRAIN.index(3))
    assert "normal map" in str(err.value) and "0003.png" in str(err.value) and "masks" not in str(err.value)
    assert "32 x 24 pixels but its image is 64 x 48" in str(err.value)


def test_an_annotation_in_another_format_or_out_of_range_is_refused_before_any_cast(tmp_path):
    root = write_ade20k(tmp_path / "ade", n_train=3, n_val=2)
    folder = root / "ADEChallengeData2016" / "annotations"
    tiff = folder / "training" / "ADE_train_00000002.png"
    values = np.asarray(Image.open(tiff), dtype=np.int32).copy()
    values[0, 0] = -150  # a uint8 cast would make it class 105
    Image.fromarray(values).save(tiff, format="TIFF")
    wide = folder / "validation" / "ADE_val_00000001.png"
    big = np.asarray(Image.open(wide), dtype=np.uint16).copy()
    big[0, 0] = 151
    Image.fromarray(big).save(wide)
    dataset = make_dataset("ade20k", root=str(root))
    with pytest.raises(DatasetError, match=r"ADE_train_00000002.png' is a TIFF file, not a PNG"):
        dataset.load_target("train", 1)
    with pytest.raises(DatasetError, match=r"ADE_val_00000001.png' holds label 151; labels are 0 to 150"):
        dataset.load_target("val", 0)
    problems = dataset.target_problems()
    assert len(problems) == 2 and problems[0].startswith("train: ") and problems[1].startswith("val: ")


def test_a_negative_label_is_refused_not_wrapped(tmp_path):
    from pipeline.datasets.adapters.dense import class_map

    with pytest.raises(DatasetError, match="holds label -151; labels are 0 to 149 and 255"):
        class_map(np.array([[3, -151]]), 150, "x.png", "ade20k")


def test_datasets_show_checks_every_target_and_names_each_bad_file(tmp_path, capsys):
    root = write_ade20k(tmp_path / "ade", n_train=3, n_val=2)
    assert main(["datasets", "show", "ade20k", "--param", f"root={root}"]) == 0
    out = capsys.readouterr().out
    assert "targets      every one decoded: all valid" in out
    assert "without any image" not in out  # per-pixel data: no per-class image count
    for split, name in (("training", "ADE_train_00000001.png"), ("validation", "ADE_val_00000002.png")):
        Image.new("L", (8, 8)).save(root / "ADEChallengeData2016" / "annotations" / split / name)
    assert main(["datasets", "show", "ade20k", "--param", f"root={root}"]) == 1
    out = capsys.readouterr().out
    assert "2 cannot be used" in out and "ADE_train_00000001.png" in out and "ADE_val_00000002.png" in out


def test_no_empty_class_warning_for_per_pixel_datasets(nyu, tmp_path):
    assert dataset_notes(make_dataset("nyuv2_normals", root=str(nyu))) == []
    assert dataset_notes(make_dataset("ade20k", root=str(write_ade20k(tmp_path / "ade", 2, 2)))) == []


def test_a_bad_test_target_refuses_the_dataset_before_any_target_is_stored(tmp_path):
    root = write_ade20k(tmp_path / "ade", n_train=3, n_val=2)
    bad = root / "ADEChallengeData2016" / "annotations" / "validation" / "ADE_val_00000002.png"
    Image.fromarray(np.full((48, 64), 200, dtype=np.uint8), mode="L").save(bad)
    store = FeatureStore(str(tmp_path / "store"))
    dataset = make_dataset("ade20k", root=str(root))
    config = {"input_size": (3, 32, 32), "crop_pct": 1.0, "crop_mode": "center", "interpolation": "bilinear",
              "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    with pytest.raises(DatasetError, match=r"ADE_val_00000002.png' holds label 200"):
        store_targets(store, dataset, "train", config)
    assert not [a.key for a in store.list_arrays() if "targets" in a.key]  # nothing half-written, train's included
    shutil.copy(root / "ADEChallengeData2016" / "annotations" / "validation" / "ADE_val_00000001.png", bad)
    fixed = make_dataset("ade20k", root=str(root))
    assert store_targets(store, fixed, "train", config).startswith("datasets/ade")
