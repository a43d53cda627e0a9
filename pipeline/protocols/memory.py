"""The memory model of one cell, written from named parts: what an entry's ``memory`` adds up."""

from __future__ import annotations

from pipeline.protocols.blocks import BLOCK_BYTES, STREAM_BLOCK_ROWS
from pipeline.protocols.cell import CellShape

__all__ = ["ADAMW_COPIES", "BLOCK", "F4", "F8", "RUNTIME", "SGD_COPIES", "TRAINING_RUNTIME", "feature_rows",
           "features", "indices", "labels", "lbfgs_copies", "matrix", "parameters", "peak", "row_blocks",
           "transform_state", "work"]

F8 = 8  # float64 / int64 bytes
F4 = 4  # float32 bytes
BLOCK = BLOCK_BYTES["cpu"]  # bytes of one row block on the CPU
RUNTIME = 32 << 20  # allocator and library slack of one run
TRAINING_RUNTIME = 64 << 20  # the same for a run that trains a torch head (autograd, its allocator's cache)
#: Copies of each parameter under AdamW: the parameter, its gradient and the two moments.
ADAMW_COPIES = 4
#: Copies of each parameter under SGD with momentum as the dense heads train: the weights,
#: their gradient, the momentum, the saved state's copy and its serialised bytes.
SGD_COPIES = 5


def lbfgs_copies(history: int) -> int:
    """Copies of each parameter L-BFGS holds: its ``history`` (s, y) pairs and the snapshot a
    penalty's path restarts from (4 per pair), and 16 work vectors (iterate, gradient,
    direction, the line search's trials)."""
    return 4 * history + 16


def features(c: CellShape, streams: bool) -> int:
    """The feature block: every split as given, or all but the train split plus the stored
    blocks in flight (two blocks of ``STREAM_BLOCK_ROWS`` rows) for an entry that streams it."""
    train = min(c.n_train, 2 * STREAM_BLOCK_ROWS) if streams else c.n_train
    return (train + c.n_test + c.n_val) * c.n_tokens * c.dim * c.itemsize


def feature_rows(rows: int, c: CellShape, copies: int = 0, itemsize: int = F4) -> int:
    """``rows`` feature rows in the stored dtype (a cache, a subsample), plus ``copies`` of
    them in ``itemsize`` bytes a value (a float32 or float64 working copy)."""
    return rows * c.n_tokens * c.dim * (c.itemsize + copies * itemsize)


def labels(c: CellShape) -> int:
    """The labels of every split and a copy of them (int64)."""
    return (c.n_train + c.n_test + c.n_val) * F8 * 2


def parameters(n_values: int, copies: int = 1, itemsize: int = F4) -> int:
    """A model's ``n_values`` parameters, each held ``copies`` times (an optimiser's count)."""
    return n_values * copies * itemsize


def matrix(rows: int, cols: int, copies: int = 1, itemsize: int = F8) -> int:
    """A ``rows`` x ``cols`` array (scores, logits, a Gram matrix, projections), ``copies`` of it."""
    return rows * cols * copies * itemsize


def indices(n: int, arrays: int = 1) -> int:
    """``arrays`` int64 arrays of ``n`` positions (targets, splits, permutations, predictions)."""
    return n * arrays * F8


def transform_state(c: CellShape, name: str | None) -> int:
    """What the fitted ``transform`` ``name`` holds while it is fitted and applied
    (``pipeline.protocols.transforms``): ``whiten`` the d x d covariance, its eigenvectors,
    the eigendecomposition's work and the map (float64, 6 copies); ``standardize`` the mean,
    the scale and their sums (d values, 4 copies); ``none`` and ``l2`` nothing."""
    copies = {"whiten": (c.dim, 6), "standardize": (1, 4)}.get(name)
    return 0 if copies is None else matrix(copies[0], c.dim, copies=copies[1])


def row_blocks(count: int) -> int:
    """``count`` row blocks of the CPU's block size (the blocked passes over rows)."""
    return count * BLOCK


def work(elements: int, copies: int = 1, itemsize: int = F4) -> int:
    """A chunk of work of a fixed number of ``elements`` (a score chunk, a minibatch), ``copies`` of it."""
    return elements * copies * itemsize


def peak(**parts: int) -> int:
    """The peak bytes of one cell: the sum of its named parts."""
    for name, value in parts.items():
        if int(value) != value or value < 0:
            raise ValueError(f"memory part {name!r} is {value!r}, not a number of bytes")
    return int(sum(parts.values()))
