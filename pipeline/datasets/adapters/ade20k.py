"""ADE20K's SceneParsing release (the MIT Scene Parsing Benchmark, 150 classes)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.adapters.dense import IGNORE_INDEX, DenseDataset, class_map, image_ids, read_png
from pipeline.datasets.layout import locate, under
from pipeline.datasets.listing import Listing
from pipeline.errors import DatasetError

__all__ = ["ADE20K_CLASSES", "Ade20kDataset", "ade20k_class_names"]

#: Classes of the benchmark (annotation values 1 .. 150; 0 is "other objects", ignored).
ADE20K_CLASSES = 150
_FOLDERS = {"train": "training", "val": "validation"}


def ade20k_class_names(base: Path) -> list[str]:
    """The 150 class names from the release's ``objectInfo150.txt`` (tab-separated, or the
    devkit's ``objectInfo150.csv``), the first name of each row; ``class_001`` ... when the
    release holds neither file."""
    for name, delimiter in (("objectInfo150.txt", "\t"), ("objectInfo150.csv", ",")):
        path = base / name
        if not path.is_file():
            continue
        try:
            with open(path, encoding="utf-8", newline="") as fh:
                rows = [r for r in csv.reader(fh, delimiter=delimiter) if r and r[0].strip().isdigit()]
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetError(f"ade20k: cannot read {str(path)!r}: {exc}") from None
        names = {int(r[0]): r[-1].split(";")[0].strip() for r in rows}
        if sorted(names) != list(range(1, ADE20K_CLASSES + 1)):
            raise DatasetError(f"ade20k: {str(path)!r} must list classes 1 to {ADE20K_CLASSES}, one per row; "
                               f"found {len(names)}")
        return [names[k] for k in range(1, ADE20K_CLASSES + 1)]
    return [f"class_{k:03d}" for k in range(1, ADE20K_CLASSES + 1)]


@register_dataset("ade20k")
class Ade20kDataset(DenseDataset):
    """ADE20K SceneParsing (``ADEChallengeData2016``): 150 classes, per-pixel labels.

    Reads ``images/{training,validation}/<id>.jpg`` and ``annotations/{training,validation}/
    <id>.png`` (8-bit, one value per pixel: 0 "other objects", 1 .. 150 the classes);
    ``root`` holds ``ADEChallengeData2016`` (or is it). Splits ``train`` (20,210 images) and
    ``val`` (2,000), the labelled validation set every paper reports on (the challenge's
    test images have no public labels). Targets: annotation value minus one, 0 as 255
    (ignored), as the benchmark's evaluation does.
    """

    dense_task = "segmentation"
    metric = "miou"
    test_split = "val"

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "images/training", ["ADEChallengeData2016", "."], "ade20k")
        self.class_names = ade20k_class_names(base)
        prefix = under(root, base)
        listings = {}
        for split, folder in _FOLDERS.items():
            images = image_ids(base / "images" / folder, "ade20k")
            annotations = image_ids(base / "annotations" / folder, "ade20k")
            lacking = sorted(set(images) - set(annotations))
            if lacking:
                raise DatasetError(f"ade20k: {len(lacking)} image(s) of images/{folder} have no annotation in "
                                   f"annotations/{folder}, e.g. {lacking[0]!r}")
            ids = sorted(images)
            self._target_files[split] = {i: (f"{prefix}/annotations/{folder}/{annotations[i]}",) for i in ids}
            listings[split] = self.listing(ids, [f"{prefix}/images/{folder}/{images[i]}" for i in ids],
                                           repr(str(base / "images" / folder)))
        return listings

    def _decode_target(self, paths: list[str]) -> np.ndarray:
        img = read_png(paths[0], "ade20k")
        if img.mode not in ("L", "P", "I", "I;16"):
            raise DatasetError(f"ade20k: annotation {paths[0]!r} has mode {img.mode}; it must be one value per pixel")
        values = np.asarray(img, dtype=np.int64)
        if values.max(initial=0) > ADE20K_CLASSES or values.min(initial=0) < 0:  # every value, before any cast
            shown = int(values.min()) if values.min(initial=0) < 0 else int(values.max())
            raise DatasetError(f"ade20k: {paths[0]!r} holds label {shown}; labels are 0 to {ADE20K_CLASSES}")
        return class_map(np.where(values == 0, IGNORE_INDEX, values - 1), ADE20K_CLASSES, paths[0], "ade20k")

