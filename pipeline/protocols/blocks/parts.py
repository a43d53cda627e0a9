"""The parts a ``FeatureRows`` joins: streamed from storage, or some of their rows kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.protocols.blocks.sizes import Blocks

__all__ = ["CachedPart", "StreamedPart", "to_torch_block"]


@dataclass(frozen=True)
class StreamedPart:
    """A part read by a callable yielding (block, row_offset); the rows it covers.

    Parameters
    ----------
    blocks : callable
        Yields ``(block, row_offset)`` pairs.
    n_rows : int
        Rows of the part.
    """

    blocks: Blocks
    n_rows: int


@dataclass(frozen=True)
class CachedPart:
    """Some rows of a streamed part, read once and kept (compact, in their stored dtype).

    Parameters
    ----------
    rows : numpy.ndarray
        Sorted row numbers within the part.
    data : numpy.ndarray
        Those rows, shape (len(rows), d).
    n_rows : int
        Rows of the whole part.
    """

    rows: np.ndarray  # sorted row numbers within the part
    data: np.ndarray  # (len(rows), d)
    n_rows: int


def to_torch_block(block: Any, device: Any, dtype: Any, buffer: Any = None) -> Any:
    """``block`` (numpy or torch) as a torch tensor of ``dtype`` on ``device``.

    Parameters
    ----------
    block : numpy.ndarray or torch.Tensor
        One block of rows.
    device : torch.device
        Where it goes.
    dtype : torch.dtype
        Its compute dtype.
    buffer : torch.Tensor, optional
        The caller's memory for a block that must be converted (another dtype or device)
        and fits in it: the block is copied into its first rows, so passes over the same
        rows allocate nothing.

    Returns
    -------
    torch.Tensor
    """
    import torch

    if not isinstance(block, torch.Tensor):
        if not block.flags.writeable:  # torch wants writable memory to share it
            block = block.copy()
        block = torch.from_numpy(block)
    if buffer is not None and (block.dtype != dtype or block.device != buffer.device) \
            and block.shape[0] <= buffer.shape[0]:
        return buffer[:block.shape[0]].copy_(block)  # a conversion into the caller's memory
    return block.to(device=device, dtype=dtype)

