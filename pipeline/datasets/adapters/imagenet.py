"""ILSVRC-2012 (ImageNet-1k): train in synset folders; val in synset folders or flat with
its ground-truth file. Classes in the standard order: synset ids (wnids) sorted."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.layout import is_image_name, locate, read_lines, require_dir, scan_class_folders, under
from pipeline.datasets.listing import Listing, PublishedDataset
from pipeline.datasets.adapters.oxford import load_mat
from pipeline.errors import DatasetError

DEVKIT_DATA = "ILSVRC2012_devkit_t12/data"
LOC_SOLUTION = "LOC_val_solution.csv"
LOC_SYNSETS = "LOC_synset_mapping.txt"
DEVKIT_TRUTH = "ILSVRC2012_validation_ground_truth.txt"


def devkit_ids(meta: Path) -> dict[int, str]:
    """ILSVRC2012_ID -> wnid of the 1,000 leaf classes in the devkit's ``meta.mat``."""
    synsets = np.atleast_1d(load_mat(meta, "imagenet").get("synsets", np.array([])))
    fields = set(synsets.dtype.names or ())
    if not {"ILSVRC2012_ID", "WNID", "num_children"} <= fields:
        raise DatasetError(f"imagenet: {str(meta)!r} has no 'synsets' with ILSVRC2012_ID, WNID and num_children")
    return {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets if int(s["num_children"]) == 0}


@register_dataset("imagenet")
class ImageNetDataset(PublishedDataset):
    """ILSVRC-2012 classification: ``train`` (1,281,167 images) and ``val`` (50,000).

    ``root`` holds ``train/<wnid>/*.JPEG`` and ``val/`` (or is the Kaggle copy's root with
    ``ILSVRC/Data/CLS-LOC/{train,val}``). ``val`` is either in ``<wnid>`` folders or flat
    (``ILSVRC2012_val_00000001.JPEG`` ...) with a ground-truth file: ``val_ground_truth``,
    else ``root/LOC_val_solution.csv`` (Kaggle: ``ImageId,PredictionString``, the wnid
    first) or the devkit's ``ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt``
    (one ILSVRC2012_ID per image, mapped to wnids by the devkit's ``meta.mat``).
    The class order is the sorted wnids of the synset list (``LOC_synset_mapping.txt`` or
    the devkit's ``meta.mat`` when present, else the train folders): the index every
    ImageNet classifier uses. A missing or unknown class folder is an error, so a partial
    copy never shifts the indices. Scored on ``val``; no authors' validation split.

    Parameters
    ----------
    root : str or os.PathLike
        The ILSVRC-2012 folder (or the Kaggle copy's root).
    name : str, optional
        Dataset name in the store (default ``imagenet``).
    val_ground_truth : str or os.PathLike, optional
        The ground-truth file of a flat ``val`` folder (default: found in ``root``).
    skip_bad : bool
        Leave out missing or undecodable images (named in ``skipped``) instead of failing.
    content_hash : bool
        Fingerprint the files' bytes instead of their sizes and modification times.
    """

    test_split = "val"
    pooled_split = None

    def __init__(self, root: str | os.PathLike[str], name: str | None = None,
                 val_ground_truth: str | os.PathLike[str] | None = None, skip_bad: bool = False,
                 content_hash: bool = False) -> None:
        self.val_ground_truth = None if val_ground_truth is None else Path(val_ground_truth).expanduser()
        super().__init__(root, name, skip_bad, content_hash)

    def _synsets(self, root: Path) -> tuple[list[str] | None, str]:
        if (root / LOC_SYNSETS).is_file():
            return sorted(line.split()[0] for line in read_lines(root / LOC_SYNSETS, "imagenet")), LOC_SYNSETS
        if (root / DEVKIT_DATA / "meta.mat").is_file():
            return sorted(devkit_ids(root / DEVKIT_DATA / "meta.mat").values()), f"{DEVKIT_DATA}/meta.mat"
        return None, "the train folders"

    def _read(self, root: Path) -> dict[str, Listing]:
        base = locate(root, "train", [".", "ILSVRC/Data/CLS-LOC"], "imagenet")
        synsets, self.synset_source = self._synsets(root)
        folders, train_rows = scan_class_folders(base / "train", "imagenet")
        self.class_names = synsets if synsets is not None else folders
        index = {c: k for k, c in enumerate(self.class_names)}
        self._check_folders(base / "train", folders)
        prefix = under(root, base)
        listings = {"train": Listing([r for r, _ in train_rows], [f"{prefix}/train/{r}" for r, _ in train_rows],
                                     [index[c] for _, c in train_rows], f"folder {str(base / 'train')!r}")}
        val = require_dir(base / "val", "imagenet")
        if any(e.is_dir() and not e.name.startswith(".") for e in os.scandir(val)):
            folders, rows = scan_class_folders(val, "imagenet")
            unknown = sorted(set(folders) - set(index))
            if unknown:
                raise DatasetError(f"imagenet: class folder {str(val / unknown[0])!r} is not a synset of "
                                   f"{self.synset_source}")
            listings["val"] = Listing([r for r, _ in rows], [f"{prefix}/val/{r}" for r, _ in rows],
                                      [index[c] for _, c in rows], f"folder {str(val)!r}")
        else:
            truth, source = self._val_truth(root)
            images = sorted(e.name for e in os.scandir(val) if is_image_name(e.name))
            unlisted = [i for i in images if os.path.splitext(i)[0] not in truth]
            if unlisted:
                raise DatasetError(f"imagenet: {str(val / unlisted[0])!r} has no label in {source}")
            ids = sorted(truth)
            labels = []
            for image in ids:
                if truth[image] not in index:
                    raise DatasetError(f"imagenet: {source} gives {image} the unknown class {truth[image]!r} (not a "
                                       f"synset of {self.synset_source})")
                labels.append(index[truth[image]])
            named = {os.path.splitext(i)[0]: i for i in images}
            listings["val"] = Listing(ids, [f"{prefix}/val/{named.get(i, i + '.JPEG')}" for i in ids], labels, source)
        return listings

    def _check_folders(self, train: Path, folders: list[str]) -> None:
        unknown = sorted(set(folders) - set(self.class_names))
        if unknown:
            raise DatasetError(f"imagenet: class folder {str(train / unknown[0])!r} is not a synset of "
                               f"{self.synset_source}")
        absent = sorted(set(self.class_names) - set(folders))
        if absent:
            raise DatasetError(f"imagenet: class folder {str(train / absent[0])!r} is missing ({len(absent)} of "
                               f"the {len(self.class_names)} synsets of {self.synset_source} have no folder)")

    def _val_truth(self, root: Path) -> tuple[dict[str, str], str]:
        """Image stem -> wnid of a flat val folder, and the file it came from."""
        candidates = [self.val_ground_truth] if self.val_ground_truth is not None else \
            [root / LOC_SOLUTION, root / DEVKIT_DATA / DEVKIT_TRUTH]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise DatasetError(f"imagenet: val holds no synset folders and its ground-truth file "
                               f"{' or '.join(repr(str(p)) for p in candidates)} is missing")
        source = repr(str(path))
        if path.suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                if not {"ImageId", "PredictionString"} <= set(reader.fieldnames or []):
                    raise DatasetError(f"imagenet: {source} lacks the columns ImageId and PredictionString")
                return {r["ImageId"].strip(): (r["PredictionString"].split() or [""])[0] for r in reader}, source
        meta = path.parent / "meta.mat"
        ids = devkit_ids(meta)
        truth = {}
        for line, text in enumerate(read_lines(path, "imagenet"), start=1):
            if not text.isdigit() or int(text) not in ids:
                raise DatasetError(f"imagenet: {source} line {line}: unknown class index {text!r} (not an "
                                   f"ILSVRC2012_ID of {str(meta)!r})")
            truth[f"ILSVRC2012_val_{line:08d}"] = ids[int(text)]
        return truth, source

    def metadata(self) -> dict:
        return {**super().metadata(), "synsets": self.synset_source}

    def describe(self) -> dict:
        return {**super().describe(), "val_ground_truth": None if self.val_ground_truth is None
                else str(self.val_ground_truth)}
