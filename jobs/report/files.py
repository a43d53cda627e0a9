"""Writing the report file: atomically, readable by the lab."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    # The temporary file is created with mode 0666 so the process's umask decides its
    # permissions, as for any file the user writes (mkstemp's 0600 would hide the report
    # from the lab); the umask itself is never changed.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
