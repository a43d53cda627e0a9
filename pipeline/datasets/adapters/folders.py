"""Image files on disk: a class-per-folder tree, or a CSV manifest."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.base import validate_splits
from pipeline.datasets.layout import is_image_name
from pipeline.datasets.listing import ListedImageDataset, Listing
from pipeline.errors import ConfigError, DatasetError

_MAX_LISTED = 10


@register_dataset("image_folder")
class ImageFolderDataset(ListedImageDataset):
    """``root/<split>/<class>/<image>``; classes are the sorted union of class folders.

    Images may sit in sub-folders of a class folder; ids are paths relative to the split
    folder (``cat/001.png``). Files without an image extension and hidden entries are
    ignored; hidden folders left out are listed by :meth:`layout_notes`. With ``skip_bad``,
    unreadable images are dropped at construction and listed by ``skipped``; otherwise
    loading one raises CorruptImageError naming the file.

    A root of class folders without split folders (``root/<class>/<image>``) is split with
    ``test_fraction``: per class, in sorted id order shuffled by ``seed``, that share of the
    images (rounded, at least one and never all where a class has two or more) goes to
    ``test`` and the rest to ``train``; both numbers are in the fingerprint. Without
    ``test_fraction`` such a root is refused with a message saying what was found.

    Parameters
    ----------
    root : str or os.PathLike
        The folder holding the split folders (or, with ``test_fraction``, the class folders).
    name : str, optional
        Dataset name in the store (default: the root folder's name).
    splits : list or tuple of str, optional
        Split folders to read (default: every sub-folder).
    skip_bad : bool
        Leave out missing or undecodable images (named in ``skipped``) instead of failing.
    mean_per_class : bool
        Report mean per-class accuracy instead of top-1.
    content_hash : bool
        Fingerprint the files' bytes instead of their sizes and modification times.
    test_fraction : float, optional
        Split a root of class folders: the share of each class in ``test``, in (0, 1).
    seed : int
        Seed of that split.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        name: str | None = None,
        splits: list[str] | tuple[str, ...] | None = None,
        skip_bad: bool = False,
        mean_per_class: bool = False,
        content_hash: bool = False,
        test_fraction: float | None = None,
        seed: int = 0,
    ) -> None:
        root_path = Path(root).expanduser()
        super().__init__(name if name is not None else root_path.resolve().name, mean_per_class)
        if not root_path.is_dir():
            raise DatasetError(f"Image folder root {str(root_path)!r} is not a directory")
        self.test_fraction = None if test_fraction is None else float(test_fraction)
        self.seed = int(seed)
        self._hidden: list[str] = []
        self._base = root_path
        found = self._subfolders(root_path)
        if test_fraction is not None:
            listings = self._split_class_folders(root_path, found, splits)
        else:
            listings = self._split_folders(root_path, found, splits)
        self._init_listings(root_path, listings, skip_bad=skip_bad, content_hash=content_hash)

    def _subfolders(self, folder: Path, rel: str = "") -> list[str]:
        """Visible sub-folders, sorted; hidden ones are remembered for :meth:`layout_notes`."""
        entries = sorted(p.name for p in folder.iterdir() if p.is_dir())
        self._hidden += [f"{rel}/{e}" if rel else e for e in entries if e.startswith(".")]
        return [e for e in entries if not e.startswith(".")]

    def _split_folders(self, root_path: Path, found: list[str], splits) -> dict[str, Listing]:
        if splits is None:
            splits = found
        missing = [s for s in splits if s not in found]
        if missing:
            raise DatasetError(
                f"Image folder {str(root_path)!r} has no split folder(s) {missing}; found: {found or 'none'}"
            )
        class_dirs = {s: self._subfolders(root_path / s, s) for s in splits}
        self.class_names = sorted(set().union(*class_dirs.values()))
        if not self.class_names:
            direct = [s for s in found if any(is_image_name(f.name) for f in (root_path / s).iterdir())]
            if direct:
                shown = ", ".join(direct[:_MAX_LISTED]) + (", ..." if len(direct) > _MAX_LISTED else "")
                raise DatasetError(
                    f"Image folder {str(root_path)!r} holds class folders with images directly inside ({shown}), "
                    "not split folders root/<split>/<class>/: for a seeded, stratified split into train and "
                    "test set `test_fraction: 0.25` in the dataset's params (repeval datasets show, repeval "
                    "extract: --param test_fraction=0.25), or arrange the images as root/<split>/<class>/"
                )
            raise DatasetError(f"Image folder {str(root_path)!r} has no class folders under {list(splits)}")
        index = {c: k for k, c in enumerate(self.class_names)}
        listings = {}
        for split in splits:
            split_dir = root_path / split
            ids, labels = [], []
            for cls in class_dirs[split]:
                for rel in self._images(split_dir, cls):
                    ids.append(rel)
                    labels.append(index[cls])
            listings[split] = Listing(ids, [f"{split}/{i}" for i in ids], labels, f"folder {str(split_dir)!r}")
        return listings

    def _images(self, base: Path, cls: str) -> list[str]:
        """Image paths under ``base/cls``, relative to ``base``; hidden folders remembered."""
        out = []
        for dirpath, dirnames, filenames in os.walk(base / cls):
            rel = Path(dirpath).relative_to(base).as_posix()
            self._hidden += [f"{Path(dirpath).relative_to(self._base).as_posix()}/{d}"
                             for d in dirnames if d.startswith(".")]
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            out += [f"{rel}/{f}" for f in filenames if is_image_name(f)]
        return out

    def _split_class_folders(self, root_path: Path, found: list[str], splits) -> dict[str, Listing]:
        """``root/<class>/<image>`` split per class into ``train`` and ``test``, seeded."""
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"image_folder test_fraction must be in (0, 1), got {self.test_fraction!r}")
        if splits is not None:
            raise ConfigError("image_folder: splits names split folders, test_fraction splits a root of class "
                              "folders; give one of them")
        split_like = [f for f in found if f.lower() in _SPLIT_NAMES]
        if len(split_like) >= 2:
            raise DatasetError(f"Image folder {str(root_path)!r} has split folders ({', '.join(split_like)}); "
                               "test_fraction splits a root of class folders: leave it out")
        self.class_names = found
        if not found:
            raise DatasetError(f"Image folder {str(root_path)!r} has no class folders")
        rng = np.random.default_rng(self.seed)
        parts: dict[str, tuple[list[str], list[int]]] = {"train": ([], []), "test": ([], [])}
        for k, cls in enumerate(found):
            ids = sorted(self._images(root_path, cls))
            order = rng.permutation(len(ids))
            n_test = int(round(self.test_fraction * len(ids)))
            n_test = min(max(n_test, 1), len(ids) - 1) if len(ids) >= 2 else 0
            for rank, i in enumerate(order):
                part = parts["test" if rank < n_test else "train"]
                part[0].append(ids[i])
                part[1].append(k)
        where = f"folder {str(root_path)!r} split with test_fraction={self.test_fraction:g}, seed={self.seed}"
        return {s: Listing(ids, list(ids), labels, where) for s, (ids, labels) in parts.items()}

    def layout_notes(self) -> list[dict[str, Any]]:
        """Hidden folders that were left out (names starting with a dot), for the run's
        output, ``datasets show`` and the report.

        Returns
        -------
        list of dict
            ``{"where", "what", "items", "kind"}`` notes.
        """
        hidden = sorted(set(self._hidden))
        if not hidden:
            return []
        return [{"where": self.name, "what": f"{len(hidden)} hidden folder(s) left out (names starting with '.')",
                 "items": hidden, "kind": "hidden_folders"}]

    def fingerprint(self, split: str) -> str:
        """As every listed dataset's, plus ``test_fraction`` and ``seed`` where they split the root.

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            Hexadecimal SHA-256.
        """
        self.check_split(split)
        extra = [] if self.test_fraction is None else [[f"test_fraction={self.test_fraction!r}", f"seed={self.seed}"]]
        return self._file_fingerprint(split, self._root_dir, self._files[split], self._stats[split],
                                      self._ids[split], self._labels[split], self._skipped[split], *extra)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.test_fraction is not None:
            out.update(test_fraction=self.test_fraction, seed=self.seed)
        return out


_SPLIT_NAMES = ("train", "test", "val", "valid", "validation", "training", "testing")


@register_dataset("csv_manifest")
class CsvManifestDataset(ListedImageDataset):
    """A CSV with columns ``path,label,split`` (others ignored); paths relative to its folder.

    ``label`` is a class name, or, when every label is a non-negative integer, a class index
    (class names then ``"0".."K-1"`` unless ``class_names`` is given). Without
    ``class_names``, names are sorted. Missing files are an error at construction unless
    ``skip_bad``, which records them (and undecodable images) in ``skipped``.

    Parameters
    ----------
    csv_path : str or os.PathLike
        The manifest file.
    name : str, optional
        Dataset name in the store (default: the file name without its suffix).
    class_names : list of str, optional
        Class names in index order (default: from the labels).
    skip_bad : bool
        Leave out missing or undecodable images (named in ``skipped``) instead of failing.
    mean_per_class : bool
        Report mean per-class accuracy instead of top-1.
    content_hash : bool
        Fingerprint the files' bytes instead of their sizes and modification times.
    """

    REQUIRED_COLUMNS = ("path", "label", "split")

    def __init__(
        self,
        csv_path: str | os.PathLike[str],
        name: str | None = None,
        class_names: list[str] | None = None,
        skip_bad: bool = False,
        mean_per_class: bool = False,
        content_hash: bool = False,
    ) -> None:
        csv_file = Path(csv_path).expanduser()
        super().__init__(name if name is not None else csv_file.stem, mean_per_class)
        if not csv_file.is_file():
            raise DatasetError(f"CSV manifest {str(csv_file)!r} does not exist")
        self.csv_path = csv_file
        rows = _read_manifest(csv_file, self.REQUIRED_COLUMNS)
        labels_raw = [r["label"] for r in rows]
        self.class_names, label_of = _resolve_labels(labels_raw, class_names, csv_file)
        split_names = sorted({r["split"] for r in rows})
        validate_splits(split_names, self.name)
        samples: dict[str, tuple[list[str], list[str], list[int]]] = {s: ([], [], []) for s in split_names}
        seen: set[tuple[str, str]] = set()
        absent: list[str] = []
        for line, row in enumerate(rows, start=2):
            sid = Path(row["path"]).as_posix()
            if (row["split"], sid) in seen:
                raise DatasetError(
                    f"{csv_file.name}:{line}: path {sid!r} listed twice in split {row['split']!r}"
                )
            seen.add((row["split"], sid))
            path = Path(row["path"]) if Path(row["path"]).is_absolute() else csv_file.parent / row["path"]
            if not path.is_file():
                absent.append(sid)
            ids, files, labels = samples[row["split"]]
            ids.append(sid)
            files.append(row["path"])
            labels.append(label_of(row["label"], line))
        if absent and not skip_bad:
            more = f", ... ({len(absent)} in all)" if len(absent) > _MAX_LISTED else ""
            shown = ", ".join(absent[:_MAX_LISTED]) + more
            raise DatasetError(f"CSV manifest {csv_file.name!r} lists {len(absent)} missing file(s): {shown}")
        listings = {s: Listing(*samples[s], f"CSV manifest {csv_file.name!r}") for s in split_names}
        self._init_listings(csv_file.parent, listings, skip_bad=skip_bad, content_hash=content_hash)

    def describe(self) -> dict[str, Any]:
        return {**self._listing_description(), "csv_path": str(self.csv_path)}


def _read_manifest(csv_file: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        return _parse_manifest(csv_file, required)
    except (UnicodeDecodeError, csv.Error) as exc:  # binary or non-UTF-8 file, a field over csv's limit
        raise DatasetError(f"CSV manifest {csv_file.name!r} is not a readable UTF-8 CSV: {exc}") from None


def _parse_manifest(csv_file: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    with open(csv_file, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        columns = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in required if c not in columns]
        if missing:
            raise DatasetError(
                f"CSV manifest {csv_file.name!r} lacks column(s) {missing}; found {columns}, "
                f"required {list(required)}"
            )
        rows = []
        for line, raw in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
            empty = [c for c in required if not row.get(c)]
            if empty:
                raise DatasetError(f"{csv_file.name}:{line}: empty {', '.join(empty)}")
            if any("\x00" in v for v in row.values()):
                raise DatasetError(f"{csv_file.name}:{line}: contains a NUL byte; not a text CSV")
            rows.append(row)
    if not rows:
        raise DatasetError(f"CSV manifest {csv_file.name!r} has no rows")
    return rows


def _resolve_labels(labels: list[str], class_names: list[str] | None, csv_file: Path):
    """Class names and a function mapping a label cell (name or index) to its class index."""
    all_ints = all(v.isdigit() for v in labels)
    given = class_names is not None
    if class_names is None:
        if all_ints:
            class_names = [str(k) for k in range(max(int(v) for v in labels) + 1)]
        else:
            class_names = sorted(set(labels))
    class_names = [str(c) for c in class_names]
    if len(set(class_names)) != len(class_names):
        raise DatasetError(f"class_names for {csv_file.name!r} has duplicates: {class_names}")
    index = {c: k for k, c in enumerate(class_names)}
    if given and not all_ints and any(v.isdigit() for v in labels):
        # indices mixed with something else: name that label, not the first index it spoils
        line, odd = next((i, v) for i, v in enumerate(labels, start=2) if not v.isdigit() and v not in index)
        raise DatasetError(
            f"{csv_file.name}:{line}: label {odd!r} is neither a class name nor a class index (an integer >= 0 "
            f"below {len(class_names)}); classes: {', '.join(class_names[:30])}"
        )

    def label_of(value: str, line: int) -> int:
        if value in index:
            return index[value]
        if all_ints and int(value) < len(class_names):
            return int(value)
        raise DatasetError(
            f"{csv_file.name}:{line}: label {value!r} is neither a class name nor an index below "
            f"{len(class_names)}; classes: {', '.join(class_names[:30])}"
        )

    return class_names, label_of
