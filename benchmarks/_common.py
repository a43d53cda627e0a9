"""Shared helpers of the benchmark scripts: thread limits, timing, tables, machine line.

Not a benchmark itself. The scripts put the repository root on ``sys.path`` before
importing this module, so they run as ``PYTHONPATH=. .venv/bin/python benchmarks/<script>.py``
and also without PYTHONPATH.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def limit_threads(n: int | None) -> str:
    """Give torch and every BLAS/OpenMP pool the same thread budget (None: leave defaults).

    Returns a description for the report. Both sides of every comparison run in this
    process, so they share whatever limit is set here.
    """
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    if n is not None:
        torch.set_num_threads(n)
        threadpool_limits(n)
    pools = sorted({f"{p['internal_api']}={p['num_threads']}" for p in threadpool_info()})
    return f"torch={torch.get_num_threads()}, " + ", ".join(pools)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def pair_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Ratio within each interleaved pair (run i of one side over run i of the other).

    On a shared machine the load drifts between pairs far more than within one; the
    median of the per-pair ratios is the robust summary, the ratio of the medians is
    printed beside it.
    """
    return [a / b for a, b in zip(numerators, denominators)]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def machine_line() -> str:
    import numpy
    import torch

    try:
        load = "load avg %.2f/%.2f/%.2f" % os.getloadavg()
    except OSError:
        load = "load avg n/a"
    return (f"{os.cpu_count()} cores (shared), {load}, Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, torch {torch.__version__}")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(_cell(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return "\n".join(out)


def print_tables(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]],
                 markdown: bool) -> None:
    print(f"\n{title}")
    print(plain_table(headers, rows))
    if markdown:
        print(f"\nMarkdown ({title}):\n")
        print(markdown_table(headers, rows))


def verdict(ratio: float, goal: float) -> str:
    return f"met (>= {goal:g}x)" if ratio >= goal else f"MISSED (< {goal:g}x)"


def proc_status_bytes(field: str) -> int:
    """VmRSS (current) or VmHWM (peak) of this process from /proc/self/status, in bytes.

    Not ru_maxrss: Linux keeps that across execve, so a subprocess would inherit the
    parent's peak. VmHWM belongs to the new address space and can be reset.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
