"""Parameters: an estimator's numeric parameters and hyperparameter grids, and the grids of
a protocol's settings (checked at config load, without numpy arrays or torch)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.errors import ConfigError

__all__ = ["GRID_MAX", "OPTIMIZER_MAX", "check_grid", "check_number", "check_setting_grid"]

#: Most values a protocol setting's hyperparameter list may hold (each is a network
#: trained at once).
GRID_MAX = 64
#: The largest learning rate or weight decay a torch-trained protocol takes: inside float32's
#: range (3.4e38), which torch's optimizers need of a step size (past it they fail in the
#: middle of training, with an error that names no setting); anything below it that makes
#: the weights overflow is a diverged fit, reported as such.
OPTIMIZER_MAX = 1e30


def _show(bound: float) -> str:
    """A range end as the message writes it: integers in full (2**32 - 1, not 4.29e+09)."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"


def check_number(value: Any, name: str, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False, integer: bool = False) -> Any:
    """Refuse an estimator parameter that is not a finite number in its range."""
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    # an int is finite however large (np.isfinite cannot take one beyond int64)
    ok = isinstance(value, kinds) and not isinstance(value, (bool, np.bool_)) and (
        isinstance(value, (int, np.integer)) or bool(np.isfinite(value)))
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        parts = [f"{'>' if low_open else '>='} {_show(low)}" if low is not None else "",
                 f"{'<' if high_open else '<='} {_show(high)}" if high is not None else ""]
        rule = " and ".join(p for p in parts if p)
        kind = "an integer" if integer else "a finite number"
        raise ConfigError(f"The '{name}' parameter must be {kind}{' ' + rule if rule else ''}; got {value!r}")
    return value


def check_grid(values: Any, name: str, low_open: bool, *, unique: bool = True) -> np.ndarray:
    """An estimator's hyperparameter grid, checked."""
    try:
        grid = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        grid = np.array([np.nan])
    bad = ~np.isfinite(grid) | ~(grid > 0 if low_open else grid >= 0)
    if grid.size == 0 or bad.any():
        rule = "> 0" if low_open else ">= 0"
        count = f": {grid.size} value(s), {int(bad.sum())} invalid" if bad.any() else ""
        raise ConfigError(f"{name} must be a non-empty list of finite numbers {rule}, got {values!r}{count}")
    return np.unique(grid) if unique else grid


def check_setting_grid(values: Any, name: str, positive: bool, high: float | None = None) -> None:
    """A protocol setting's list of 1 to ``GRID_MAX`` finite numbers (> 0 or >= 0, and at
    most ``high`` when given), as the config gives it (a list or tuple of plain numbers)."""
    rule = ("> 0" if positive else ">= 0") + (f" and <= {high:g}" if high is not None else "")
    ok = isinstance(values, (list, tuple)) and 0 < len(values) <= GRID_MAX and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
        and (high is None or v <= high) for v in values)
    if not ok:
        raise ConfigError(f"{name}={values!r} must be a list of 1 to {GRID_MAX} finite numbers {rule}")
