"""Object and scene datasets of the many-shot suite: Caltech-101, Stanford Cars, Food-101
and SUN397, read from the layouts their archives unpack to."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.layout import (
    class_index,
    locate,
    read_lines,
    require_file,
    scan_class_folders,
    stratified_pick,
    under,
)
from pipeline.datasets.listing import Listing, PartitionedDataset, PublishedDataset
from pipeline.datasets.adapters.oxford import load_mat
from pipeline.errors import ConfigError, DatasetError

CALTECH_BACKGROUND = "BACKGROUND_Google"


@register_dataset("caltech101")
class Caltech101Dataset(PublishedDataset):
    """Caltech-101: ``train_per_class`` (30) random images per class for train, the rest test.

    Reads ``root/101_ObjectCategories/<class>/*.jpg``; ``root`` may also be the
    ``101_ObjectCategories`` folder itself. The ``BACKGROUND_Google`` clutter folder is
    not a class and is left out (101 classes). The draw is seeded (``seed``) over the
    images sorted by name, so a copy gives the same split anywhere.

    Parameters
    ----------
    root : str or os.PathLike
        The folder holding ``101_ObjectCategories`` (or that folder).
    name : str, optional
        Dataset name in the store (default ``caltech101``).
    train_per_class : int
        Train images drawn per class.
    seed : int
        Seed of the draw.
    skip_bad : bool
        Leave out missing or undecodable images (named in ``skipped``) instead of failing.
    content_hash : bool
        Fingerprint the files' bytes instead of their sizes and modification times.
    """

    metric = "mean_per_class"

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, train_per_class: int = 30,
                 seed: int = 0, skip_bad: bool = False, content_hash: bool = False) -> None:
        for what, value, low in (("train_per_class", train_per_class, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"caltech101 {what} must be an integer >= {low}, got {value!r}")
        self.train_per_class, self.seed = train_per_class, seed
        super().__init__(root, name, skip_bad, content_hash)

    def _read(self, root: Path) -> dict[str, Listing]:
        folder = "101_ObjectCategories"
        if (root / folder).is_dir():
            base = root / folder
        elif root.name == folder:
            base = root
        else:
            raise DatasetError(f"caltech101: folder {str(root / folder)!r} is missing")
        classes, rows = scan_class_folders(base, "caltech101")
        self.class_names = [c for c in classes if c != CALTECH_BACKGROUND]
        index = class_index(self.class_names, "caltech101")
        rows = sorted((rel, cls) for rel, cls in rows if cls in index)
        ids = [rel for rel, _ in rows]
        labels = np.array([index[cls] for _, cls in rows], dtype=np.int64)
        train = stratified_pick(labels, self.train_per_class, self.seed)
        prefix = under(root, base)
        source = f"folder {str(base)!r}"
        return {split: Listing([ids[i] for i in np.flatnonzero(mask)],
                               [f"{prefix}/{ids[i]}" for i in np.flatnonzero(mask)], labels[mask], source)
                for split, mask in (("train", train), ("test", ~train))}

    def describe(self) -> dict:
        return {**super().describe(), "train_per_class": self.train_per_class, "seed": self.seed}


@register_dataset("cars")
class CarsDataset(PublishedDataset):
    """Stanford Cars (196 classes), the authors' train and test halves.

    Reads the devkit: ``root/devkit/cars_meta.mat`` (``class_names``),
    ``root/devkit/cars_train_annos.mat`` (``annotations``: ``fname``, ``class`` from 1)
    with images in ``root/cars_train/``, and the test labels from
    ``cars_test_annos_withlabels.mat`` (in ``root`` or ``root/devkit``) with images in
    ``root/cars_test/``. Whole images (no bounding-box crop).
    """

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "devkit/cars_meta.mat", [".", "stanford_cars"], "cars")
        names = np.atleast_1d(load_mat(base / "devkit" / "cars_meta.mat", "cars").get("class_names", []))
        self.class_names = [str(n) for n in names]
        if not self.class_names:
            raise DatasetError(f"cars: {str(base / 'devkit' / 'cars_meta.mat')!r} has no 'class_names'")
        class_index(self.class_names, "cars")
        test_annos = base / "cars_test_annos_withlabels.mat"
        if not test_annos.is_file() and (base / "devkit" / test_annos.name).is_file():
            test_annos = base / "devkit" / test_annos.name
        prefix = under(root, base)
        listings = {}
        for split, annos, images in (("train", base / "devkit" / "cars_train_annos.mat", "cars_train"),
                                     ("test", test_annos, "cars_test")):
            table = load_mat(annos, "cars").get("annotations")
            table = None if table is None else np.atleast_1d(table)
            if table is None or table.dtype.names is None or not {"fname", "class"} <= set(table.dtype.names):
                raise DatasetError(f"cars: {str(annos)!r} has no 'annotations' with fields 'fname' and 'class'")
            ids = [str(f) for f in table["fname"]]
            labels = np.array([int(c) for c in table["class"]], dtype=np.int64) - 1
            bad = np.flatnonzero((labels < 0) | (labels >= len(self.class_names)))
            if bad.size:
                raise DatasetError(f"cars: {str(annos)!r} gives {ids[bad[0]]!r} the unknown class index "
                                   f"{labels[bad[0]] + 1}; classes are 1..{len(self.class_names)}")
            listings[split] = Listing(ids, [f"{prefix}/{images}/{i}" for i in ids], labels, repr(str(annos)))
        return listings


@register_dataset("food101")
class Food101Dataset(PublishedDataset):
    """Food-101, the authors' train (750 per class) and test (250 per class) lists.

    Reads ``root/meta/classes.txt`` (class order), ``root/meta/{train,test}.json``
    (``{class: ["class/image id", ...]}``) and ``root/images/<class>/<image id>.jpg``;
    ``root`` is the ``food-101`` folder.
    """

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "meta/classes.txt", [".", "food-101"], "food101")
        self.class_names = read_lines(base / "meta" / "classes.txt", "food101")
        index = class_index(self.class_names, "food101")
        prefix = under(root, base)
        listings = {}
        for split in ("train", "test"):
            source = require_file(base / "meta" / f"{split}.json", "food101")
            try:
                table = json.loads(source.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise DatasetError(f"food101: cannot read {str(source)!r} as JSON: {exc}") from None
            if not isinstance(table, dict):
                raise DatasetError(f"food101: {str(source)!r} must map class names to image lists")
            ids, labels = [], []
            for cls, images in table.items():
                if cls not in index:
                    raise DatasetError(f"food101: {str(source)!r} lists the unknown class {cls!r} (not in "
                                       f"{str(base / 'meta' / 'classes.txt')!r})")
                ids += [str(i) for i in images]
                labels += [index[cls]] * len(images)
            listings[split] = Listing(ids, [f"{prefix}/images/{i}.jpg" for i in ids], labels, repr(str(source)))
        return listings


@register_dataset("sun397")
class Sun397Dataset(PartitionedDataset):
    """SUN397 scenes, one of the ten authors' partitions (50 train and 50 test per class).

    Reads ``root/ClassName.txt`` (``/a/abbey`` per line: class order), the partition files
    ``Training_<NN>.txt`` and ``Testing_<NN>.txt`` (in ``root/Partitions`` or ``root``;
    ``/a/abbey/sun_xxx.jpg`` per line) and the images under ``root``. Class names drop the
    leading slash (``a/abbey``). Kornblith et al. and Ericsson et al. use partition 1.
    """

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "ClassName.txt", [".", "SUN397"], "sun397")
        self.class_names = [c.strip("/") for c in read_lines(base / "ClassName.txt", "sun397")]
        index = class_index(self.class_names, "sun397")
        train_name = f"Training_{self.partition:02d}.txt"
        parts = locate(root, train_name, [under(root, base) + "/Partitions", under(root, base), "Partitions"],
                       "sun397")
        prefix = under(root, base)
        listings = {}
        for split, file in (("train", train_name), ("test", f"Testing_{self.partition:02d}.txt")):
            source = parts / file
            ids, labels = [], []
            for line, text in enumerate(read_lines(source, "sun397"), start=1):
                rel = text.strip("/")
                cls = rel.rsplit("/", 1)[0] if "/" in rel else ""
                if cls not in index:
                    raise DatasetError(f"{str(source)!r} line {line}: unknown class {cls!r} (not in "
                                       f"{str(base / 'ClassName.txt')!r})")
                ids.append(rel)
                labels.append(index[cls])
            listings[split] = Listing(ids, [f"{prefix}/{i}" for i in ids], labels, repr(str(source)))
        return listings

