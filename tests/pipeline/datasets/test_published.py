"""Every publisher-layout adapter on a tiny copy: counts, classes, splits, labels; and the
one-line errors for a missing split file, a missing image and an unknown class."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pipeline.datasets import adapter_class, make_dataset
from pipeline.errors import DatasetError
from tests.pipeline.datasets import layouts as L
from tests.pipeline.datasets.layouts_more import LAYOUTS, build


@pytest.mark.parametrize("adapter", sorted(LAYOUTS))
def test_layout_is_read_exactly(adapter: str, tmp_path: Path) -> None:
    ds, layout = build(adapter, tmp_path)
    assert {s: ds.num_samples(s) for s in ds.splits} == layout.counts
    assert ds.class_names == layout.classes
    assert ds.name == (layout.root.name if adapter in ("webdataset", "hf") else adapter)
    for split in ds.splits:
        for i in range(ds.num_samples(split)):
            assert ds.load_image(split, i).mode == "RGB"
    cls = adapter_class(adapter)  # metadata without reading a file
    assert cls.metric == ds.metric and cls.multi_label == ds.multi_label
    for key, split in (("train_labels", ds.train_split), ("test_labels", ds.test_split),
                       ("val_labels", ds.test_split), ("labels", ds.pooled_split)):
        if key in layout.extra:
            np.testing.assert_array_equal(ds.labels(split), layout.extra[key])
    clone = pickle.loads(pickle.dumps(ds))
    split = ds.splits[-1]
    assert np.array_equal(np.asarray(clone.load_image(split, 0)), np.asarray(ds.load_image(split, 0)))


@pytest.mark.parametrize("adapter", sorted(a for a in LAYOUTS if adapter_class(a).pooled_split == "all"))
def test_pooled_split_joins_the_official_ones(adapter: str, tmp_path: Path) -> None:
    ds, _ = build(adapter, tmp_path)
    parts = [s for s in ds.splits if s != "all"]
    if not parts:  # the CD-FSL domains: one split
        assert ds.splits == ("all",) and ds.train_split == ds.test_split == "all"
        return
    assert ds.sample_ids("all") == [f"{s}/{i}" for s in parts for i in ds.sample_ids(s)]
    np.testing.assert_array_equal(ds.labels("all"), np.concatenate([ds.labels(s) for s in parts]))
    last = parts[-1]
    assert np.array_equal(np.asarray(ds.load_image("all", ds.num_samples("all") - 1)),
                          np.asarray(ds.load_image(last, ds.num_samples(last) - 1)))


def _rm(rel: str) -> Callable[[Path], str]:
    def act(root: Path) -> str:
        target = root / rel
        if target.is_dir():
            import shutil

            shutil.rmtree(target)
        else:
            target.unlink()
        return str(target)

    return act


# adapter -> what to delete; the error must name it
MISSING_SPLIT_FILE = {
    "aircraft": "data/images_variant_val.txt", "dtd": "labels/test1.txt", "flowers102": "setid.mat",
    "pets": "annotations/test.txt", "cars": "cars_test_annos_withlabels.mat", "food101": "meta/test.json",
    "sun397": "Partitions/Testing_01.txt", "cifar10": "cifar-10-batches-py/data_batch_3",
    "cifar100": "cifar-100-python/test", "voc2007": "VOCdevkit/VOC2007/ImageSets/Main/test.txt",
    "isic2018": "ISIC2018_Task3_Training_GroundTruth/ISIC2018_Task3_Training_GroundTruth.csv",
    "chestx": "Data_Entry_2017.csv", "imagenet": "LOC_val_solution.csv", "webdataset": "train/1.tar",
    "hf": "train/state.json", "caltech101": "101_ObjectCategories", "cropdiseases": "dataset/train",
    "eurosat": "2750",
}


@pytest.mark.parametrize("adapter", sorted(LAYOUTS))
def test_missing_split_file_is_named(adapter: str, tmp_path: Path) -> None:
    layout = LAYOUTS[adapter](tmp_path)
    named = _rm(MISSING_SPLIT_FILE[adapter])(layout.root)
    with pytest.raises(DatasetError) as info:
        make_dataset(adapter, root=layout.root, **layout.params)
    assert named in str(info.value) and "\n" not in str(info.value)


MISSING_IMAGE = {
    "aircraft": "data/images/0001004.jpg", "dtd": "images/dotted/dotted_0004.jpg", "flowers102": "jpg/image_00007.jpg",
    "pets": "images/Bengal_3.jpg", "cars": "cars_test/00002.jpg", "food101": "images/waffles/2001.jpg",
    "sun397": "SUN397/o/office/inside/sun_200003.jpg", "voc2007": "VOCdevkit/VOC2007/JPEGImages/000004.jpg",
    "isic2018": "ISIC2018_Task3_Training_Input/ISIC_0024308.jpg", "chestx": "images/00000003_000.png",
    "imagenet": "val/ILSVRC2012_val_00000003.JPEG",
}


@pytest.mark.parametrize("adapter", sorted(MISSING_IMAGE))
def test_missing_image_is_named_or_skipped(adapter: str, tmp_path: Path) -> None:
    layout = LAYOUTS[adapter](tmp_path)
    named = _rm(MISSING_IMAGE[adapter])(layout.root)
    with pytest.raises(DatasetError) as info:
        make_dataset(adapter, root=layout.root, **layout.params)
    assert named in str(info.value) and "missing" in str(info.value) and "\n" not in str(info.value)
    ds = make_dataset(adapter, root=layout.root, skip_bad=True, **layout.params)
    assert sum(len(ds.skipped(s)) for s in ds.splits if s != ds.pooled_split or len(ds.splits) == 1) == 1
    assert sum(ds.num_samples(s) for s in ds.splits if s != "all" or len(ds.splits) == 1) == \
        sum(n for s, n in layout.counts.items() if s != "all" or len(layout.counts) == 1) - 1


def _replace(rel: str, old: str, new: str) -> Callable[[Path], str]:
    def act(root: Path) -> str:
        path = root / rel
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
        return str(path)

    return act


def _flowers_label(root: Path) -> str:
    L.savemat(root / "imagelabels.mat", {"labels": np.array([[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 3]])})
    return str(root / "imagelabels.mat")


def _cars_class(root: Path) -> str:
    rows = [{"bbox_x1": 1, "bbox_y1": 1, "bbox_x2": 4, "bbox_y2": 4, "class": c, "fname": f"{k:05d}.jpg"}
            for k, c in ((1, 1), (2, 99), (3, 3))]
    L.savemat(root / "cars_test_annos_withlabels.mat", {"annotations": L.struct_array(rows)})
    return str(root / "cars_test_annos_withlabels.mat")


def _cifar_label(root: Path) -> str:
    path = root / "cifar-10-batches-py" / "data_batch_2"
    with open(path, "rb") as fh:
        batch = pickle.load(fh)
    batch["labels"] = [0, 7]
    with open(path, "wb") as fh:
        pickle.dump(batch, fh, protocol=2)
    return str(path)


def _wds_class(root: Path) -> str:
    import tarfile

    path = root / "test" / "0.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        L.add_member(tar, "s9000000.png", L.image_bytes(1))
        L.add_member(tar, "s9000000.cls", b"7")
    return "s9000000.cls"


def _hf_label(root: Path) -> str:
    import pyarrow as pa

    from tests.pipeline.datasets.layouts_more import hf_table

    path = root / "test" / "data-00000-of-00001.arrow"
    table = hf_table([2, -1, 0], 0)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return f"{path}' row 1"


UNKNOWN_CLASS = {
    "aircraft": _replace("data/images_variant_test.txt", "A300B4", "A380"),
    "dtd": _replace("labels/val1.txt", "dotted/", "striped/"),
    "flowers102": _flowers_label,
    "pets": _replace("annotations/test.txt", "Bengal_3 3", "Bengal_3 0"),
    "cars": _cars_class,
    "food101": _replace("meta/train.json", "baby_back_ribs\":", "pizza\":"),
    "sun397": _replace("Partitions/Training_01.txt", "/b/beach/", "/b/bay/"),
    "cifar10": _cifar_label,
    "voc2007": _replace("VOCdevkit/VOC2007/Annotations/000019.xml", "<name>cat", "<name>unicorn"),
    "isic2018": _replace("ISIC2018_Task3_Training_GroundTruth/ISIC2018_Task3_Training_GroundTruth.csv",
                         "1.0,0.0,0.0,0.0,0.0,0.0,0.0", "0.0,0.0,0.0,0.0,0.0,0.0,0.0"),
    "imagenet": _replace("LOC_val_solution.csv", "n01484850 1", "n09999999 1"),
    "webdataset": _wds_class,
    "hf": _hf_label,
}


@pytest.mark.parametrize("adapter", sorted(UNKNOWN_CLASS))
def test_unknown_class_is_named(adapter: str, tmp_path: Path) -> None:
    layout = LAYOUTS[adapter](tmp_path)
    named = UNKNOWN_CLASS[adapter](layout.root)
    with pytest.raises(DatasetError) as info:
        make_dataset(adapter, root=layout.root, **layout.params)
    message = str(info.value)
    assert named in message and "unknown class" in message and "\n" not in message


def test_every_adapter_has_its_error_cases() -> None:
    assert set(MISSING_SPLIT_FILE) == set(LAYOUTS)
    # no per-image files: CIFAR batches, tar shards, Arrow tables (their damage is tested below)
    assert set(LAYOUTS) - set(MISSING_IMAGE) == {"caltech101", "cifar10", "cifar100", "cropdiseases", "eurosat",
                                                 "webdataset", "hf"}
    # classes are the folders themselves, or (chestx) other findings are left out by design
    assert set(LAYOUTS) - set(UNKNOWN_CLASS) == {"caltech101", "cifar100", "cropdiseases", "eurosat", "chestx"}


def test_missing_root_is_named(tmp_path: Path) -> None:
    for adapter in LAYOUTS:
        with pytest.raises(DatasetError, match="nowhere"):
            make_dataset(adapter, root=tmp_path / "nowhere")


def test_stat_fingerprint_is_the_same_for_identical_copies(tmp_path: Path) -> None:
    a, _ = build("food101", tmp_path / "a")
    b, _ = build("food101", tmp_path / "b")
    assert a.fingerprint("train") == b.fingerprint("train") and a.fingerprint_mode == "stat"
    content = make_dataset("food101", root=tmp_path / "a" / "food-101", content_hash=True)
    assert content.fingerprint_mode == "content" and content.fingerprint("train") != a.fingerprint("train")
    assert content.metadata()["fingerprint_mode"] == "content" and content.describe()["content_hash"] is True
    os.utime(tmp_path / "b" / "food-101" / "images" / "waffles" / "2000.jpg", ns=(1, 1))
    assert make_dataset("food101", root=tmp_path / "b" / "food-101").fingerprint("train") != a.fingerprint("train")
    assert make_dataset("food101", root=tmp_path / "b" / "food-101").fingerprint("test") == a.fingerprint("test")


def test_json_describe_names_the_parameters(tmp_path: Path) -> None:
    ds, _ = build("dtd", tmp_path, partition=2)
    described = ds.describe()
    assert described["partition"] == 2 and ds.metadata()["validation"] == {"source": "split", "split": "val"}
    json.dumps(described)
