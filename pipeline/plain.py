"""Dataclasses as plain values (dicts, lists, numbers, strings): what JSON, YAML, the
results ledger and Prefect's parameters hold."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["to_plain"]


def to_plain(obj: Any) -> Any:
    """``obj`` as plain values: a dataclass as the dict of its fields, any mapping as a
    dict with string keys (``str(key)``, as a ledger record has always written them),
    tuples as lists, NumPy arrays as (nested) lists and NumPy scalars as Python numbers,
    recursively; anything else as it is."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    np = sys.modules.get("numpy")  # not imported here: without numpy loaded there is no numpy value
    if np is not None and isinstance(obj, (np.ndarray, np.generic)):
        return obj.tolist()
    return obj
