"""What reading one hostile input cost: Python memory at its peak, CPU seconds, files opened.

Memory is traced with ``tracemalloc`` (every Python object a reader builds: where a
self-referencing dict or an expanded alias would cost gigabytes); CPU time with
``time.process_time``, bounded generously (never a wall-clock assertion). Files opened are
seen through a Python audit hook (``open`` events), installed once per process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field

MB = 1 << 20


@dataclass
class Cost:
    """Filled in when the ``measured()`` block ends: peak traced bytes, CPU seconds, paths opened."""

    peak: int = 0
    cpu: float = 0.0
    opened: list[str] = field(default_factory=list)


_WATCHING: list[Cost] = []


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _WATCHING and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _WATCHING[-1].opened.append(os.fsdecode(args[0]))


_HOOKED = False


@contextlib.contextmanager
def measured() -> Iterator[Cost]:
    """Measure the block: ``with measured() as cost: ...`` then ``cost.peak``, ``cost.cpu``, ``cost.opened``."""
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    cost = Cost()
    tracemalloc.start()
    start = time.process_time()
    _WATCHING.append(cost)
    try:
        yield cost
    finally:
        _WATCHING.remove(cost)
        cost.cpu = time.process_time() - start
        cost.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
