"""Broken dense-dataset files are read exactly or refused naming the file (issue 30, item 3).

Split indices that are not whole numbers (NYUv2's ``testNdxs = [9.5, 10.2, ...]`` was read
as frames 9-12), NaN, repeated or shared by train and test; an ADE20K annotation that is
a 32-bit TIFF named ``.png`` holding -150 (it was stored as class 105); a mask and a normal
map of different sizes (the message named only the mask).
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pipeline.datasets import make_dataset
from pipeline.datasets.adapters.dense import class_map
from pipeline.errors import DatasetError
from tests.helpers.dense_layouts import write_ade20k, write_nyuv2


def _splits(root, train, test):
    from scipy.io import savemat

    savemat(root / "splits.mat", {"trainNdxs": np.array(train, dtype=np.float64)[:, None],
                                  "testNdxs": np.array(test, dtype=np.float64)[:, None]})


@pytest.mark.parametrize("test, expected", [
    ([9.5, 10.2, 2, 5], r"holds 9.5 at position 1 \(2 such value\(s\)\); frame indices are whole numbers"),
    ([2, float("nan"), 8], r"holds nan at position 2"),
    ([2, 5, 5, 8], r"lists frame 5 twice in test"),
    ([2, 3, 8], r"lists 1 frame\(s\) in both train and test \(frame 3 first\)"),
])
def test_nyuv2_split_indices_are_whole_distinct_and_disjoint(tmp_path, test, expected):
    root = write_nyuv2(tmp_path / "nyu", train=(1, 3, 4), test=(2, 5, 8, 9, 10))
    _splits(root, [1, 3, 4], test)
    with pytest.raises(DatasetError, match=expected) as info:
        make_dataset("nyuv2_normals", root=str(root)).load_image("test", 0)
    assert "splits.mat" in str(info.value)


def test_the_official_whole_number_split_still_reads(tmp_path):
    root = write_nyuv2(tmp_path / "nyu", train=(1, 3), test=(2,))
    ds = make_dataset("nyuv2_normals", root=str(root))
    assert ds.load_target("test", 0).shape[-1] == 3


def test_an_ade20k_tiff_named_png_is_refused_by_its_real_format(tmp_path):
    root = write_ade20k(tmp_path / "ade")
    ds = make_dataset("ade20k", root=str(root))
    [target] = ds.target_files("val", 0)
    path = ds._path(target)  # noqa: SLF001  the file on disk, to overwrite with a hostile one
    Image.fromarray(np.full((48, 64), -150, dtype=np.int32)).save(path, format="TIFF")
    fresh = make_dataset("ade20k", root=str(root))
    with pytest.raises(DatasetError, match=r"is a TIFF file, not the PNG its name says") as info:
        fresh.load_target("val", 0)
    assert path in str(info.value)


def test_negative_labels_are_refused_before_the_cast():
    with pytest.raises(DatasetError, match=r"'x.png' holds label -151; labels are 0 to 149"):
        class_map(np.array([[3, -151]]), 150, "x.png", "ade20k")


def test_a_mask_of_another_size_names_the_normal_map_too(tmp_path):
    root = write_nyuv2(tmp_path / "nyu", train=(1, 3), test=(2,))
    Image.fromarray(np.zeros((24, 32, 3), dtype=np.uint8)).save(root / "normals" / "0002.png")
    with pytest.raises(DatasetError) as info:
        make_dataset("nyuv2_normals", root=str(root)).load_target("test", 0)
    assert "normals/0002.png" in str(info.value) and "masks/0002.png" in str(info.value)


def test_datasets_show_checks_every_dense_target_and_names_each_bad_file(tmp_path, capsys):
    from flows.cli.main import main

    root = write_ade20k(tmp_path / "ade")
    assert main(["datasets", "show", "ade20k", "--param", f"root={root}"]) == 0
    out = capsys.readouterr().out
    assert "every target checked: all read" in out and "without any image" not in out
    ds = make_dataset("ade20k", root=str(root))
    bad = [ds._path(ds.target_files("val", i)[0]) for i in (0, 1)]  # noqa: SLF001  the files on disk
    Image.fromarray(np.full((48, 64), -150, dtype=np.int32)).save(bad[0], format="TIFF")
    Image.fromarray(np.full((48, 64), 200, dtype=np.uint8)).save(bad[1])
    assert main(["datasets", "show", "ade20k", "--param", f"root={root}"]) == 1
    out = capsys.readouterr().out
    assert "every target checked: 2 refused" in out
    assert all(any(path in line for line in out.splitlines() if "bad target in val" in line) for path in bad)


def test_a_bad_test_target_is_named_before_the_train_split_is_extracted(tmp_path):
    """The issue: a label out of range in the test split was found only after train was
    extracted, leaving a "partial 0 %" targets array. Now every target is checked before the
    first array of the dataset is made."""
    from jobs.extraction.extract import ExtractConfig, extract
    from pipeline.encoders import EncoderSpec, load_encoder
    from storage_schema import FeatureStore
    from tests.helpers.tally import tree

    root = write_ade20k(tmp_path / "ade", n_train=3, n_val=2, size=(32, 32))
    ds = make_dataset("ade20k", root=str(root))
    bad = ds._path(ds.target_files("val", 1)[0])  # noqa: SLF001  the file on disk
    Image.fromarray(np.full((32, 32), 200, dtype=np.uint8)).save(bad)
    ds = make_dataset("ade20k", root=str(root))
    store_dir = tmp_path / "store"
    store = FeatureStore(str(store_dir))
    encoder = load_encoder(EncoderSpec(name="r18", arch="resnet18", input_size=32, layers=("block1.map",)),
                           device="cpu")
    before = tree(store_dir)
    with pytest.raises(DatasetError, match="holds label 200") as info:
        extract(store, encoder, ds, "train", ExtractConfig(batch_size=4, progress=False))
    assert bad in str(info.value)
    made = [p for p, _ in tree(store_dir) if (p, _) not in before]
    assert not [p for p in made if "targets" in p or "features" in p], made  # no partial array left
