"""What was read from a checkpoint file once (its training step, its content fingerprint),
remembered by the file's real path, size and modification time.

A folder scan reads every file's step (from its metadata when its name carries none) and
compares unnumbered files with numbered ones by their tensors; both need torch and read
the files. An unchanged folder gives the same answers, so a run keeps them
(``jobs.checkpoint_facts`` stores them in the store) and the next scan, a rerun with
nothing to do included, reads no file and imports no torch. A rewritten file has another
size or modification time: it is read again. Importing this module imports no torch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["export_facts", "load_facts", "recall", "remember"]

_FACTS: dict[str, dict[str, Any]] = {}  # "<real path>|<size>|<mtime_ns>" -> {what: value}
_LOCK = threading.Lock()
_LIMIT = 4096  # files remembered at most (the oldest are forgotten first)


def _key(path: str | os.PathLike[str]) -> str | None:
    try:
        real = Path(path).resolve()
        st = real.stat()
    except OSError:
        return None
    return f"{real}|{st.st_size}|{st.st_mtime_ns}"


def recall(path: str | os.PathLike[str], what: str) -> tuple[bool, Any]:
    """(whether it is remembered, the value) of fact ``what`` (``step``, ``content``) of the
    file as it is now.

    Parameters
    ----------
    path : str or path
        A checkpoint file.
    what : str
        The fact's name.

    Returns
    -------
    (bool, object)
    """
    key = _key(path)
    with _LOCK:
        facts = _FACTS.get(key) if key else None
        return (True, facts[what]) if facts is not None and what in facts else (False, None)


def remember(path: str | os.PathLike[str], what: str, value: Any) -> None:
    """Remember fact ``what`` of the file as it is now (JSON-able ``value``).

    Parameters
    ----------
    path : str or path
    what : str
    value : object
    """
    key = _key(path)
    if key is None:
        return
    with _LOCK:
        if key not in _FACTS and len(_FACTS) >= _LIMIT:
            del _FACTS[next(iter(_FACTS))]
        _FACTS.setdefault(key, {})[what] = value


def export_facts() -> dict[str, dict[str, Any]]:
    """Every remembered fact, to be stored.

    Returns
    -------
    dict
        A copy: key of the file as it was -> its facts.
    """
    with _LOCK:
        return {k: dict(v) for k, v in _FACTS.items()}


def load_facts(entries: Mapping[str, Mapping[str, Any]]) -> None:
    """Take facts stored by an earlier process (those already known here are kept).

    Parameters
    ----------
    entries : mapping
        What :func:`export_facts` gave.
    """
    with _LOCK:
        for key, facts in entries.items():
            if isinstance(facts, Mapping) and (key in _FACTS or len(_FACTS) < _LIMIT):
                _FACTS[str(key)] = {**facts, **_FACTS.get(str(key), {})}
