"""The four target domains of the cross-domain few-shot benchmark (CD-FSL, Guo et al.):
CropDiseases, EuroSAT, ISIC 2018 and ChestX-ray8, read as that benchmark reads them."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.layout import require_file, scan_class_folders, under
from pipeline.datasets.listing import Listing, PublishedDataset
from pipeline.errors import DatasetError

#: The seven single-finding classes CD-FSL keeps from ChestX-ray8, in its label order.
CHESTX_CLASSES = ("Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule", "Pneumothorax")


class _DomainDataset(PublishedDataset):
    train_split = "all"
    test_split = "all"
    pooled_split = "all"


class _FolderDomain(_DomainDataset):
    """A class-per-folder tree found at one of ``prefixes`` under the root."""

    prefixes: tuple[str, ...] = ()

    def _read(self, root: Path) -> dict[str, Listing]:
        base = next((root / p for p in self.prefixes if (root / p).is_dir()), None)
        if base is None and root.name == Path(self.prefixes[0]).name:  # the root is that folder itself
            base = root
        if base is None:
            raise DatasetError(f"{self.adapter}: folder {str(root / self.prefixes[0])!r} is missing"
                               + (f" (looked also for {', '.join(repr(p) for p in self.prefixes[1:])} under "
                                  "the root)" if len(self.prefixes) > 1 else ""))
        self.class_names, rows = scan_class_folders(base, self.adapter)
        index = {c: k for k, c in enumerate(self.class_names)}
        prefix = under(root, base)
        ids = [rel for rel, _ in rows]
        return {"all": Listing(ids, [f"{prefix}/{i}" for i in ids], [index[c] for _, c in rows],
                               f"folder {str(base)!r}")}


@register_dataset("cropdiseases")
class CropDiseasesDataset(_FolderDomain):
    """Plant disease photographs (38 classes), the ``dataset/train`` folder CD-FSL reads:
    ``root/dataset/train/<class>/<image>`` (also ``root/train/<class>/...``)."""

    prefixes = ("dataset/train", "train")


@register_dataset("eurosat")
class EuroSatDataset(_FolderDomain):
    """Sentinel-2 RGB tiles (10 classes, 27,000 images) of ``EuroSAT.zip``:
    ``root/2750/<class>/<image>.jpg``, or ``root`` being the ``2750`` folder."""

    prefixes = ("2750",)


@register_dataset("isic2018")
class Isic2018Dataset(_DomainDataset):
    """ISIC 2018 task 3 skin lesions (7 classes, 10,015 training images), as CD-FSL uses them.

    Reads ``root/ISIC2018_Task3_Training_GroundTruth/ISIC2018_Task3_Training_GroundTruth.csv``
    (``image`` then one column per class holding 1.0 for the image's class and 0.0
    elsewhere; the class names are the column names) and
    ``root/ISIC2018_Task3_Training_Input/<image>.jpg``.
    """

    def _read(self, root: Path) -> dict[str, Listing]:
        name = "ISIC2018_Task3_Training_GroundTruth"
        source = require_file(root / name / f"{name}.csv", "isic2018")
        with open(source, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        if not rows or len(rows[0]) < 3 or rows[0][0].strip() != "image":
            raise DatasetError(f"isic2018: {str(source)!r} must start with the header 'image,<class>,<class>,...'")
        self.class_names = [c.strip() for c in rows[0][1:]]
        ids, labels = [], []
        for line, row in enumerate(rows[1:], start=2):
            if not row:
                continue
            try:
                values = np.array([float(v) for v in row[1:]])
            except ValueError:
                values = np.array([])
            if values.size != len(self.class_names) or not np.all((values == 0) | (values == 1)) \
                    or values.sum() != 1:
                raise DatasetError(f"{str(source)!r} line {line}: expected one 1.0 among {len(self.class_names)} "
                                   f"0/1 class columns, got {','.join(row[1:])!r} (unknown class)")
            ids.append(row[0].strip())
            labels.append(int(np.argmax(values)))
        folder = "ISIC2018_Task3_Training_Input"
        return {"all": Listing(ids, [f"{folder}/{i}.jpg" for i in ids], labels, repr(str(source)))}


@register_dataset("chestx")
class ChestXDataset(_DomainDataset):
    """ChestX-ray8 (NIH), the seven classes CD-FSL keeps.

    Reads ``root/Data_Entry_2017.csv`` (``Image Index``, ``Finding Labels``) and keeps the
    images with exactly one finding among Atelectasis, Cardiomegaly, Effusion,
    Infiltration, Mass, Nodule and Pneumothorax (``No Finding``, multi-finding rows and
    the other findings are left out, as CD-FSL does). Images are looked up in
    ``root/images/`` and in the ``root/images_*/images/`` folders of the Kaggle copy.
    """

    def _read(self, root: Path) -> dict[str, Listing]:
        source = require_file(root / "Data_Entry_2017.csv", "chestx")
        with open(source, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if not {"Image Index", "Finding Labels"} <= set(reader.fieldnames or []):
                raise DatasetError(f"chestx: {str(source)!r} lacks the columns 'Image Index' and 'Finding Labels'")
            entries = [(r["Image Index"].strip(), r["Finding Labels"].strip()) for r in reader]
        self.class_names = list(CHESTX_CLASSES)
        index = {c: k for k, c in enumerate(CHESTX_CLASSES)}
        kept = [(image, index[finding]) for image, finding in entries if finding in index]
        folders = [root / "images"] + sorted(root.glob("images_*/images"))
        if not any(f.is_dir() for f in folders):
            raise DatasetError(f"chestx: folder {str(root / 'images')!r} is missing (nor images_*/images)")
        where: dict[str, str] = {}
        for folder in folders:
            if folder.is_dir():
                prefix = under(root, folder)
                for entry in os.scandir(folder):
                    where.setdefault(entry.name, f"{prefix}/{entry.name}")
        ids = [image for image, _ in kept]
        # an image in no folder keeps its images/ path, so the missing-file error names it
        files = [where.get(image, f"images/{image}") for image in ids]
        return {"all": Listing(ids, files, [k for _, k in kept], repr(str(source)))}
