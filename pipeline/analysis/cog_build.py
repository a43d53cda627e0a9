"""Reading ImageNet-21K's metadata files and writing the CoG levels (``pipeline.analysis.cog`` holds the maths)."""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from pipeline.analysis.cog import MAX_TRAIN, N_TEST, CogLevels, check_sizes, cog_levels, sample_images
from pipeline.datasets.base import IMAGE_EXTENSIONS
from pipeline.errors import DatasetError

__all__ = ["build_cog_levels", "parse_counts", "parse_is_a", "parse_synsets", "parse_words"]


# ---------------------------------------------------------------- parsing (lines in, values out)

def _fields(lines: Iterable[str], source: str, n: int | None) -> Iterable[tuple[int, list[str]]]:
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.replace(",", " ").split() if n is not None else line.split(None, 1)
        if n is not None and len(parts) != n:
            raise DatasetError(f"{source}:{number}: expected {n} fields, got {len(parts)}: {line[:80]!r}")
        yield number, parts


def parse_is_a(lines: Iterable[str], source: str = "is_a") -> list[tuple[str, str]]:
    """(parent, child) pairs from lines ``parent child`` (ImageNet's ``wordnet.is_a.txt``)."""
    return [(p[0], p[1]) for _, p in _fields(lines, source, 2)]


def parse_words(lines: Iterable[str], source: str = "words") -> dict[str, str]:
    """Synset id -> its words, from lines ``id<whitespace>words`` (ImageNet's ``words.txt``)."""
    return {p[0]: (p[1] if len(p) > 1 else "") for _, p in _fields(lines, source, None)}


def parse_counts(lines: Iterable[str], source: str = "counts") -> dict[str, int]:
    """Synset id -> number of images, from lines ``id count`` (space, tab or comma)."""
    counts = {}
    for number, (wnid, value) in _fields(lines, source, 2):
        if not value.isdigit():
            raise DatasetError(f"{source}:{number}: image count {value!r} of {wnid} is not a non-negative integer")
        counts[wnid] = int(value)
    return counts


def parse_synsets(lines: Iterable[str], source: str = "synsets") -> list[str]:
    """Synset ids, the first field of each line (a plain list or ``id words`` lines)."""
    return [p[0] for _, p in _fields(lines, source, None)]


# ---------------------------------------------------------------- files

def _read_lines(path: str | os.PathLike[str], what: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read the {what} file {str(path)!r}: {exc}") from None


def _image_files(images_root: Path, concept: str) -> list[str]:
    folder = images_root / concept
    if not folder.is_dir():
        raise DatasetError(f"no image folder for concept {concept}: {str(folder)!r} is not a directory")
    return [str(p) for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")]


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Write to a temporary file beside ``path``, then rename: never a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(header)
            writer.writerows(rows)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_cog_levels(is_a: str | os.PathLike[str], words: str | os.PathLike[str], counts: str | os.PathLike[str],
                     seen: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                     images_root: str | os.PathLike[str] | None = None,
                     excluded: Sequence[str | os.PathLike[str]] = (), *, seed: int = 0, n_test: int = N_TEST,
                     max_train: int = MAX_TRAIN, **level_options: object) -> CogLevels:
    """Read the ImageNet-21K metadata files, build the levels and write them to ``out_dir``."""
    check_sizes(seed=(seed, 0), n_test=(n_test, 1), max_train=(max_train, 1))
    edges = parse_is_a(_read_lines(is_a, "is_a"), str(is_a))
    names = parse_words(_read_lines(words, "words"), str(words))
    image_counts = parse_counts(_read_lines(counts, "counts"), str(counts))
    seen_ids = parse_synsets(_read_lines(seen, "seen synsets"), str(seen))
    dropped_ids = [c for path in excluded for c in parse_synsets(_read_lines(path, "excluded"), str(path))]
    result = cog_levels(edges, image_counts, seen_ids, dropped_ids, **level_options)
    splits: dict[str, tuple[list[str], list[str]]] = {}
    if images_root is not None:  # every folder is checked before anything is written
        root = Path(images_root)
        for level in result.levels:
            for c in level:
                splits[c] = sample_images(_image_files(root, c), c, seed, n_test, max_train)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = result.level_summary()
    for k, (level, row) in enumerate(zip(result.levels, summary), start=1):
        if splits:
            rows = [(os.path.relpath(f, out), c, split) for c in level
                    for split, files in zip(("train", "test"), splits[c]) for f in files]
            _write_csv(out / f"level_{k}.csv", ("path", "label", "split"), rows)
            row.update(n_train_images=sum(len(splits[c][0]) for c in level),
                       n_test_images=sum(len(splits[c][1]) for c in level))
    _write_csv(out / "concepts.csv", ("level", "concept", "words", "similarity", "nearest_seen",
                                      "nearest_seen_words", "images", "train", "test"),
               [(k, c, names.get(c, ""), repr(result.similarity[c]), result.nearest_seen[c] or "",
                 names.get(result.nearest_seen[c] or "", ""), image_counts[c],
                 len(splits[c][0]) if splits else "", len(splits[c][1]) if splits else "")
                for k, level in enumerate(result.levels, start=1) for c in level])
    _write_csv(out / "summary.csv", list(summary[0]), [list(r.values()) for r in summary])
    return CogLevels(result.levels, result.similarity, result.nearest_seen, result.eligible, result.dropped,
                     summary)
