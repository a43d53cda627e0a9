"""Text that is safe to print: the one place that escapes what data puts on a terminal."""

from __future__ import annotations

import reprlib
import sys
import time
import unicodedata
from typing import Any, TextIO

# Unicode format characters that reorder text or break lines (bidi overrides and isolates,
# marks, line and paragraph separators), beside the C0/C1 controls and DEL.
_INVISIBLE = frozenset("\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_KEPT_IN_TEXT = frozenset("\n\t\r")  # layout the program writes (progress bars rewrite with \r)
SHORT_LIMIT = 80


def _unsafe(c: str) -> bool:
    return c in _INVISIBLE or unicodedata.category(c) == "Cc"


def _escape(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: Any) -> str:
    """``str(value)`` with every control and reordering character escaped."""
    text = value if isinstance(value, str) else str(value)
    if not any(_unsafe(c) for c in text):
        return text
    return "".join(_escape(c) if _unsafe(c) else c for c in text)


def printable_text(text: str) -> str:
    """Like :func:`printable`, but keeping newlines, tabs and carriage returns."""
    if not any(_unsafe(c) and c not in _KEPT_IN_TEXT for c in text):
        return text
    return "".join(_escape(c) if _unsafe(c) and c not in _KEPT_IN_TEXT else c for c in text)


class _PrefixRepr(reprlib.Repr):
    """reprlib's bounded repr, but a long string keeps its start (what a reader recognises)."""

    def repr_str(self, x: str, level: int) -> str:
        return repr(x) if len(x) <= self.maxstring else repr(x[: self.maxstring]) + "..."


_REPR = _PrefixRepr()  # Python 3.11's Repr takes no arguments
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = SHORT_LIMIT, SHORT_LIMIT, 40


def short(value: Any, limit: int = SHORT_LIMIT) -> str:
    """A bounded, printable ``repr`` of ``value`` for an error message."""
    # Nested containers are cut by depth and length before they are formatted, so a YAML
    # alias bomb (a list of lists of a million items) costs nothing to quote.
    text = printable(_REPR.repr(value))
    return text if len(text) <= limit else text[: max(limit - 3, 1)] + "..."


class TerminalStream:
    """A text stream that passes everything written through :func:`printable_text`."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` with its control characters escaped."""
        self.stream.write(printable_text(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        """Write each line of ``lines``."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def say(reason: str, line: str) -> None:
    """A timestamped progress line on stderr, tagged with why the work runs (``run``)."""
    print(f"{time.strftime('%H:%M:%S')} [{printable(reason)}] {printable(line)}", file=sys.stderr, flush=True)
