"""Walking the repository's source files for the code-rule tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "storage_schema", "jobs", "flows")
SOURCE_DIRS = (*PACKAGES, "benchmarks")


def python_files(folder: str) -> Iterator[Path]:
    """Every ``.py`` file under a top-level folder of the repository, sorted."""
    yield from sorted((REPO / folder).rglob("*.py"))


def module_name(path: Path) -> str:
    """The dotted module name of a file of the repository (``pipeline.encoders`` for its __init__)."""
    parts = list(path.resolve().relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)
