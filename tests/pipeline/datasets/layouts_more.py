"""Tiny publisher layouts, continued: VOC 2007, the CD-FSL domains, ImageNet, Hugging Face
datasets on disk; and ``LAYOUTS``, one builder per adapter."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.pipeline.datasets import layouts as L
from tests.pipeline.datasets.layouts import Layout, freeze_times, image_bytes, write_image, write_text

# VOC: (image id, [(class, difficult), ...]) per split
VOC_TRAIN = [("000005", [("chair", 0), ("chair", 1)]), ("000007", [("car", 0)]),
             ("000009", [("horse", 0), ("person", 0)]), ("000012", [("car", 1)])]
VOC_VAL = [("000017", [("person", 0), ("horse", 0)]), ("000019", [("cat", 0)]), ("000020", [("car", 0)])]
VOC_TEST = [("000001", [("dog", 0), ("person", 0)]), ("000002", [("train", 0)]), ("000003", [("sofa", 0), ("chair", 1)]),
            ("000004", [("car", 0), ("car", 1)]), ("000006", [("pottedplant", 0), ("diningtable", 0)])]


def voc_xml(image: str, objects: list[tuple[str, int]]) -> str:
    body = "".join(f"<object><name>{name}</name><pose>Left</pose><truncated>0</truncated>"
                   f"<difficult>{difficult}</difficult><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>4</xmax>"
                   f"<ymax>4</ymax></bndbox></object>" for name, difficult in objects)
    return (f"<annotation><folder>VOC2007</folder><filename>{image}.jpg</filename><size><width>6</width>"
            f"<height>5</height><depth>3</depth></size><segmented>0</segmented>{body}</annotation>")


def voc2007(tmp: Path) -> Layout:
    root = tmp / "voc"
    base = root / "VOCdevkit" / "VOC2007"
    for split, images in (("train", VOC_TRAIN), ("val", VOC_VAL), ("test", VOC_TEST)):
        write_text(base / "ImageSets" / "Main" / f"{split}.txt", [i for i, _ in images])
        for image, objects in images:
            (base / "Annotations").mkdir(parents=True, exist_ok=True)
            (base / "Annotations" / f"{image}.xml").write_text(voc_xml(image, objects))
            write_image(base / "JPEGImages" / f"{image}.jpg", int(image))
    write_text(base / "ImageSets" / "Main" / "trainval.txt", [i for i, _ in VOC_TRAIN + VOC_VAL])
    freeze_times(root)
    from pipeline.datasets import VOC_CLASSES

    return Layout(root, {}, {"train": 4, "val": 3, "test": 5}, list(VOC_CLASSES))


# --- CD-FSL ----------------------------------------------------------------------------------------

def cropdiseases(tmp: Path) -> Layout:
    root = tmp / "CropDiseases"
    classes = ["Apple___Apple_scab", "Apple___healthy", "Tomato___Leaf_Mold"]
    for c, cls in enumerate(classes):
        for i in range(3):
            write_image(root / "dataset" / "train" / cls / f"{cls[:5]}{i}.JPG", 10 * c + i)
    write_image(root / "dataset" / "test" / "test" / "x.JPG", 1)  # the unlabelled test folder is not read
    freeze_times(root)
    return Layout(root, {}, {"all": 9}, classes)


def eurosat(tmp: Path) -> Layout:
    root = tmp / "EuroSAT"
    classes = ["AnnualCrop", "Forest", "River"]
    for c, cls in enumerate(classes):
        for i in range(1, 4):
            write_image(root / "2750" / cls / f"{cls}_{i}.jpg", 10 * c + i)
    freeze_times(root)
    return Layout(root, {}, {"all": 9}, classes)


ISIC_CLASSES = ["MEL", "NV", "BCC", "AKIEC", "BKL", "DF", "VASC"]


def isic2018(tmp: Path) -> Layout:
    root = tmp / "ISIC"
    name = "ISIC2018_Task3_Training_GroundTruth"
    rows = ["image," + ",".join(ISIC_CLASSES)]
    for i, k in enumerate([0, 1, 1, 6, 2]):
        image = f"ISIC_{24306 + i:07d}"
        write_image(root / "ISIC2018_Task3_Training_Input" / f"{image}.jpg", i)
        rows.append(image + "," + ",".join("1.0" if j == k else "0.0" for j in range(7)))
    write_text(root / name / f"{name}.csv", rows)
    freeze_times(root)
    return Layout(root, {}, {"all": 5}, ISIC_CLASSES, {"labels": [0, 1, 1, 6, 2]})


def chestx(tmp: Path) -> Layout:
    root = tmp / "chestX"
    entries = [("00000001_000.png", "Cardiomegaly"), ("00000001_001.png", "Cardiomegaly|Emphysema"),
               ("00000002_000.png", "No Finding"), ("00000003_000.png", "Effusion"),
               ("00000004_000.png", "Pneumonia"), ("00000005_000.png", "Pneumothorax"),
               ("00000006_000.png", "Mass"), ("00000007_000.png", "Hernia")]
    lines = ["Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position"]
    for k, (image, finding) in enumerate(entries):
        lines.append(f"{image},{finding},0,{k},50,M,PA")
        folder = root / ("images" if k % 2 else "images_001/images")  # the Kaggle copy's split folders
        write_image(folder / image, k)
    write_text(root / "Data_Entry_2017.csv", lines)
    freeze_times(root)
    from pipeline.datasets.adapters.cdfsl import CHESTX_CLASSES

    return Layout(root, {}, {"all": 4}, list(CHESTX_CLASSES), {"labels": [1, 2, 6, 4]})


# --- ImageNet -----------------------------------------------------------------------------------------

IMAGENET_WNIDS = ["n01440764", "n01443537", "n01484850"]


def imagenet(tmp: Path) -> Layout:
    """train in synset folders; val flat with Kaggle's LOC_val_solution.csv."""
    root = tmp / "imagenet"
    for c, wnid in enumerate(IMAGENET_WNIDS):
        for i in range(3):
            write_image(root / "train" / wnid / f"{wnid}_{i}.JPEG", 10 * c + i)
    truth = ["ImageId,PredictionString"]
    for k, c in enumerate([2, 0, 1, 0], start=1):
        image = f"ILSVRC2012_val_{k:08d}"
        write_image(root / "val" / f"{image}.JPEG", 50 + k)
        truth.append(f"{image},{IMAGENET_WNIDS[c]} 1 2 3 4")
    write_text(root / "LOC_val_solution.csv", truth)
    write_text(root / "LOC_synset_mapping.txt", [f"{w} fish {k}" for k, w in enumerate(IMAGENET_WNIDS)])
    freeze_times(root)
    return Layout(root, {}, {"train": 9, "val": 4}, IMAGENET_WNIDS, {"val_labels": [2, 0, 1, 0]})


# --- Hugging Face ------------------------------------------------------------------------------------

HF_CLASSES = ["bird", "cat", "dog"]


def hf_table(labels: list[int], start: int):
    import pyarrow as pa

    features = {"image": {"_type": "Image"}, "label": {"names": HF_CLASSES, "_type": "ClassLabel"}}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": image_bytes(start + i), "path": None} for i in range(len(labels))], type=image_type)
    table = pa.table({"image": images, "label": pa.array(labels, type=pa.int64())})
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def hf(tmp: Path) -> Layout:
    """``DatasetDict.save_to_disk`` layout: Arrow IPC streams plus the JSON state files."""
    import pyarrow as pa

    root = tmp / "hf_saved"
    splits = {"train": [0, 1, 2, 1, 0, 2], "test": [2, 1, 0]}
    root.mkdir(parents=True)
    (root / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    for s, (split, labels) in enumerate(splits.items()):
        folder = root / split
        folder.mkdir()
        table = hf_table(labels, 10 * s)
        with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=2)
        (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                                       "_split": split, "_fingerprint": "x"}))
        (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    freeze_times(root)
    return Layout(root, {}, {"train": 6, "test": 3}, HF_CLASSES, {"train_labels": splits["train"]})


def hf_parquet(tmp: Path) -> Layout:
    """The hub's parquet layout: ``data/<split>-00000-of-0000N.parquet``, row groups of 2."""
    import pyarrow.parquet as pq

    root = tmp / "hf_parquet"
    (root / "data").mkdir(parents=True)
    pq.write_table(hf_table([0, 1, 2], 0), root / "data" / "train-00000-of-00002.parquet", row_group_size=2)
    pq.write_table(hf_table([2, 2], 3), root / "data" / "train-00001-of-00002.parquet", row_group_size=2)
    pq.write_table(hf_table([1, 0], 5), root / "data" / "test-00000-of-00001.parquet")
    freeze_times(root)
    return Layout(root, {}, {"train": 5, "test": 2}, HF_CLASSES, {"train_labels": [0, 1, 2, 2, 2]})


LAYOUTS: dict[str, Callable[[Path], Layout]] = {
    "aircraft": L.aircraft, "caltech101": L.caltech101, "cars": L.cars, "cifar10": L.cifar10,
    "cifar100": L.cifar100, "dtd": L.dtd, "flowers102": L.flowers102, "food101": L.food101, "pets": L.pets,
    "sun397": L.sun397, "voc2007": voc2007, "cropdiseases": cropdiseases, "eurosat": eurosat,
    "isic2018": isic2018, "chestx": chestx, "imagenet": imagenet, "webdataset": L.webdataset, "hf": hf,
}


def build(adapter: str, tmp: Path, **params):
    """Build the tiny copy for ``adapter`` under ``tmp`` and read it; (dataset, layout)."""
    from pipeline.datasets import make_dataset

    layout = LAYOUTS[adapter](tmp)
    return make_dataset(adapter, root=layout.root, **{**layout.params, **params}), layout
