"""Validation of names that become parts of store keys."""

from __future__ import annotations

import re

from pipeline.errors import InvalidNameError

# Letters, digits and a few separators; no '/', '\\', control characters or leading dot.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@-]*$")
MAX_NAME_LENGTH = 200


def validate_name(name: object, what: str = "name") -> str:
    """Return ``name`` if it is safe as one store key component, else raise InvalidNameError."""
    # Refused: non-strings, empty names, path separators, ``.``/``..``, control characters,
    # a leading dot (hidden files, zarr's own metadata) and names over 200 characters.
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} must be a string, got {type(name).__name__}: {name!r}")
    if not name:
        raise InvalidNameError(f"{what} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(f"{what} {name[:40]!r}... is {len(name)} characters; at most {MAX_NAME_LENGTH}")
    if name in (".", "..") or "/" in name or "\\" in name:
        raise InvalidNameError(f"{what} {name!r} is path-like; use letters, digits and _ . + = @ -")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidNameError(f"{what} {name!r} contains control characters")
    if not _NAME_RE.match(name):
        raise InvalidNameError(
            f"{what} {name!r} is not allowed: use letters, digits and _ . + = @ - "
            "(not starting with '.', '+', '=', '@' or '-')"
        )
    return name
