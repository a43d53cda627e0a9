"""A Hugging Face ``datasets`` dataset on disk: ``save_to_disk`` output or parquet files."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from pipeline.datasets.registry import register_dataset
from pipeline.datasets.base import FileBackedDataset, decode_rgb, validate_splits
from pipeline.datasets.layout import require_file
from pipeline.datasets.listing import stat_files
from pipeline.errors import CorruptImageError, DatasetError

_HUB_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_.]+?)-\d+-of-\d+")


def _read_json(path: Path) -> Any:
    require_file(path, "hf")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"hf: cannot read {str(path)!r} as JSON: {exc}") from None


def find_data_files(root: Path) -> dict[str, list[str]]:
    """Split -> data files (relative to ``root``) of a saved dataset or a parquet tree."""
    if (root / "dataset_dict.json").is_file():
        splits = _read_json(root / "dataset_dict.json").get("splits") or []
        return {s: [f"{s}/{f['filename']}" for f in _read_json(root / s / "state.json").get("_data_files", [])]
                for s in splits}
    if (root / "state.json").is_file():
        state = _read_json(root / "state.json")
        return {state.get("_split") or "train": [f["filename"] for f in state.get("_data_files", [])]}
    files: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.parquet")):
        rel = path.relative_to(root)
        match = _HUB_NAME.match(path.name)
        if match:
            split = match["split"]
        elif len(rel.parts) > 1:
            split = rel.parts[-2]
        else:
            raise DatasetError(f"hf: cannot tell the split of {str(path)!r}; name it "
                               "<split>-00000-of-00001.parquet or put it in a <split>/ folder")
        files.setdefault(split, []).append(rel.as_posix())
    if not files:
        raise DatasetError(f"hf: {str(root)!r} holds neither dataset_dict.json nor state.json (save_to_disk) "
                           "nor *.parquet files")
    return files


def open_table(path: Path, columns: list[str] | None = None):
    """A data file as a pyarrow Table (Arrow streams are memory-mapped, not read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    require_file(path, "hf")
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path, columns=columns)
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
        return table if columns is None else table.select(columns)
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise DatasetError(f"hf: cannot read {str(path)!r}: {exc}") from None


def read_schema(path: Path):
    """A data file's pyarrow schema, without reading its rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    require_file(path, "hf")
    try:
        if path.suffix == ".parquet":
            return pq.read_schema(path)
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).schema
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"hf: cannot read {str(path)!r}: {exc}") from None


def _features(path: Path) -> dict[str, Any]:
    """The ``datasets`` features stored in a data file's schema metadata (or {})."""
    meta = read_schema(path).metadata or {}
    try:
        return json.loads(meta.get(b"huggingface", b"{}")).get("info", {}).get("features", {}) or {}
    except json.JSONDecodeError:
        return {}


@register_dataset("hf")
class HuggingFaceDataset(FileBackedDataset):
    """Images and class labels from named columns of a Hugging Face dataset on disk.

    ``image_column`` holds ``datasets.Image`` values (``{bytes, path}``), raw bytes or file
    paths (relative ones to ``root``); ``label_column`` holds class indices (names from
    the ``ClassLabel`` feature, else ``class_names``, else "0".."K-1") or class names
    (sorted, unless ``class_names`` orders them). A label outside the classes (``-1``
    marks an unlabelled row in ``datasets``) is an error naming the file and row.

    Parameters
    ----------
    root : str or os.PathLike
        The ``save_to_disk`` folder or the folder holding the parquet files.
    name : str, optional
        Dataset name in the store (default: the root folder's name).
    image_column, label_column : str
        The columns holding the images and the labels.
    class_names : list of str, optional
        Class names in index order (default: from the ``ClassLabel`` feature).
    splits : list or tuple of str, optional
        Splits to read (default: all found).
    mean_per_class : bool
        Report mean per-class accuracy instead of top-1.
    content_hash : bool
        Fingerprint the files' bytes instead of their sizes and modification times.
    """

    def __init__(self, root: str | os.PathLike[str], name: str | None = None, image_column: str = "image",
                 label_column: str = "label", class_names: list[str] | None = None,
                 splits: list[str] | tuple[str, ...] | None = None, mean_per_class: bool = False,
                 content_hash: bool = False) -> None:
        root_path = Path(root).expanduser()
        super().__init__(name if name is not None else root_path.resolve().name, mean_per_class)
        if not root_path.is_dir():
            raise DatasetError(f"hf: root folder {str(root_path)!r} does not exist")
        self.root, self.image_column, self.label_column = root_path, image_column, label_column
        self.content_hash = bool(content_hash)
        found = find_data_files(root_path)
        if splits is None:
            splits = sorted(found)
        missing = [s for s in splits if s not in found]
        if missing:
            raise DatasetError(f"hf: {str(root_path)!r} has no split {missing[0]!r}; splits: {', '.join(sorted(found))}")
        self.splits = validate_splits(list(splits), self.name)
        self._files = {s: found[s] for s in self.splits}
        raw = {s: self._raw_labels(s) for s in self.splits}
        self.class_names = self._class_names(raw, class_names)
        self._labels = {s: self._to_indices(s, raw[s]) for s in self.splits}
        self._stats = {s: stat_files(str(root_path), self._files[s])[0] for s in self.splits}
        self._offsets = {s: np.cumsum([0] + [len(part) for part in raw[s]]) for s in self.splits}
        self._tables: dict[str, Any] = {}

    def _raw_labels(self, split: str) -> list[np.ndarray]:
        parts = []
        for file in self._files[split]:
            columns = read_schema(self.root / file).names
            for column in (self.image_column, self.label_column):
                if column not in columns:
                    raise DatasetError(f"hf: {str(self.root / file)!r} has no column {column!r}; columns: "
                                       f"{', '.join(columns)}")
            table = open_table(self.root / file, [self.label_column])
            parts.append(table.column(0).to_numpy(zero_copy_only=False))
        if not parts or sum(len(p) for p in parts) == 0:
            raise DatasetError(f"hf: split {split!r} of {str(self.root)!r} has no rows")
        return parts

    def _class_names(self, raw: dict[str, list[np.ndarray]], given: list[str] | None) -> list[str]:
        first = self.root / self._files[self.splits[0]][0]
        feature = _features(first).get(self.label_column, {})
        if given is not None:
            names = [str(c) for c in given]
        elif isinstance(feature, dict) and feature.get("names"):
            names = [str(c) for c in feature["names"]]
        elif all(p.dtype.kind in "iu" for parts in raw.values() for p in parts):
            names = [str(k) for k in range(int(max(p.max() for parts in raw.values() for p in parts)) + 1)]
        else:
            names = sorted({str(v) for parts in raw.values() for p in parts for v in p})
        if len(set(names)) != len(names):
            raise DatasetError(f"hf: class names repeat: {names[:10]}")
        return names

    def _to_indices(self, split: str, parts: list[np.ndarray]) -> np.ndarray:
        index = {c: k for k, c in enumerate(self.class_names)}
        out = []
        for file, values in zip(self._files[split], parts):
            if values.dtype.kind in "iu":
                labels = values.astype(np.int64)
                bad = np.flatnonzero((labels < 0) | (labels >= len(self.class_names)))
                shown = labels[bad[0]] if bad.size else None
            else:
                labels = np.array([index.get(str(v), -1) for v in values], dtype=np.int64)
                bad = np.flatnonzero(labels < 0)
                shown = values[bad[0]] if bad.size else None
            if bad.size:
                raise DatasetError(f"hf: {str(self.root / file)!r} row {bad[0]}: unknown class index {shown!r} in "
                                   f"column {self.label_column!r} ({len(self.class_names)} classes)")
            out.append(labels)
        return np.concatenate(out)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tables"] = {}  # reopened (memory-mapped) in each worker process
        return state

    def labels(self, split: str) -> np.ndarray:
        return self._labels[self.check_split(split)].copy()

    def sample_ids(self, split: str) -> list[str]:
        n = len(self._labels[self.check_split(split)])
        return [str(i).zfill(len(str(n - 1))) for i in range(n)]

    def load_image(self, split: str, i: int) -> Image.Image:
        offsets = self._offsets[self.check_split(split)]
        if not 0 <= i < offsets[-1]:
            raise IndexError(f"Sample {i} out of range for split {split!r} of {self.name!r} ({offsets[-1]} samples)")
        part = int(np.searchsorted(offsets, i, side="right")) - 1
        file = self._files[split][part]
        if file not in self._tables:
            self._tables = {file: open_table(self.root / file, [self.image_column])}  # one file open at a time
        value = self._tables[file].column(0)[i - int(offsets[part])].as_py()
        where = f"row {i - int(offsets[part])} of {str(self.root / file)!r}"
        if isinstance(value, dict):
            value = value.get("bytes") or value.get("path")
        if isinstance(value, (bytes, bytearray)):
            return decode_rgb(io.BytesIO(value), where)
        if isinstance(value, str) and value:
            return decode_rgb(self.root / value, f"{where} ({value!r})")
        raise CorruptImageError(f"Cannot decode {where}: column {self.image_column!r} holds no image")

    def fingerprint(self, split: str) -> str:
        """Class names, labels, columns and the data files' sizes and times (or bytes).

        Parameters
        ----------
        split : str

        Returns
        -------
        str
            Hexadecimal SHA-256.
        """
        self.check_split(split)
        return self._file_fingerprint(split, str(self.root), self._files[split], self._stats[split],
                                      self._files[split], self._labels[split], [self.image_column, self.label_column])

    def describe(self) -> dict[str, Any]:
        return {**self._base_description(), "root": str(self.root), "image_column": self.image_column,
                "label_column": self.label_column, "content_hash": self.content_hash}
