"""Reading the project's markdown docs (sections, tables, values) and finding dead references."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.helpers.code import REPO

DOCS = REPO / "docs"


def sections(path: Path, level: int = 2) -> dict[str, str]:
    """Heading text -> body (up to the next heading of this level or above) of a markdown file.

    Lines inside fenced code blocks are never headings.
    """
    out: dict[str, list[str]] = {}
    current = None
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"^(#+) (.*)$", line)
        if match and len(match.group(1)) <= level:
            current = match.group(2).strip() if len(match.group(1)) == level else None
            if current is not None:
                out[current] = []
            continue
        if current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def table_rows(body: str) -> list[list[str]]:
    """The data rows of every markdown table in ``body``, as stripped cells (header and rule skipped)."""
    rows, in_table = [], False
    for line in body.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in _split_row(line)]
        if not in_table:  # the header row
            in_table = True
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue
        rows.append(cells)
    return rows


def _split_row(line: str) -> list[str]:
    """Cells of a table row; a ``|`` inside backticks belongs to its cell."""
    cells, cell, code = [], [], False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append("".join(cell))
            cell = []
        else:
            cell.append(ch)
    cells.append("".join(cell))
    return cells


def first_code(cell: str) -> str | None:
    """The first backticked text of a cell (the setting, field or option it documents)."""
    match = re.search(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def unquote(cell: str) -> str:
    """A cell without surrounding backticks."""
    cell = cell.strip()
    return cell[1:-1] if len(cell) > 1 and cell.startswith("`") and cell.endswith("`") and cell.count("`") == 2 \
        else cell


def parse_value(cell: str, yaml_syntax: bool = False):
    """The value a docs cell writes (``0.07``, ``1e-4``, ``true``, ``[1, "all"]``, ``cosine``).

    Python literal syntax first (docs write ``1e-4``, which YAML 1.1 reads as text), then
    YAML (``[pre_logits]``, ``{train: 200}``), else the text itself.
    """
    text = unquote(cell)
    lowered = {"true": True, "false": False, "null": None}
    if text.lower() in lowered:
        return lowered[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    if yaml_syntax:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            pass
    return text


def same_value(documented, actual) -> bool:
    """Whether a documented default equals the real one (lists and tuples alike, 1 == 1.0)."""
    if isinstance(actual, (list, tuple)) and isinstance(documented, (list, tuple)):
        return len(actual) == len(documented) and all(same_value(d, a) for d, a in zip(documented, actual))
    if isinstance(actual, bool) or isinstance(documented, bool):
        return documented is actual
    if isinstance(actual, (int, float)) and isinstance(documented, (int, float)):
        # 1e-5 as written equals np.logspace's 9.999999999999999e-06
        return math.isclose(float(documented), float(actual), rel_tol=1e-12, abs_tol=0.0)
    return documented == actual


# -- references to files -----------------------------------------------------------------------

#: Engineering notes kept outside the repository: nothing shipped may send a reader to them.
OUTSIDE_NOTES = ("PROTOCOLS.md", "ARCHITECTURE.md", "STYLE.md", "/work/shared", "../shared", "shared/design")
#: Top-level folders of the repository: a path starting with one of them must exist.
REPO_FOLDERS = ("pipeline", "storage_schema", "jobs", "flows", "benchmarks", "tests", "docs", "docker")
_REPO_PATH = re.compile(r"(?<![\w./\-<{])((?:%s)/[\w./\-]*[\w/])([*?][\w.*?]*)?" % "|".join(REPO_FOLDERS))
#: Files a user creates from a shipped template (``cp docker/env.example docker/.env``).
CREATED_BY_USERS = ("docker/.env",)
_MARKDOWN_NAME = re.compile(r"(?<![\w./\-])([\w\-]+\.md)\b")
_MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class DeadReference:
    """A reference to a file that the repository does not hold."""

    where: str
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.text!r} ({self.why})"


def _markdown_names() -> set[str]:
    return {p.name for p in REPO.rglob("*.md") if ".venv" not in p.parts and ".git" not in p.parts}


def dead_references(text: str, where: str, base: Path | None = None) -> Iterator[DeadReference]:
    """References in ``text`` to files that are not in the repository.

    Parameters: ``where`` names the text in messages; ``base`` is the folder relative
    markdown links start from (a markdown file's own folder), or None for non-markdown.
    """
    names = None
    for number, line in enumerate(text.splitlines(), 1):
        for note in OUTSIDE_NOTES:
            if note in line:
                yield DeadReference(where, number, note, "a note outside the repository")
        for path, glob in _REPO_PATH.findall(line):
            if path in CREATED_BY_USERS:
                continue
            found = any(REPO.glob(path + glob)) if glob else (REPO / path.rstrip("/.")).exists()
            if not found:
                yield DeadReference(where, number, path + glob, "no such file or folder in the repository")
        for name in _MARKDOWN_NAME.findall(line):
            names = _markdown_names() if names is None else names
            if name not in names and name not in OUTSIDE_NOTES:
                yield DeadReference(where, number, name, "no markdown file of that name in the repository")
        if base is None:
            continue
        for target in _MARKDOWN_LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor
            if not (base / target.split("#", 1)[0]).exists():
                yield DeadReference(where, number, target, "markdown link to a missing file")
