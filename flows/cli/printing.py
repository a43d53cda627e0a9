"""What the commands print, in one place: aligned tables, JSON, progress lines and the
``repeval: ...`` lines on stderr, each value taken from data escaped."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from pipeline.terminal import printable, say

__all__ = ["LINE_LIMIT", "cut", "error_lines", "note", "print_json", "print_line", "print_table", "say"]

PROG = "repeval"
#: Most characters of one ``repeval: error:`` line: a value quoted whole (up to 4,096
#: characters in a config) is cut.
LINE_LIMIT = 1000


def print_table(rows: Sequence[dict], cols: Sequence[str]) -> None:
    """Rows as aligned columns under a header; every value printable (names from data may
    hold escapes)."""
    table = [[printable(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())


def print_json(value: Any, *, indent: int | None = None, default: Any = None) -> None:
    """``value`` as JSON on stdout (``--json``): one document, on one line unless ``indent``."""
    print(json.dumps(value, indent=indent, default=default))


def print_line(text: Any, *, err: bool = False) -> None:
    """One line with every control character escaped (a value from data cannot break it)."""
    print(printable(text), file=sys.stderr if err else sys.stdout)


def cut(line: str, limit: int = LINE_LIMIT) -> str:
    """A message line as printed: cut to ``limit`` characters, an ellipsis marking the cut."""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_lines(message: Any, kind: str = "error") -> None:
    """``repeval: <kind>: <line>`` on stderr for each line of ``message`` (a config's
    mistakes: one line each, all at once), each line cut to ``LINE_LIMIT``."""
    for line in str(message).splitlines() or [""]:
        print(f"{PROG}: {kind}: {cut(line)}", file=sys.stderr)


def note(message: str) -> None:
    """``repeval: <message>`` on stderr: what a command says besides its output (why it
    exits as it does, what it left out)."""
    print(f"{PROG}: {message}", file=sys.stderr)
