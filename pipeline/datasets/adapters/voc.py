"""PASCAL VOC 2007 classification: 20 classes, several per image (multi-label)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.layout import locate, read_lines, under
from pipeline.datasets.listing import Listing, PublishedDataset
from pipeline.errors import DatasetError

#: The devkit's class list (VOCinit.m), in its order.
VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor")

PRESENT, ABSENT, DIFFICULT = 1, 0, -1


def image_labels(xml_file: Path, index: dict[str, int]) -> np.ndarray:
    """One image's row: 1 where a non-difficult object of the class is annotated, -1 where
    all of its objects of the class are marked difficult, 0 where there is none (the
    devkit's classification ground truth, with its 0 and -1 swapped)."""
    try:
        tree = ET.parse(xml_file)
    except ET.ParseError as exc:
        raise DatasetError(f"voc2007: cannot parse {str(xml_file)!r}: {exc}") from None
    except OSError:
        raise DatasetError(f"voc2007: annotation {str(xml_file)!r} is missing") from None
    row = np.full(len(index), ABSENT, dtype=np.int64)
    for obj in tree.getroot().iter("object"):
        name = (obj.findtext("name") or "").strip()
        if name not in index:
            raise DatasetError(f"voc2007: {str(xml_file)!r} has an object of the unknown class {name!r}; "
                               f"classes: {', '.join(VOC_CLASSES)}")
        difficult = (obj.findtext("difficult") or "0").strip() == "1"
        k = index[name]
        if not difficult:
            row[k] = PRESENT
        elif row[k] == ABSENT:
            row[k] = DIFFICULT
    return row


@register_dataset("voc2007")
class Voc2007Dataset(PublishedDataset):
    """PASCAL VOC 2007 image classification with the devkit's train, val and test lists.

    Reads ``VOCdevkit/VOC2007/ImageSets/Main/{train,val,test}.txt`` (image ids; test comes
    with the test archive), ``Annotations/<id>.xml`` and ``JPEGImages/<id>.jpg``; ``root``
    is the folder holding ``VOCdevkit`` (or ``VOC2007`` itself). Labels are (n, 20): 1
    present, 0 absent, -1 present only as objects marked difficult. The probes leave such
    image-class pairs out when they fit. The metric, ``map11``, is the 11-point mean
    average precision as Ericsson et al.'s code computes it (difficult images count as
    negatives there); the devkit's convention, which ignores them, is ``map11_devkit``
    (``pipeline.protocols.linear.average_precision``).
    """

    metric = "map11"
    multi_label = True
    val_split = "val"
    pooled_split = None

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "ImageSets/Main/train.txt", ["VOCdevkit/VOC2007", ".", "VOC2007"], "voc2007")
        self.class_names = list(VOC_CLASSES)
        index = {c: k for k, c in enumerate(VOC_CLASSES)}
        prefix = under(root, base)
        listings = {}
        for split in ("train", "val", "test"):
            source = base / "ImageSets" / "Main" / f"{split}.txt"
            ids = [line.split()[0] for line in read_lines(source, "voc2007")]
            rows = np.stack([image_labels(base / "Annotations" / f"{i}.xml", index) for i in ids]) if ids else \
                np.zeros((0, len(index)), dtype=np.int64)
            listings[split] = Listing(ids, [f"{prefix}/JPEGImages/{i}.jpg" for i in ids], rows, repr(str(source)))
        return listings
