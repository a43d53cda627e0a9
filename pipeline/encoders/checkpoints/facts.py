"""What was read from a checkpoint file once (its training step, its content fingerprint),
remembered by the real file's name, size and modification time."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["export_facts", "load_facts", "recall", "remember"]

_FACTS: dict[str, dict[str, Any]] = {}  # "<real file name>|<size>|<mtime_ns>" -> {what: value}
_LOCK = threading.Lock()
_LIMIT = 4096  # files remembered at most (the oldest are forgotten first)


def _key(path: str | os.PathLike[str]) -> str | None:
    # the real file's name, size and modification time, not its folder: a folder moved or
    # mounted elsewhere (with its times, as cp -a and rsync -a keep them) is not read again
    try:
        real = Path(path).resolve()
        st = real.stat()
    except OSError:
        return None
    return f"{real.name}|{st.st_size}|{st.st_mtime_ns}"


def recall(path: str | os.PathLike[str], what: str) -> tuple[bool, Any]:
    """(whether it is remembered, the value) of fact ``what`` (``step``, ``content``) of the
    file as it is now."""
    key = _key(path)
    with _LOCK:
        facts = _FACTS.get(key) if key else None
        return (True, facts[what]) if facts is not None and what in facts else (False, None)


def remember(path: str | os.PathLike[str], what: str, value: Any) -> None:
    """Remember fact ``what`` of the file as it is now (JSON-able ``value``)."""
    key = _key(path)
    if key is None:
        return
    with _LOCK:
        if key not in _FACTS and len(_FACTS) >= _LIMIT:
            del _FACTS[next(iter(_FACTS))]
        _FACTS.setdefault(key, {})[what] = value


def export_facts() -> dict[str, dict[str, Any]]:
    """Every remembered fact, to be stored."""
    with _LOCK:
        return {k: dict(v) for k, v in _FACTS.items()}


def load_facts(entries: Mapping[str, Mapping[str, Any]]) -> None:
    """Take facts stored by an earlier process (those already known here are kept)."""
    with _LOCK:
        for key, facts in entries.items():
            if isinstance(facts, Mapping) and (key in _FACTS or len(_FACTS) < _LIMIT):
                _FACTS[str(key)] = {**facts, **_FACTS.get(str(key), {})}
