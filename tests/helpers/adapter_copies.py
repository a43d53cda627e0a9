"""A tiny copy of every registered dataset adapter's input, as the adapter's config ``params``.

One entry per adapter: the publishers' layouts (tests/pipeline/datasets/layouts*.py, the dense
ones in tests/helpers/dense_layouts.py), an image tree, a CSV manifest, a feature file and
the generated datasets. The contract tests and the end-to-end run both read this table, so an
adapter registered without a copy fails both, by name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.helpers.dense_layouts import write_ade20k, write_nyuv2, write_voc_segmentation
from tests.pipeline.datasets.layouts import freeze_times
from tests.pipeline.datasets.layouts_more import LAYOUTS


def png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 5, 3), value, dtype=np.uint8)).save(path)


def image_tree(root: Path) -> Path:
    """train: a(2) b(2) c(1); test: a(1) b(1); class c only in train."""
    for split, cls, stem, value in [
        ("train", "a", "1", 10), ("train", "a", "2", 20), ("train", "b", "1", 30), ("train", "b", "sub/2", 40),
        ("train", "c", "1", 50), ("test", "a", "1", 60), ("test", "b", "1", 70),
    ]:
        png(root / split / cls / f"{stem}.png", value)
    (root / "train" / "a" / "notes.txt").write_text("not an image")
    freeze_times(root)  # two copies then share the (size, mtime) fingerprint
    return root


def manifest(root: Path, rows: list[tuple[str, str, str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "manifest.csv"
    path.write_text("path,label,split,comment\n" + "".join(f"{p},{lab},{s},x\n" for p, lab, s in rows))
    return path


def csv_dataset_files(root: Path) -> Path:
    for name, value in [("cat1", 1), ("cat2", 2), ("dog1", 3), ("dog2", 4), ("cat3", 5), ("dog3", 6)]:
        png(root / "img" / f"{name}.png", value)
    manifest(root, [
        ("img/cat1.png", "cat", "train"), ("img/dog1.png", "dog", "train"), ("img/cat2.png", "cat", "train"),
        ("img/dog2.png", "dog", "train"), ("img/cat3.png", "cat", "test"), ("img/dog3.png", "dog", "test"),
    ])
    freeze_times(root)
    return root / "manifest.csv"


def features_npz(path: Path) -> Path:
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        train_features=rng.normal(size=(12, 5)).astype(np.float32), train_labels=np.arange(12) % 3,
        test_features=rng.normal(size=(6, 5)).astype(np.float32), test_labels=np.arange(6) % 3,
        class_names=np.array(["x", "y", "z"]),
    )
    return path


def _published(name: str) -> Callable[[Path], dict[str, Any]]:
    def params(tmp: Path) -> dict[str, Any]:
        layout = LAYOUTS[name](tmp)
        return {"root": str(layout.root), **{k: str(v) if isinstance(v, Path) else v for k, v in layout.params.items()}}
    return params


#: adapter -> a function writing its copy under a folder and returning the adapter's params
COPIES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "image_folder": lambda tmp: {"root": str(image_tree(tmp / "tree"))},
    "csv_manifest": lambda tmp: {"csv_path": str(csv_dataset_files(tmp / "csv"))},
    "digits": lambda tmp: {},
    "textures": lambda tmp: {"n_per_class": {"train": 6, "test": 3}},
    "features": lambda tmp: {"path": str(features_npz(tmp / "feats.npz"))},
    **{name: _published(name) for name in LAYOUTS},
    "ade20k": lambda tmp: {"root": str(write_ade20k(tmp / "ade", n_train=2, n_val=2))},
    "voc2012_segmentation": lambda tmp: {"root": str(write_voc_segmentation(tmp / "voc", 2, 2))},
    "nyuv2_normals": lambda tmp: {"root": str(write_nyuv2(tmp / "nyu", (1, 3), (2,)))},
}
