"""Per-adapter details: seeded splits, partitions, VOC's difficult objects, CD-FSL's
filters, ImageNet's val forms, damaged tar shards, parquet row groups, safe unpickling."""

from __future__ import annotations

import pickle
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.datasets import TorchImageDataset, make_dataset
from pipeline.datasets.adapters.voc import VOC_CLASSES
from pipeline.errors import CorruptImageError, DatasetError
from tests.pipeline.datasets import layouts as L
from tests.pipeline.datasets import layouts_more as M


def test_caltech101_draws_a_seeded_stratified_train_set(tmp_path: Path) -> None:
    layout = L.caltech101(tmp_path)
    ds = make_dataset("caltech101", root=layout.root, train_per_class=3, seed=5)
    again = make_dataset("caltech101", root=layout.root / "101_ObjectCategories", train_per_class=3, seed=5)
    other = make_dataset("caltech101", root=layout.root, train_per_class=3, seed=6)
    np.testing.assert_array_equal(np.bincount(ds.labels("train")), [3, 3, 3])
    assert ds.sample_ids("train") == again.sample_ids("train") != other.sample_ids("train")
    assert set(ds.sample_ids("train")).isdisjoint(ds.sample_ids("test"))
    assert not any(i.startswith("BACKGROUND_Google") for i in ds.sample_ids("all"))
    assert ds.metric == "mean_per_class" and ds.val_split is None
    assert ds.validation["source"] == "train_fraction" and ds.validation["stratified"]


def test_dtd_partitions(tmp_path: Path) -> None:
    layout = L.dtd(tmp_path)
    one = make_dataset("dtd", root=layout.root)
    two = make_dataset("dtd", root=layout.root, partition=2)
    assert one.sample_ids("val") == ["banded/banded_0003.jpg", "dotted/dotted_0003.jpg", "zigzagged/zigzagged_0003.jpg"]
    assert two.sample_ids("val") == [i.replace("0003", "0001") for i in one.sample_ids("val")]
    with pytest.raises(DatasetError, match="train3.txt"):
        make_dataset("dtd", root=layout.root, partition=3)
    with pytest.raises(ValueError, match="partition"):
        make_dataset("dtd", root=layout.root, partition=11)


def test_voc2007_labels_follow_the_devkit(tmp_path: Path) -> None:
    ds = make_dataset("voc2007", root=M.voc2007(tmp_path).root)
    assert ds.multi_label and ds.metric == "map11" and ds.val_split == "val" and ds.pooled_split is None
    index = {c: k for k, c in enumerate(VOC_CLASSES)}
    train = ds.labels("train")
    assert train.shape == (4, 20)
    row = dict(zip(ds.sample_ids("train"), train))
    assert row["000005"][index["chair"]] == 1  # one non-difficult chair makes it present
    assert row["000012"][index["car"]] == -1  # only a difficult car: ignored, neither positive nor negative
    assert row["000007"][index["car"]] == 1 and row["000007"].sum() == 1
    assert set(np.flatnonzero(row["000009"] == 1)) == {index["horse"], index["person"]}
    test = dict(zip(ds.sample_ids("test"), ds.labels("test")))
    assert test["000003"][index["chair"]] == -1 and test["000004"][index["car"]] == 1
    info = ds.info("test")
    assert info["samples"] == 5 and info["classes"] == 7  # classes with a positive image (chair: difficult only)


def test_voc2007_accepts_the_voc2007_folder_as_root(tmp_path: Path) -> None:
    layout = M.voc2007(tmp_path)
    a = make_dataset("voc2007", root=layout.root)
    b = make_dataset("voc2007", root=layout.root / "VOCdevkit" / "VOC2007")
    assert a.fingerprint("test") == b.fingerprint("test")


def test_voc2007_missing_annotation_is_named(tmp_path: Path) -> None:
    layout = M.voc2007(tmp_path)
    target = layout.root / "VOCdevkit" / "VOC2007" / "Annotations" / "000002.xml"
    target.unlink()
    with pytest.raises(DatasetError, match=str(target)):
        make_dataset("voc2007", root=layout.root)


def test_chestx_keeps_the_seven_single_finding_classes(tmp_path: Path) -> None:
    ds = make_dataset("chestx", root=M.chestx(tmp_path).root)
    assert ds.sample_ids("all") == ["00000001_000.png", "00000003_000.png", "00000005_000.png", "00000006_000.png"]
    assert ds.class_names[-1] == "Pneumothorax" and "Pneumonia" not in ds.class_names


def test_isic2018_labels_from_one_hot_columns(tmp_path: Path) -> None:
    ds = make_dataset("isic2018", root=M.isic2018(tmp_path).root)
    np.testing.assert_array_equal(ds.labels("all"), [0, 1, 1, 6, 2])
    assert ds.class_names == M.ISIC_CLASSES


def test_imagenet_val_in_synset_folders(tmp_path: Path) -> None:
    layout = M.imagenet(tmp_path)
    val = layout.root / "val"
    for image, wnid in [("ILSVRC2012_val_00000001.JPEG", "n01484850"), ("ILSVRC2012_val_00000002.JPEG", "n01440764")]:
        (val / wnid).mkdir(exist_ok=True)
        shutil.move(val / image, val / wnid / image)
    for rest in val.glob("*.JPEG"):
        rest.unlink()
    ds = make_dataset("imagenet", root=layout.root)
    assert ds.sample_ids("val") == ["n01440764/ILSVRC2012_val_00000002.JPEG", "n01484850/ILSVRC2012_val_00000001.JPEG"]
    np.testing.assert_array_equal(ds.labels("val"), [0, 2])


def test_imagenet_devkit_ground_truth_and_synset_order(tmp_path: Path) -> None:
    layout = M.imagenet(tmp_path)
    (layout.root / "LOC_val_solution.csv").unlink()
    (layout.root / "LOC_synset_mapping.txt").unlink()
    data = layout.root / "ILSVRC2012_devkit_t12" / "data"
    # the devkit numbers synsets its own way (not sorted); a non-leaf synset is not a class
    ids = {"n01484850": 1, "n01440764": 2, "n01443537": 3}
    rows = [{"ILSVRC2012_ID": k, "WNID": w, "words": "fish", "num_children": 0} for w, k in ids.items()]
    rows.append({"ILSVRC2012_ID": 1001, "WNID": "n00000001", "words": "animal", "num_children": 3})
    L.savemat(data / "meta.mat", {"synsets": L.struct_array(rows)})
    truth = [ids[M.IMAGENET_WNIDS[c]] for c in layout.extra["val_labels"]]
    L.write_text(data / "ILSVRC2012_validation_ground_truth.txt", [str(t) for t in truth])
    ds = make_dataset("imagenet", root=layout.root)
    assert ds.class_names == M.IMAGENET_WNIDS  # sorted wnids, not the devkit's numbering
    np.testing.assert_array_equal(ds.labels("val"), layout.extra["val_labels"])
    L.write_text(data / "ILSVRC2012_validation_ground_truth.txt", ["1", "2", "1004", "3"])
    with pytest.raises(DatasetError, match="line 3: unknown class index '1004'"):
        make_dataset("imagenet", root=layout.root)


def test_imagenet_missing_class_folder_never_shifts_indices(tmp_path: Path) -> None:
    layout = M.imagenet(tmp_path)
    shutil.rmtree(layout.root / "train" / "n01443537")
    with pytest.raises(DatasetError, match="n01443537.*is missing"):
        make_dataset("imagenet", root=layout.root)


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_webdataset_truncated_member_is_named(tmp_path: Path) -> None:
    root = L.webdataset(tmp_path).root
    shard = root / "train" / "0.tar"
    with tarfile.open(shard) as tar:
        last = tar.getmembers()[-2]  # the last sample's image
    _cut(shard, last.offset_data + last.size // 2)
    with pytest.raises(DatasetError, match=f"member '{last.name}' of '{shard}' is truncated"):
        make_dataset("webdataset", root=root)


def test_webdataset_cut_between_members_is_refused(tmp_path: Path) -> None:
    root = L.webdataset(tmp_path).root
    shard = root / "train" / "1.tar"
    with tarfile.open(shard) as tar:
        last = tar.getmembers()[-1]
    _cut(shard, last.offset_data + 512)  # the end-of-archive blocks are gone
    with pytest.raises(DatasetError, match=f"'{shard}' is truncated or damaged"):
        make_dataset("webdataset", root=root)


def test_webdataset_sample_without_label_or_image(tmp_path: Path) -> None:
    root = L.webdataset(tmp_path).root
    with tarfile.open(root / "test" / "0.tar", "w") as tar:
        L.add_member(tar, "s0000100.jpg", L.image_bytes(1, "JPEG"))
    with pytest.raises(DatasetError, match="s0000100.*no a .cls label"):
        make_dataset("webdataset", root=root)
    with tarfile.open(root / "test" / "0.tar", "w") as tar:
        L.add_member(tar, "s0000100.cls", b"1")
    with pytest.raises(DatasetError, match="s0000100.*no an image"):
        make_dataset("webdataset", root=root)


def test_webdataset_duplicate_key_and_dataset_type(tmp_path: Path) -> None:
    root = L.webdataset(tmp_path).root
    shutil.copy(root / "train" / "0.tar", root / "train" / "1.tar")
    with pytest.raises(DatasetError, match="s0000000.*appears in"):
        make_dataset("webdataset", root=root)
    (root / "dataset_type.txt").write_text("multilabel\n")
    with pytest.raises(DatasetError, match="multilabel"):
        make_dataset("webdataset", root=root)


def test_webdataset_damaged_image_is_named_at_load(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    L.write_text(root / "classnames.txt", ["a", "b"])
    L.write_text(root / "test" / "nshards.txt", ["1"])
    with tarfile.open(root / "test" / "0.tar", "w") as tar:
        L.add_member(tar, "k1.png", b"not a png at all")
        L.add_member(tar, "k1.cls", b"1")
    ds = make_dataset("webdataset", root=root)
    with pytest.raises(CorruptImageError, match="'k1' of"):
        ds.load_image("test", 0)


@pytest.mark.parametrize("builder", [L.webdataset, M.hf, M.hf_parquet, L.cifar10])
def test_dataloader_workers_read_in_place(builder, tmp_path: Path) -> None:
    layout = builder(tmp_path)
    adapter = {"wds": "webdataset", "hf_saved": "hf", "hf_parquet": "hf", "cifar10": "cifar10"}[layout.root.name]
    ds = make_dataset(adapter, root=layout.root)
    split = ds.splits[-1]
    ds.load_image(split, 0)  # opens a file handle / table that must not travel to the workers
    tds = TorchImageDataset(ds, split, lambda img: torch.from_numpy(np.asarray(img).copy()))
    loader = torch.utils.data.DataLoader(tds, batch_size=2, num_workers=2)
    got = torch.cat([b[0] for b in loader])
    want = torch.stack([torch.from_numpy(np.asarray(ds.load_image(split, i)).copy()) for i in range(len(tds))])
    assert torch.equal(got, want)


def test_hf_parquet_row_groups_and_split_names(tmp_path: Path) -> None:
    layout = M.hf_parquet(tmp_path)
    ds = make_dataset("hf", root=layout.root)
    assert ds.splits == ("test", "train") and ds.class_names == M.HF_CLASSES
    np.testing.assert_array_equal(ds.labels("train"), layout.extra["train_labels"])
    pixels = [np.asarray(ds.load_image("train", i))[0, 0, 0] for i in range(5)]
    assert pixels == [np.asarray(L.Image.open(__import__("io").BytesIO(L.image_bytes(v))))[0, 0, 0]
                      for v in range(5)]


def test_hf_string_labels_and_given_class_names(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "strings"
    (root / "train").mkdir(parents=True)
    table = pa.table({"img": pa.array([L.image_bytes(i) for i in range(3)]), "y": ["dog", "cat", "dog"]})
    pq.write_table(table, root / "train" / "part0.parquet")
    ds = make_dataset("hf", root=root, image_column="img", label_column="y")
    assert ds.splits == ("train",) and ds.class_names == ["cat", "dog"]
    np.testing.assert_array_equal(ds.labels("train"), [1, 0, 1])
    ordered = make_dataset("hf", root=root, image_column="img", label_column="y", class_names=["dog", "cat"])
    np.testing.assert_array_equal(ordered.labels("train"), [0, 1, 0])
    with pytest.raises(DatasetError, match="no column 'image'"):
        make_dataset("hf", root=root, label_column="y")
    with pytest.raises(DatasetError, match="unknown class index 'dog'"):
        make_dataset("hf", root=root, image_column="img", label_column="y", class_names=["cat"])


def test_cifar_pickles_may_only_rebuild_arrays(tmp_path: Path) -> None:
    layout = L.cifar10(tmp_path)
    evil = layout.root / "cifar-10-batches-py" / "test_batch"

    class Exploit:
        def __reduce__(self):
            return (shutil.rmtree, (str(tmp_path / "victim"),))

    (tmp_path / "victim").mkdir()
    with open(evil, "wb") as fh:
        pickle.dump({"data": Exploit(), "labels": [0]}, fh, protocol=2)
    with pytest.raises(DatasetError, match="refusing to load the global shutil.rmtree"):
        make_dataset("cifar10", root=layout.root)
    assert (tmp_path / "victim").is_dir()
