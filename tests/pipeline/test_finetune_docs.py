"""The settings tables of docs/finetune.md and docs/diagnostics.md list exactly the fields
of the settings classes, in order, with their real defaults."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pipeline.diagnostics import InversionSettings, SaliencySettings
from pipeline.finetune import FinetuneSettings

DOCS = Path(__file__).resolve().parents[2] / "docs"
_ROW = re.compile(r"^\| `(\w+)` \| ([^|]+) \|")


def _tables(path: Path) -> list[list[tuple[str, str]]]:
    """Every settings table of ``path``: lists of (name, default cell)."""
    tables, current = [], None
    for line in path.read_text().splitlines():
        if line.startswith("| setting | default | range / choices | meaning |"):
            current = []
            tables.append(current)
        elif current is not None and line.startswith("|"):
            match = _ROW.match(line)
            if match:
                current.append((match.group(1), match.group(2).strip()))
        else:
            current = None
    return tables


def _parse(cell: str):
    cell = cell.replace("`", "").strip()
    if cell.startswith("("):
        items = [v.strip() for v in cell.strip("()").split(",") if v.strip()]
        return tuple(_parse(v) for v in items)
    try:
        return float(cell)
    except ValueError:
        return cell


def _same(documented, actual) -> bool:
    if isinstance(actual, tuple):
        return isinstance(documented, tuple) and len(documented) == len(actual) and all(
            _same(d, a) for d, a in zip(documented, actual))
    if isinstance(actual, (int, float)) and not isinstance(actual, bool):
        return isinstance(documented, float) and documented == pytest.approx(actual, rel=1e-12)
    return documented == actual


@pytest.mark.parametrize(("doc", "index", "cls"), [
    ("finetune.md", 0, FinetuneSettings),
    ("diagnostics.md", 0, SaliencySettings),
    ("diagnostics.md", 1, InversionSettings),
])
def test_settings_tables_match_the_classes(doc, index, cls):
    rows = _tables(DOCS / doc)[index]
    fields = dataclasses.fields(cls)
    assert [name for name, _ in rows] == [f.name for f in fields]
    for (name, cell), field in zip(rows, fields):
        assert _same(_parse(cell), field.default), f"{doc}: {name} documented as {cell}, default {field.default!r}"
