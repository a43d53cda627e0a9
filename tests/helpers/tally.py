"""What every bad-input property checks, and the figures each family prints.

A bad input must raise a repeval error (a RepevalError subclass) whose message names the
offending field, file or value; any other exception is a traceback from deep inside a
library and fails the property. Whatever the input, the store tree must be unchanged.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from pathlib import Path

from pipeline.errors import RepevalError


def tree(root: Path) -> list[tuple[str, int]]:
    """Every file and folder under ``root`` with its size: a snapshot to compare."""
    if not root.exists():
        return []
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


class Tally:
    """Counts per family: inputs tried, clear errors, stores left unchanged."""

    def __init__(self) -> None:
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.kinds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def expect_error(self, family: str, call: Callable[[], object], names: Iterable[str] | None,
                     store: Path | None = None, kind: str = "") -> RepevalError:
        """Run ``call``; it must raise a RepevalError naming one of ``names`` (None: any
        message); the tree under ``store`` (when given) must be unchanged."""
        # each item of ``names`` is a string, or a tuple of strings that must all appear
        names = None if names is None else [n if isinstance(n, tuple) else str(n) for n in names if n]
        before = tree(store) if store is not None else None
        self.counts[family]["tried"] += 1
        try:
            call()
        except RepevalError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - any other type is the failure being looked for
            raise AssertionError(
                f"[{family}/{kind}] not a repeval error: {type(exc).__module__}.{type(exc).__name__}: {exc}"
            ) from exc
        else:
            raise AssertionError(f"[{family}/{kind}] bad input accepted (expected an error naming {names})")
        message = str(error)
        assert message and len(message) < 4000, f"[{family}/{kind}] empty or runaway message"

        def named(parts: tuple) -> bool:
            return all(part in message for part in parts)

        assert names is None or any(named(n) if isinstance(n, tuple) else n in message for n in names), (
            f"[{family}/{kind}] {type(error).__name__} does not name any of {names}: {message}")
        self.counts[family]["clear error"] += 1
        self.kinds[family][f"{kind or '-'} -> {type(error).__name__}"] += 1
        if store is not None:
            assert tree(store) == before, f"[{family}/{kind}] the store changed: {message}"
            self.counts[family]["nothing written"] += 1
        return error

    def report(self, family: str) -> str:
        c = self.counts[family]
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(self.kinds[family].items()))
        written = f", store unchanged {c['nothing written']}" if c["nothing written"] else ""
        written += f", ran fine {c['ran']}" if c["ran"] else ""
        return (f"{family}: {c['tried']} bad inputs tried, {c['clear error']} clear repeval errors{written} "
                f"[{kinds}]")
