"""Nothing the project ships sends a reader to a file it does not hold.

Design notes kept outside the repository (``PROTOCOLS.md``, ``ARCHITECTURE.md``,
``STYLE.md``, anything under ``../shared``) are not shipped, so code, docstrings, comments,
README, docs/ and the report must explain in their own words. Paths into the repository
(``benchmarks/bench_cli.py``, ``docs/store.md``), markdown file names and relative markdown
links must name files that exist. The report's generated text is checked by
``tests/jobs/test_report.py`` with the same function.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.code import REPO
from tests.helpers.docs import dead_references

SCANNED_FOLDERS = ("pipeline", "storage_schema", "jobs", "flows", "benchmarks", "docs", "docker", "tests")
SCANNED_FILES = ("README.md", "Makefile", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".md", ".html", ".j2", ".txt", ".yaml", ".yml", ".toml", ".css", ".js", ".cfg", ".example"}
# Files that must spell the forbidden names to look for them.
CHECKERS = {Path(__file__).resolve(), (REPO / "tests" / "helpers" / "docs.py").resolve()}


def _shipped() -> list[Path]:
    files = [REPO / f for f in SCANNED_FILES if (REPO / f).is_file()]
    for folder in SCANNED_FOLDERS:
        files += [p for p in sorted((REPO / folder).rglob("*")) if p.is_file() and p.suffix in TEXT_SUFFIXES
                  and "__pycache__" not in p.parts and p.resolve() not in CHECKERS]
    return files


@pytest.mark.parametrize("path", _shipped(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_reference_to_a_missing_file(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    dead = list(dead_references(text, str(path.relative_to(REPO)), path.parent if path.suffix == ".md" else None))
    assert not dead, "references to files the repository does not hold:\n" + "\n".join(map(str, dead))


def test_the_check_finds_each_kind_of_dead_reference(tmp_path):
    text = ("Defaults follow PROTOCOLS.md section 8.\n"
            "see ../shared/design/STYLE.md\n"
            "timed by benchmarks/bench_nothing.py and docs/store.md\n"
            "[layout](docs/missing.md), [store](store.md), [web](https://example.org/x.md), [top](#top)\n"
            "keys like _repeval/state/<key>/chunks/<i> and features/<model>/... are not files\n"
            "docker/.env (made by the user), tests/code/test_*.py (a glob that matches), tests/nothing_*.py\n"
            "the old NOTES.md\n")
    found = [(d.line, d.text) for d in dead_references(text, "sample.md", REPO / "docs")]
    assert found == [(1, "PROTOCOLS.md"), (2, "STYLE.md"), (2, "../shared"), (2, "shared/design"),
                     (3, "benchmarks/bench_nothing.py"), (4, "docs/missing.md"), (4, "docs/missing.md"),
                     (6, "tests/nothing_*.py"), (7, "NOTES.md")]
