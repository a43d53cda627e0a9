"""What every protocol family's memory model of one cell is built from, from the shapes alone.

Each family's ``protocols`` module declares its protocols' models beside their entries;
each adds up what its protocol holds at its peak: the features given to it (the train
split only when it does not stream it: a streaming protocol holds one stored block at a
time, :func:`held`), the labels (:func:`label_bytes`), the terms that grow with the
classes and the width but not with the rows (d x d Gram or covariance matrices, K x d
parameters, L-BFGS pairs), a few row blocks of bounded size and the run's slack
(:data:`RUNTIME`). The models follow the implementations; the memory tests check each
against a measured peak. They are for scheduling: a little high rather than low.
"""

from __future__ import annotations

from pipeline.protocols.blocks import BLOCK_BYTES, STREAM_BLOCK_ROWS
from pipeline.protocols.cell import CellShape

__all__ = ["BLOCK", "F4", "F8", "RUNTIME", "held", "label_bytes"]

F8 = 8  # float64 / int64 bytes
F4 = 4  # float32 bytes
BLOCK = BLOCK_BYTES["cpu"]  # bytes of one row block on the CPU
RUNTIME = 32 << 20  # allocator and library slack of one run


def held(c: CellShape, streams: bool) -> int:
    """Features in memory: every split, or all but the train split plus one streamed block.

    Parameters
    ----------
    c : CellShape
    streams : bool
        The protocol streams the train split.

    Returns
    -------
    int
    """
    train = min(c.n_train, 2 * STREAM_BLOCK_ROWS) if streams else c.n_train
    return (train + c.n_test + c.n_val) * c.n_tokens * c.dim * c.itemsize


def label_bytes(c: CellShape) -> int:
    """The labels of every split and a copy of them (int64).

    Parameters
    ----------
    c : CellShape

    Returns
    -------
    int
    """
    return (c.n_train + c.n_test + c.n_val) * F8 * 2
