"""A publisher's layout on disk: class folders, text lists, the files and folders it must
hold, and the helpers adapters use to turn them into labelled listings."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.datasets.base import IMAGE_EXTENSIONS
from pipeline.errors import DatasetError


def is_image_name(name: str) -> bool:
    """A visible file with an image extension (case-insensitive)."""
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def scan_class_folders(directory: Path, what: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Class folders of ``directory`` (sorted) and every image below them."""
    # Images may sit in sub-folders of a class folder. Hidden entries and non-images are
    # ignored.
    if not directory.is_dir():
        raise DatasetError(f"{what}: folder {str(directory)!r} does not exist")
    classes = sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DatasetError(f"{what}: {str(directory)!r} has no class folders")
    rows: list[tuple[str, str]] = []
    for cls in classes:
        stack = [cls]
        while stack:
            rel = stack.pop()
            with os.scandir(directory / rel) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    if entry.is_dir():
                        stack.append(f"{rel}/{entry.name}")
                    elif is_image_name(entry.name):
                        rows.append((f"{rel}/{entry.name}", cls))
    return classes, rows


def read_lines(path: Path, what: str) -> list[str]:
    """Non-empty, stripped lines of a text file; a missing file is named."""
    if not path.is_file():
        raise DatasetError(f"{what}: file {str(path)!r} is missing")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{what}: cannot read {str(path)!r} as UTF-8 text: {exc}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def under(root: Path, base: Path) -> str:
    """``base`` relative to ``root`` as a prefix for listed files ("." for the root)."""
    return base.relative_to(root).as_posix()


def require_file(path: Path, what: str) -> Path:
    """``path``, or a DatasetError naming it when it is not a file."""
    if not path.is_file():
        raise DatasetError(f"{what}: file {str(path)!r} is missing")
    return path


def require_dir(path: Path, what: str) -> Path:
    """``path``, or a DatasetError naming it when it is not a folder."""
    if not path.is_dir():
        raise DatasetError(f"{what}: folder {str(path)!r} is missing")
    return path


def class_index(names: Sequence[str], what: str) -> dict[str, int]:
    """Class name -> index in ``names``; a repeated name is a DatasetError."""
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if list(names).count(n) > 1})
        raise DatasetError(f"{what}: class names repeat: {dup[:5]}")
    return {n: k for k, n in enumerate(names)}


def stratified_pick(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Boolean mask choosing ``per_class`` samples of every class at random (seeded);
    a class with fewer samples gives all of them."""
    rng = np.random.default_rng(seed)
    chosen = np.zeros(len(labels), dtype=bool)
    for k in np.unique(labels):
        members = np.flatnonzero(labels == k)
        chosen[rng.permutation(members)[:per_class]] = True
    return chosen


def locate(root: Path, marker: str, prefixes: Sequence[str], what: str) -> Path:
    """The folder under ``root`` (one of ``prefixes``, tried in order) that holds ``marker``;
    when none does, the error names the file expected at the first prefix."""
    for prefix in prefixes:
        if (root / prefix / marker).exists():
            return (root / prefix) if prefix not in ("", ".") else root
    also = [str(Path(p) / marker) for p in prefixes[1:]]
    alternatives = f" (looked also for {', '.join(repr(a) for a in also)} under the root)" if also else ""
    raise DatasetError(f"{what}: {str(root / prefixes[0] / marker)!r} is missing{alternatives}")
