"""PASCAL VOC 2012 semantic segmentation: 20 object classes and the background."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.adapters.dense import DenseDataset, class_map, read_png
from pipeline.datasets.layout import locate, read_lines, under
from pipeline.datasets.listing import Listing
from pipeline.datasets.adapters.voc import VOC_CLASSES
from pipeline.errors import DatasetError

__all__ = ["VOC_SEGMENTATION_CLASSES", "VocSegmentationDataset"]

#: Index 0 the background, then the devkit's 20 classes in its order.
VOC_SEGMENTATION_CLASSES = ("background", *VOC_CLASSES)


@register_dataset("voc2012_segmentation")
class VocSegmentationDataset(DenseDataset):
    """PASCAL VOC 2012 segmentation with the devkit's ``train`` (1,464) and ``val`` (1,449) lists.

    Reads ``VOCdevkit/VOC2012/ImageSets/Segmentation/{train,val}.txt`` (image ids),
    ``JPEGImages/<id>.jpg`` and ``SegmentationClass/<id>.png`` (palette PNGs whose indices
    are the classes: 0 background, 1 .. 20 the objects, 255 the boundaries and difficult
    regions, ignored); ``root`` holds ``VOCdevkit`` (or is ``VOC2012``). 21 classes. The
    test set's labels are not public: ``val`` is scored.
    """

    dense_task = "segmentation"
    metric = "miou"
    test_split = "val"

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "ImageSets/Segmentation/train.txt", ["VOCdevkit/VOC2012", ".", "VOC2012"],
                      "voc2012_segmentation")
        self.class_names = list(VOC_SEGMENTATION_CLASSES)
        prefix = under(root, base)
        listings = {}
        for split in ("train", "val"):
            source = base / "ImageSets" / "Segmentation" / f"{split}.txt"
            ids = [line.split()[0] for line in read_lines(source, "voc2012_segmentation")]
            self._target_files[split] = {i: (f"{prefix}/SegmentationClass/{i}.png",) for i in ids}
            listings[split] = self.listing(ids, [f"{prefix}/JPEGImages/{i}.jpg" for i in ids], repr(str(source)))
        return listings

    def _decode_target(self, paths: list[str]) -> np.ndarray:
        img = read_png(paths[0], "voc2012_segmentation")
        if img.mode not in ("P", "L"):
            raise DatasetError(f"voc2012_segmentation: {paths[0]!r} has mode {img.mode}; SegmentationClass PNGs "
                               "hold one palette index per pixel")
        return class_map(np.asarray(img, dtype=np.int64), len(VOC_SEGMENTATION_CLASSES), paths[0],
                         "voc2012_segmentation")
