"""Tiny copies of each dataset in its publisher's exact on-disk layout, built in tests.

Every builder writes a few small real images plus the publisher's split and label files
(text, JSON, ``.mat`` through scipy, XML, pickled batches, tar shards, Arrow/parquet),
then sets every file's modification time to one fixed value, so two copies built at
different moments have the same (stat-based) fingerprint. Each returns a ``Layout``: the
root, the adapter parameters and what the adapter must find.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

FIXED_NS = 1_600_000_000 * 10**9


@dataclass
class Layout:
    root: Path
    params: dict[str, Any]
    counts: dict[str, int]  # split -> samples
    classes: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


def image_bytes(value: int, fmt: str = "PNG", size: tuple[int, int] = (6, 5)) -> bytes:
    buf = io.BytesIO()
    rgb = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = value % 256, (value * 7) % 256, (value * 13) % 256
    Image.fromarray(rgb).save(buf, format=fmt)
    return buf.getvalue()


def write_image(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = "JPEG" if path.suffix.lower() in (".jpg", ".jpeg") else path.suffix[1:].upper()
    path.write_bytes(image_bytes(value, fmt))


def write_text(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def freeze_times(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), ns=(FIXED_NS, FIXED_NS))


def savemat(path: Path, data: dict) -> None:
    import scipy.io

    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(str(path), data)


def struct_array(rows: list[dict[str, Any]]) -> np.ndarray:
    """A MATLAB struct array (1 x n) for savemat."""
    names = list(rows[0])
    out = np.empty((1, len(rows)), dtype=[(n, object) for n in names])
    for i, row in enumerate(rows):
        for n in names:
            out[0, i][n] = row[n]
    return out


# --- Oxford VGG ------------------------------------------------------------------------------------

def aircraft(tmp: Path) -> Layout:
    root = tmp / "fgvc-aircraft-2013b"
    data = root / "data"
    classes = ["707-320", "A300B4", "Cessna 172"]
    write_text(data / "variants.txt", classes)
    counts = {"train": 2, "val": 1, "test": 2}
    k = 1000
    for split, per_class in counts.items():
        lines = []
        for c, cls in enumerate(classes):
            for _ in range(per_class):
                k += 1
                lines.append(f"{k:07d} {cls}")
                write_image(data / "images" / f"{k:07d}.jpg", k)
        write_text(data / f"images_variant_{split}.txt", lines)
    freeze_times(root)
    return Layout(root, {}, {s: n * 3 for s, n in counts.items()} | {"all": 15}, classes)


def dtd(tmp: Path) -> Layout:
    root = tmp / "dtd"
    classes = ["banded", "dotted", "zigzagged"]
    for c, cls in enumerate(classes):
        for i in range(1, 5):
            write_image(root / "images" / cls / f"{cls}_{i:04d}.jpg", 10 * c + i)
    for part in (1, 2):
        picks = {"train": [1, 2], "val": [3], "test": [4]} if part == 1 else {"train": [3, 4], "val": [1], "test": [2]}
        for split, idx in picks.items():
            write_text(root / "labels" / f"{split}{part}.txt", [f"{cls}/{cls}_{i:04d}.jpg" for cls in classes for i in idx])
    freeze_times(root)
    return Layout(root, {}, {"train": 6, "val": 3, "test": 3, "all": 12}, classes)


def flowers102(tmp: Path) -> Layout:
    root = tmp / "flowers"
    labels = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]])
    for k in range(1, 13):
        write_image(root / "jpg" / f"image_{k:05d}.jpg", k)
    savemat(root / "imagelabels.mat", {"labels": labels})
    savemat(root / "setid.mat", {"trnid": np.array([[1, 5, 9]]), "valid": np.array([[2, 6, 10]]),
                                  "tstid": np.array([[3, 4, 7, 8, 11, 12]])})
    freeze_times(root)
    return Layout(root, {}, {"train": 3, "val": 3, "test": 6, "all": 12}, ["1", "2", "3"],
                  {"test_labels": [0, 0, 1, 1, 2, 2]})


def pets(tmp: Path) -> Layout:
    root = tmp / "oxford-iiit-pet"
    breeds = [("Abyssinian", 1), ("american_bulldog", 2), ("Bengal", 1)]
    lines = {"trainval": [], "test": []}
    for c, (breed, species) in enumerate(breeds, start=1):
        for i in range(1, 4):
            write_image(root / "images" / f"{breed}_{i}.jpg", 10 * c + i)
            lines["trainval" if i < 3 else "test"].append(f"{breed}_{i} {c} {species} {c}")
    write_text(root / "annotations" / "trainval.txt", lines["trainval"])
    write_text(root / "annotations" / "test.txt", lines["test"])
    freeze_times(root)
    return Layout(root, {}, {"train": 6, "test": 3, "all": 9}, [b for b, _ in breeds])


# --- objects and scenes ----------------------------------------------------------------------------

def caltech101(tmp: Path) -> Layout:
    root = tmp / "caltech101"
    classes = ["Faces", "accordion", "airplanes"]
    for c, cls in enumerate(classes + ["BACKGROUND_Google"]):
        for i in range(1, 6):
            write_image(root / "101_ObjectCategories" / cls / f"image_{i:04d}.jpg", 10 * c + i)
    freeze_times(root)
    return Layout(root, {"train_per_class": 3}, {"train": 9, "test": 6, "all": 15}, classes)


def cars(tmp: Path) -> Layout:
    root = tmp / "stanford_cars"
    classes = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Audi R8 Coupe 2012"]
    savemat(root / "devkit" / "cars_meta.mat", {"class_names": np.array([classes], dtype=object)})
    for split, folder, per_class in (("train", "cars_train", 2), ("test", "cars_test", 1)):
        rows, k = [], 0
        for c in range(3):
            for _ in range(per_class):
                k += 1
                write_image(root / folder / f"{k:05d}.jpg", 10 * c + k)
                rows.append({"bbox_x1": 1, "bbox_y1": 1, "bbox_x2": 4, "bbox_y2": 4, "class": c + 1,
                             "fname": f"{k:05d}.jpg"})
        target = root / "devkit" / "cars_train_annos.mat" if split == "train" else root / "cars_test_annos_withlabels.mat"
        savemat(target, {"annotations": struct_array(rows)})
    freeze_times(root)
    return Layout(root, {}, {"train": 6, "test": 3, "all": 9}, classes)


def food101(tmp: Path) -> Layout:
    root = tmp / "food-101"
    classes = ["apple_pie", "baby_back_ribs", "waffles"]
    write_text(root / "meta" / "classes.txt", classes)
    table = {"train": {}, "test": {}}
    for c, cls in enumerate(classes):
        for i in range(3):
            image = f"{cls}/{1000 * c + i}"
            write_image(root / "images" / f"{image}.jpg", 10 * c + i)
            table["train" if i < 2 else "test"].setdefault(cls, []).append(image)
    for split, content in table.items():
        (root / "meta" / f"{split}.json").write_text(json.dumps(content))
    freeze_times(root)
    return Layout(root, {}, {"train": 6, "test": 3, "all": 9}, classes)


def sun397(tmp: Path) -> Layout:
    root = tmp / "sun"
    base = root / "SUN397"
    classes = ["/a/abbey", "/b/beach", "/o/office/inside"]
    write_text(base / "ClassName.txt", classes)
    lines = {"Training_01.txt": [], "Testing_01.txt": []}
    for c, cls in enumerate(classes):
        for i in range(4):
            rel = f"{cls}/sun_{c}{i:05d}.jpg"
            write_image(base / rel.lstrip("/"), 10 * c + i)
            lines["Training_01.txt" if i < 2 else "Testing_01.txt"].append(rel)
    for name, content in lines.items():
        write_text(root / "Partitions" / name, content)
    freeze_times(root)
    return Layout(root, {}, {"train": 6, "test": 6, "all": 12}, [c.lstrip("/") for c in classes])


# --- CIFAR ---------------------------------------------------------------------------------------------

def _cifar_batch(path: Path, labels: list[int], key: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
    batch = {"batch_label": "tiny", key: labels, "data": data, "filenames": [f"img_{seed}_{i}.png" for i in
                                                                             range(len(labels))]}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        pickle.dump(batch, fh, protocol=2)


def cifar10(tmp: Path) -> Layout:
    root = tmp / "cifar10"
    base = root / "cifar-10-batches-py"
    classes = ["airplane", "automobile", "bird"]
    base.mkdir(parents=True)
    with open(base / "batches.meta", "wb") as fh:
        pickle.dump({"label_names": classes, "num_cases_per_batch": 2}, fh, protocol=2)
    for k in range(1, 6):
        _cifar_batch(base / f"data_batch_{k}", [k % 3, (k + 1) % 3], "labels", k)
    _cifar_batch(base / "test_batch", [0, 1, 2], "labels", 9)
    freeze_times(root)
    return Layout(root, {}, {"train": 10, "test": 3, "all": 13}, classes)


def cifar100(tmp: Path) -> Layout:
    root = tmp / "cifar100"
    base = root / "cifar-100-python"
    classes = ["apple", "aquarium_fish", "baby", "bear"]
    base.mkdir(parents=True)
    with open(base / "meta", "wb") as fh:
        pickle.dump({"fine_label_names": classes, "coarse_label_names": ["x"]}, fh, protocol=2)
    _cifar_batch(base / "train", [0, 1, 2, 3, 0, 1], "fine_labels", 1)
    _cifar_batch(base / "test", [3, 2], "fine_labels", 2)
    freeze_times(root)
    return Layout(root, {}, {"train": 6, "test": 2, "all": 8}, classes)


# --- tar shards ------------------------------------------------------------------------------------

def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = FIXED_NS // 10**9
    tar.addfile(info, io.BytesIO(data))


def webdataset(tmp: Path) -> Layout:
    """train: 2 shards (3 + 2 samples, jpg/png/webp images); test: 1 shard of 3."""
    root = tmp / "wds"
    classes = ["cat", "dog", "fox"]
    write_text(root / "classnames.txt", classes)
    layout = {"train": [[0, 1, 2], [1, 0]], "test": [[2, 1, 0]]}
    exts = ["jpg", "png", "webp"]
    k = 0
    for split, shards in layout.items():
        (root / split).mkdir(parents=True)
        write_text(root / split / "nshards.txt", [str(len(shards))])
        for s, labels in enumerate(shards):
            with tarfile.open(root / split / f"{s}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
                for label in labels:
                    ext = exts[k % 3]
                    add_member(tar, f"s{k:07d}.{ext}", image_bytes(k, {"jpg": "JPEG"}.get(ext, ext.upper())))
                    add_member(tar, f"s{k:07d}.cls", str(label).encode())
                    k += 1
    freeze_times(root)
    return Layout(root, {}, {"train": 5, "test": 3}, classes, {"train_labels": [0, 1, 2, 1, 0]})
