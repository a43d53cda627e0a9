"""The memory model of one cell, written from named parts: what an entry's ``memory`` adds up.

An entry's ``memory(c, settings)`` (``c`` a ``CellShape``) returns the peak host bytes of
one cell from the shapes alone, for scheduling: a little high rather than low. It composes
the parts below with :func:`peak`, one keyword per part, so each term says what it is::

    return peak(features=features(c, streams=True), labels=labels(c),
                gram=matrix(c.dim, c.dim, copies=6), scores=matrix(c.n_test, c.n_classes, itemsize=F4),
                blocks=row_blocks(10), runtime=RUNTIME)

The parts:

- the feature block, :func:`features`: every split given to the cell, or (an entry that
  ``streams_train``) every split but train plus the stored blocks in flight; a copy or a
  subsample of feature rows, :func:`feature_rows`;
- the labels, :func:`labels`;
- the model's parameters and its optimiser's state, :func:`parameters`, with ``copies``
  one of the optimisers' counts: :data:`ADAMW_COPIES`, :data:`SGD_COPIES`,
  :func:`lbfgs_copies`;
- arrays of a size set by the classes, the width or the test rows, not by the train rows:
  scores or logits (n x K), Gram or covariance matrices (d x d), projections,
  :func:`matrix`; int64 positions, targets, permutations, :func:`indices`;
- what a ``transform`` setting's fitted map holds, :func:`transform_state` (``whiten``'s
  d x d covariance and eigendecomposition);
- the bounded work of a pass over rows: row blocks of the CPU's block size,
  :func:`row_blocks`, or a chunk of a fixed number of elements, :func:`work`;
- the slack of a run (allocator, libraries): :data:`RUNTIME`, :data:`TRAINING_RUNTIME`.

A term that grows with the train rows beyond the features and labels is a bug in the
model or in the implementation (``tests/properties/test_protocol_registry.py`` holds the
models to that); the measured peak of a run is the judge of the model
(``tests/pipeline/test_protocol_memory.py``, ``tests/pipeline/test_dense_memory.py``).
"""

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
    direction, the line search's trials).

    Parameters
    ----------
    history : int
        Curvature pairs kept.

    Returns
    -------
    int
    """
    return 4 * history + 16


def features(c: CellShape, streams: bool) -> int:
    """The feature block: every split as given, or all but the train split plus the stored
    blocks in flight (two blocks of ``STREAM_BLOCK_ROWS`` rows) for an entry that streams it.

    Parameters
    ----------
    c : CellShape
    streams : bool
        The entry streams the train split (``streams_train``).

    Returns
    -------
    int
    """
    train = min(c.n_train, 2 * STREAM_BLOCK_ROWS) if streams else c.n_train
    return (train + c.n_test + c.n_val) * c.n_tokens * c.dim * c.itemsize


def feature_rows(rows: int, c: CellShape, copies: int = 0, itemsize: int = F4) -> int:
    """``rows`` feature rows in the stored dtype (a cache, a subsample), plus ``copies`` of
    them in ``itemsize`` bytes a value (a float32 or float64 working copy).

    Parameters
    ----------
    rows : int
    c : CellShape
    copies : int
    itemsize : int

    Returns
    -------
    int
    """
    return rows * c.n_tokens * c.dim * (c.itemsize + copies * itemsize)


def labels(c: CellShape) -> int:
    """The labels of every split and a copy of them (int64).

    Parameters
    ----------
    c : CellShape

    Returns
    -------
    int
    """
    return (c.n_train + c.n_test + c.n_val) * F8 * 2


def parameters(n_values: int, copies: int = 1, itemsize: int = F4) -> int:
    """A model's ``n_values`` parameters, each held ``copies`` times (an optimiser's count).

    Parameters
    ----------
    n_values : int
    copies : int
    itemsize : int

    Returns
    -------
    int
    """
    return n_values * copies * itemsize


def matrix(rows: int, cols: int, copies: int = 1, itemsize: int = F8) -> int:
    """A ``rows`` x ``cols`` array (scores, logits, a Gram matrix, projections), ``copies`` of it.

    Parameters
    ----------
    rows, cols : int
    copies : int
    itemsize : int

    Returns
    -------
    int
    """
    return rows * cols * copies * itemsize


def indices(n: int, arrays: int = 1) -> int:
    """``arrays`` int64 arrays of ``n`` positions (targets, splits, permutations, predictions).

    Parameters
    ----------
    n : int
    arrays : int

    Returns
    -------
    int
    """
    return n * arrays * F8


def transform_state(c: CellShape, name: str | None) -> int:
    """What the fitted ``transform`` ``name`` holds while it is fitted and applied
    (``pipeline.protocols.transforms``): ``whiten`` the d x d covariance, its eigenvectors,
    the eigendecomposition's work and the map (float64, 6 copies); ``standardize`` the mean,
    the scale and their sums (d values, 4 copies); ``none`` and ``l2`` nothing.

    Parameters
    ----------
    c : CellShape
    name : str or None
        The entry's ``transform`` setting (None: an entry without one).

    Returns
    -------
    int
    """
    copies = {"whiten": (c.dim, 6), "standardize": (1, 4)}.get(name)
    return 0 if copies is None else matrix(copies[0], c.dim, copies=copies[1])


def row_blocks(count: int) -> int:
    """``count`` row blocks of the CPU's block size (the blocked passes over rows).

    Parameters
    ----------
    count : int

    Returns
    -------
    int
    """
    return count * BLOCK


def work(elements: int, copies: int = 1, itemsize: int = F4) -> int:
    """A chunk of work of a fixed number of ``elements`` (a score chunk, a minibatch), ``copies`` of it.

    Parameters
    ----------
    elements : int
    copies : int
    itemsize : int

    Returns
    -------
    int
    """
    return elements * copies * itemsize


def peak(**parts: int) -> int:
    """The peak bytes of one cell: the sum of its named parts.

    Parameters
    ----------
    **parts : int
        Bytes per part, by name (``features=...``, ``labels=...``, ``runtime=...``).

    Returns
    -------
    int

    Raises
    ------
    ValueError
        For a part that is not a non-negative number of bytes.
    """
    for name, value in parts.items():
        if int(value) != value or value < 0:
            raise ValueError(f"memory part {name!r} is {value!r}, not a number of bytes")
    return int(sum(parts.values()))
