"""Datasets of Oxford's Visual Geometry Group, in the layouts their archives unpack to:
FGVC Aircraft, the Describable Textures Dataset, Oxford Flowers 102 and Oxford-IIIT Pet."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.layout import class_index, locate, read_lines, require_dir, require_file, under
from pipeline.datasets.listing import Listing, PartitionedDataset, PublishedDataset
from pipeline.errors import DatasetError


def _unknown_class(source: Path, line: int, value: str, classes: list[str]) -> DatasetError:
    shown = ", ".join(classes[:10]) + (f", ... ({len(classes)} in all)" if len(classes) > 10 else "")
    return DatasetError(f"{str(source)!r} line {line}: unknown class {value!r}; classes: {shown}")


def load_mat(path: Path, what: str) -> dict:
    """A MATLAB .mat file as a dict of arrays (scipy), naming the file when it is unreadable."""
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    require_file(path, what)
    try:
        return loadmat(str(path), squeeze_me=True)
    except (OSError, ValueError, TypeError, NotImplementedError, MatReadError) as exc:
        raise DatasetError(f"{what}: cannot read {str(path)!r} as a MATLAB file: {exc}") from None


@register_dataset("aircraft")
class AircraftDataset(PublishedDataset):
    """FGVC Aircraft 2013b at the variant level (100 classes), the authors' train/val/test.

    Reads ``root/data/variants.txt`` (class order), ``images_variant_{train,val,test}.txt``
    (``<image id> <variant>`` per line) and ``images/<image id>.jpg``. ``root`` is the
    ``fgvc-aircraft-2013b`` folder (or its ``data`` folder). Images keep their bottom
    copyright banner (no crop), as torchvision reads them.
    """

    metric = "mean_per_class"
    val_split = "val"

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "variants.txt", ["data", "."], "aircraft")
        self.class_names = read_lines(base / "variants.txt", "aircraft")
        index = class_index(self.class_names, f"{str(base / 'variants.txt')!r}")
        prefix = under(root, base)
        listings = {}
        for split in ("train", "val", "test"):
            source = base / f"images_variant_{split}.txt"
            ids, labels = [], []
            for line, text in enumerate(read_lines(source, "aircraft"), start=1):
                image, _, variant = text.partition(" ")
                if variant.strip() not in index:
                    raise _unknown_class(source, line, variant.strip(), self.class_names)
                ids.append(image)
                labels.append(index[variant.strip()])
            listings[split] = Listing(ids, [f"{prefix}/images/{i}.jpg" for i in ids], labels, repr(str(source)))
        return listings


@register_dataset("dtd")
class DtdDataset(PartitionedDataset):
    """Describable Textures (47 classes), one of the authors' ten train/val/test partitions.

    Reads ``root/labels/{train,val,test}<partition>.txt`` (``<class>/<file>.jpg`` per
    line) and ``root/images/<class>/<file>.jpg``; ``root`` is the ``dtd`` folder. Classes
    are the sorted folders of ``images``. Kornblith et al. and Ericsson et al. use
    partition 1.
    """

    val_split = "val"

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, f"labels/train{self.partition}.txt", [".", "dtd"], "dtd")
        images = require_dir(base / "images", "dtd")
        self.class_names = sorted(e.name for e in os.scandir(images) if e.is_dir() and not e.name.startswith("."))
        index = class_index(self.class_names, "dtd")
        prefix = under(root, base)
        listings = {}
        for split in ("train", "val", "test"):
            source = base / "labels" / f"{split}{self.partition}.txt"
            ids, labels = [], []
            for line, text in enumerate(read_lines(source, "dtd"), start=1):
                cls = text.split("/", 1)[0]
                if cls not in index or "/" not in text:
                    raise _unknown_class(source, line, cls, self.class_names)
                ids.append(text)
                labels.append(index[cls])
            listings[split] = Listing(ids, [f"{prefix}/images/{i}" for i in ids], labels, repr(str(source)))
        return listings



@register_dataset("flowers102")
class Flowers102Dataset(PublishedDataset):
    """Oxford Flowers 102 with the authors' train/val/test (``setid.mat``).

    Reads ``root/imagelabels.mat`` (``labels``: the class, 1..102, of image k),
    ``root/setid.mat`` (``trnid``, ``valid``, ``tstid``: 1-based image numbers) and
    ``root/jpg/image_%05d.jpg``. Class names are the label numbers ("1".."102"): the
    archive holds no names.
    """

    metric = "mean_per_class"
    val_split = "val"

    def _read(self, root: Path) -> dict[str, Listing]:
        label_file, set_file = root / "imagelabels.mat", root / "setid.mat"
        labels = np.atleast_1d(load_mat(label_file, "flowers102").get("labels", np.array([])))
        if labels.size == 0 or labels.dtype.kind not in "iuf" or np.any(labels != np.round(labels)):
            raise DatasetError(f"flowers102: {str(label_file)!r} has no integer array 'labels'")
        labels = labels.astype(np.int64)
        if labels.min() < 1:
            raise DatasetError(f"flowers102: {str(label_file)!r} holds the unknown class index {labels.min()} "
                               "(classes are numbered from 1)")
        self.class_names = [str(k) for k in range(1, int(labels.max()) + 1)]
        sets = load_mat(set_file, "flowers102")
        listings = {}
        for split, key in (("train", "trnid"), ("val", "valid"), ("test", "tstid")):
            if key not in sets:
                raise DatasetError(f"flowers102: {str(set_file)!r} has no array {key!r}")
            numbers = np.atleast_1d(sets[key]).astype(np.int64)
            bad = numbers[(numbers < 1) | (numbers > labels.size)]
            if bad.size:
                raise DatasetError(f"flowers102: {str(set_file)!r} {key} lists image {bad[0]}, but "
                                   f"{str(label_file)!r} labels images 1..{labels.size}")
            ids = [f"image_{k:05d}" for k in numbers]
            listings[split] = Listing(ids, [f"jpg/{i}.jpg" for i in ids], labels[numbers - 1] - 1,
                                      f"{str(set_file)!r} ({key})")
        require_dir(root / "jpg", "flowers102")
        return listings


@register_dataset("pets")
class PetsDataset(PublishedDataset):
    """Oxford-IIIT Pet, 37 breeds, the authors' trainval (split ``train``) and test lists.

    Reads ``root/annotations/{trainval,test}.txt`` (``<image> <class id> <species>
    <breed id>`` per line, class ids from 1) and ``root/images/<image>.jpg``. A class's
    name is its images' name without the trailing number (``Abyssinian``,
    ``american_bulldog``), ordered by class id.
    """

    metric = "mean_per_class"

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "annotations/trainval.txt", [".", "oxford-iiit-pet"], "pets")
        names: dict[int, str] = {}
        rows = {}
        for split, file in (("train", "trainval.txt"), ("test", "test.txt")):
            source = base / "annotations" / file
            ids, labels = [], []
            for line, text in enumerate(read_lines(source, "pets"), start=1):
                if text.startswith("#"):
                    continue
                parts = text.split()
                if len(parts) < 2 or not parts[1].lstrip("-").isdigit():
                    raise DatasetError(f"{str(source)!r} line {line}: expected '<image> <class id> ...', got {text!r}")
                if int(parts[1]) < 1:
                    raise DatasetError(f"{str(source)!r} line {line}: unknown class id {parts[1]} (ids start at 1)")
                image, cls = parts[0], int(parts[1])
                breed = image.rsplit("_", 1)[0]
                if names.setdefault(cls, breed) != breed:
                    raise DatasetError(f"{str(source)!r} line {line}: class id {cls} is {names[cls]!r} elsewhere "
                                       f"but {breed!r} here")
                ids.append(image)
                labels.append(cls - 1)
            rows[split] = (ids, labels, source)
        absent = [k for k in range(1, max(names) + 1) if k not in names]
        if absent:
            raise DatasetError(f"pets: class id {absent[0]} appears in neither {str(rows['train'][2])!r} nor "
                               f"{str(rows['test'][2])!r} (ids go up to {max(names)})")
        self.class_names = [names[k] for k in range(1, max(names) + 1)]
        prefix = under(root, base)
        return {split: Listing(ids, [f"{prefix}/images/{i}.jpg" for i in ids], labels, repr(str(source)))
                for split, (ids, labels, source) in rows.items()}
