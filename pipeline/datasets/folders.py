"""Image files on disk: a class-per-folder tree, or a CSV manifest."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from pipeline.datasets._registry import register_dataset
from pipeline.datasets.base import IMAGE_EXTENSIONS, DatasetAdapter, Hasher, open_rgb, validate_splits
from pipeline.errors import CorruptImageError, DatasetError

_MAX_LISTED = 10


class _FileImageDataset(DatasetAdapter):
    """Shared logic: per split, sorted (id, path, label) samples, optional scan for bad files."""

    def _init_samples(self, samples: dict[str, list[tuple[str, Path, int]]], skip_bad: bool) -> None:
        self.skip_bad = bool(skip_bad)
        self._ids: dict[str, list[str]] = {}
        self._paths: dict[str, list[Path]] = {}
        self._labels: dict[str, np.ndarray] = {}
        self._skipped: dict[str, list[str]] = {}
        self._fingerprints: dict[str, str] = {}
        for split in self.splits:
            rows = sorted(samples[split], key=lambda r: r[0])
            bad: list[str] = []
            if self.skip_bad:
                # One full decode up front, so training-time loading never meets a bad file.
                bad = [sid for sid, path, _ in rows if not _readable(path)]
                bad_set = set(bad)
                rows = [r for r in rows if r[0] not in bad_set]
            if not rows:
                raise DatasetError(f"Dataset {self.name!r}: split {split!r} has no usable images")
            self._ids[split] = [r[0] for r in rows]
            self._paths[split] = [r[1] for r in rows]
            self._labels[split] = np.asarray([r[2] for r in rows], dtype=np.int64)
            self._skipped[split] = bad

    def labels(self, split: str) -> np.ndarray:
        return self._labels[self.check_split(split)].copy()

    def sample_ids(self, split: str) -> list[str]:
        return list(self._ids[self.check_split(split)])

    def skipped(self, split: str) -> list[str]:
        return list(self._skipped[self.check_split(split)])

    def load_image(self, split: str, i: int) -> Image.Image:
        paths = self._paths[self.check_split(split)]
        if not 0 <= i < len(paths):
            raise IndexError(
                f"Sample {i} out of range for split {split!r} of {self.name!r} ({len(paths)} samples)"
            )
        return open_rgb(paths[i])

    def fingerprint(self, split: str) -> str:
        """Hash of class names, ids, labels, skipped ids and every file's bytes (cached)."""
        self.check_split(split)
        if split not in self._fingerprints:
            h = Hasher(f"{self.adapter}/v{self.version}").text(split).texts(self.class_names)
            h.texts(self._ids[split]).array(self._labels[split]).texts(self._skipped[split])
            for path in self._paths[split]:
                h.file(path)
            self._fingerprints[split] = h.hexdigest()
        return self._fingerprints[split]


def _readable(path: Path) -> bool:
    try:
        open_rgb(path)
    except CorruptImageError:
        return False
    return True


def _is_image(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


@register_dataset("image_folder")
class ImageFolderDataset(_FileImageDataset):
    """``root/<split>/<class>/<image>``; classes are the sorted union of class folders.

    Images may sit in sub-folders of a class folder; ids are paths relative to the split
    folder (``cat/001.png``). Files without an image extension and hidden entries are ignored.
    With ``skip_bad``, unreadable images are dropped at construction and listed by
    ``skipped``; otherwise loading one raises CorruptImageError naming the file.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        name: str | None = None,
        splits: list[str] | tuple[str, ...] | None = None,
        skip_bad: bool = False,
        mean_per_class: bool = False,
    ) -> None:
        root_path = Path(root).expanduser()
        super().__init__(name if name is not None else root_path.resolve().name, mean_per_class)
        if not root_path.is_dir():
            raise DatasetError(f"Image folder root {str(root_path)!r} is not a directory")
        self.root = root_path
        found = sorted(p.name for p in root_path.iterdir() if p.is_dir() and not p.name.startswith("."))
        if splits is None:
            splits = found
        missing = [s for s in splits if s not in found]
        if missing:
            raise DatasetError(
                f"Image folder {str(root_path)!r} has no split folder(s) {missing}; found: {found or 'none'}"
            )
        self.splits = validate_splits(list(splits), self.name)
        class_dirs = {
            s: sorted(p.name for p in (root_path / s).iterdir() if p.is_dir() and not p.name.startswith("."))
            for s in self.splits
        }
        self.class_names = sorted(set().union(*class_dirs.values()))
        if not self.class_names:
            raise DatasetError(
                f"Image folder {str(root_path)!r} has no class folders under {list(self.splits)}"
            )
        index = {c: k for k, c in enumerate(self.class_names)}
        samples: dict[str, list[tuple[str, Path, int]]] = {}
        for split in self.splits:
            split_dir = root_path / split
            rows = []
            for cls in class_dirs[split]:
                for dirpath, dirnames, filenames in os.walk(split_dir / cls):
                    dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                    for fname in filenames:
                        if _is_image(fname):
                            path = Path(dirpath) / fname
                            rows.append((path.relative_to(split_dir).as_posix(), path, index[cls]))
            samples[split] = rows
        self._init_samples(samples, skip_bad)

    def describe(self) -> dict[str, Any]:
        return {**self._base_description(), "root": str(self.root), "skip_bad": self.skip_bad}


@register_dataset("csv_manifest")
class CsvManifestDataset(_FileImageDataset):
    """A CSV with columns ``path,label,split`` (others ignored); paths relative to its folder.

    ``label`` is a class name, or, when every label is a non-negative integer, a class index
    (class names then ``"0".."K-1"`` unless ``class_names`` is given). Without
    ``class_names``, names are sorted. Missing files are an error at construction unless
    ``skip_bad``, which records them (and undecodable images) in ``skipped``.
    """

    REQUIRED_COLUMNS = ("path", "label", "split")

    def __init__(
        self,
        csv_path: str | os.PathLike[str],
        name: str | None = None,
        class_names: list[str] | None = None,
        skip_bad: bool = False,
        mean_per_class: bool = False,
    ) -> None:
        csv_file = Path(csv_path).expanduser()
        super().__init__(name if name is not None else csv_file.stem, mean_per_class)
        if not csv_file.is_file():
            raise DatasetError(f"CSV manifest {str(csv_file)!r} does not exist")
        self.csv_path = csv_file
        rows = _read_manifest(csv_file, self.REQUIRED_COLUMNS)
        labels_raw = [r["label"] for r in rows]
        self.class_names, label_of = _resolve_labels(labels_raw, class_names, csv_file)
        self.splits = validate_splits(sorted({r["split"] for r in rows}), self.name)
        samples: dict[str, list[tuple[str, Path, int]]] = {s: [] for s in self.splits}
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
            samples[row["split"]].append((sid, path, label_of(row["label"], line)))
        if absent and not skip_bad:
            more = f", ... ({len(absent)} in all)" if len(absent) > _MAX_LISTED else ""
            shown = ", ".join(absent[:_MAX_LISTED]) + more
            raise DatasetError(f"CSV manifest {csv_file.name!r} lists {len(absent)} missing file(s): {shown}")
        self._init_samples(samples, skip_bad)

    def describe(self) -> dict[str, Any]:
        return {**self._base_description(), "csv_path": str(self.csv_path), "skip_bad": self.skip_bad}


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
