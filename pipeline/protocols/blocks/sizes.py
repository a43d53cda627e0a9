"""Block sizes: how many feature rows one block holds on a device."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

__all__ = ["BLOCK_BYTES", "STREAM_BLOCK_ROWS", "Blocks", "block_rows"]

#: A callable returning an iterable of (row block, row offset) pairs, in any order.
Blocks = Callable[[], Iterable[tuple[np.ndarray, int]]]

#: Bytes of one float block per device type: large enough for efficient products, small
#: next to the features (the O(1) term of every protocol's memory).
BLOCK_BYTES = {"cpu": 4 << 20, "cuda": 256 << 20}
#: Rows per block when train features are streamed from storage (a caller's default).
STREAM_BLOCK_ROWS = 8192


def block_rows(n_cols: int, device: Any = None, itemsize: int = 8, budget: int | None = None) -> int:
    """Rows of a block whose (rows x n_cols) matrix of ``itemsize`` bytes fits the budget.

    Parameters
    ----------
    n_cols : int
        Width of the widest per-block matrix (features, classes or scores).
    device : torch.device or None
        The compute device (a GPU gets larger blocks); None: the CPU.
    itemsize : int
        Bytes per element.
    budget : int or None
        Bytes per block; None: the device's default.

    Returns
    -------
    int
        At least 1.
    """
    kind = getattr(device, "type", "cpu")
    budget = BLOCK_BYTES.get(kind, BLOCK_BYTES["cpu"]) if budget is None else budget
    return max(256, budget // max(1, n_cols * itemsize))

