"""``FeatureRows``: the rows of one or more feature matrices as one virtual row array."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.blocks.parts import CachedPart, StreamedPart, to_torch_block
from pipeline.protocols.blocks.sizes import Blocks, block_rows

__all__ = ["FeatureRows"]


class FeatureRows:
    """Rows of feature matrices in a virtual row order, read block by block.

    Parameters
    ----------
    parts : sequence
        Matrices whose rows are concatenated (virtually): numpy arrays (any float dtype)
        or ``(blocks, n_rows)`` pairs for streamed parts, ``blocks`` being a callable
        that yields ``(block, row_offset)``.
    n_features : int
        The width of every part.
    index : numpy.ndarray or None
        Positions in the concatenated rows this object stands for, in its order; None:
        all rows.
    row_map : callable or None
        Applied to every block after conversion: ``row_map(block, start)`` with the
        block's first position (preprocessing fitted beforehand).
    """

    def __init__(self, parts: Sequence[Any], n_features: int, index: np.ndarray | None = None,
                 row_map: Callable[[Any, int], Any] | None = None):
        self.parts = [StreamedPart(*p) if isinstance(p, tuple) else p for p in parts]
        sizes = [p.shape[0] if isinstance(p, np.ndarray) else p.n_rows for p in self.parts]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n_features = int(n_features)
        self.index = None if index is None else np.asarray(index, dtype=np.int64)
        self.row_map = row_map

    @classmethod
    def of(cls, X: Any = None, blocks: Blocks | None = None, n_rows: int | None = None,
           n_features: int | None = None) -> FeatureRows:
        """Rows of one in-memory matrix ``X``, or of a streamed one (``blocks``, ``n_rows``, ``n_features``).

        Parameters
        ----------
        X : numpy.ndarray or FeatureRows or None
            In-memory features (returned as they are when already FeatureRows).
        blocks : callable or None
            Streamed features, used when ``X`` is None.
        n_rows, n_features : int or None
            The streamed matrix's shape.

        Returns
        -------
        FeatureRows
        """
        if isinstance(X, FeatureRows):
            return X
        if X is not None:
            return cls([X], X.shape[1])
        if blocks is None or n_rows is None or n_features is None:
            raise ConfigError("FeatureRows.of needs X, or blocks with n_rows and n_features")
        return cls([(blocks, int(n_rows))], n_features)

    # -- shape and derived views ------------------------------------------------------
    def __len__(self) -> int:
        return int(self.starts[-1]) if self.index is None else int(self.index.size)

    @property
    def in_memory(self) -> bool:
        """True when no part is streamed (every row can be gathered directly)."""
        return not any(isinstance(p, StreamedPart) for p in self.parts)

    def _derive(self, index: np.ndarray | None = None, row_map: Any = "keep", parts: Any = None) -> FeatureRows:
        out = FeatureRows.__new__(FeatureRows)
        out.parts = self.parts if parts is None else parts
        out.starts, out.n_features = self.starts, self.n_features
        out.index = self.index if index is None else index
        out.row_map = self.row_map if row_map == "keep" else row_map
        return out

    def select(self, positions: np.ndarray) -> FeatureRows:
        """The rows at ``positions`` (of this object's order), without copying them.

        Parameters
        ----------
        positions : numpy.ndarray
            Row positions; sorted when a part is streamed.

        Returns
        -------
        FeatureRows
        """
        positions = np.asarray(positions, dtype=np.int64)
        return self._derive(index=positions if self.index is None else self.index[positions])

    def with_map(self, row_map: Callable[[Any, int], Any] | None) -> FeatureRows:
        """The same rows followed by ``row_map`` (a fitted preprocessing; None: none).

        Parameters
        ----------
        row_map : callable or None
            ``row_map(block, start) -> block``.

        Returns
        -------
        FeatureRows
        """
        return self._derive(row_map=row_map)

    def cached(self, positions: np.ndarray | None = None) -> FeatureRows:
        """These rows with every streamed part read once, keeping the rows at ``positions``.

        Afterwards ``take`` works for those positions. In-memory parts are not copied.

        Parameters
        ----------
        positions : numpy.ndarray or None
            Positions (of this object's order) that will be taken; None: all.

        Returns
        -------
        FeatureRows
        """
        if self.in_memory:
            return self
        wanted = np.arange(len(self)) if positions is None else np.unique(positions)
        global_rows = wanted if self.index is None else np.unique(self.index[wanted])
        parts: list[Any] = []
        for p, part in enumerate(self.parts):
            if not isinstance(part, StreamedPart):
                parts.append(part)
                continue
            lo, hi = self.starts[p], self.starts[p + 1]
            rows = global_rows[(global_rows >= lo) & (global_rows < hi)] - lo
            data = np.empty((rows.size, self.n_features), dtype=np.float32)
            dtype_set = False
            for block, offset in part.blocks():
                block = self._checked(np.asarray(block), lo + offset)
                a, b = np.searchsorted(rows, [offset, offset + block.shape[0]])
                if not dtype_set:  # the stored dtype, learnt from the first block
                    data, dtype_set = data.astype(block.dtype), True
                data[a:b] = block[rows[a:b] - offset]
            parts.append(CachedPart(rows, data, part.n_rows))
        return self._derive(parts=parts)

    def on_device(self, device: Any, copy: bool | None = None) -> FeatureRows:
        """These rows with the in-memory parts copied to ``device`` once, in their stored dtype.

        For protocols that read the rows many times (the logistic probe's L-BFGS).

        Parameters
        ----------
        device : torch.device
            The compute device.
        copy : bool or None
            Copy the parts into torch tensors there; None: only for a device other than
            the CPU (on the CPU the numpy arrays are read as they are, without a copy).

        Returns
        -------
        FeatureRows
        """
        if not (copy if copy is not None else getattr(device, "type", "cpu") != "cpu"):
            return self
        import torch

        parts = [torch.from_numpy(p).to(device) if isinstance(p, np.ndarray) else p for p in self.parts]
        return self._derive(parts=parts)

    # -- reading --------------------------------------------------------------------
    def _checked(self, block: np.ndarray, start: int) -> np.ndarray:
        # deferred: scikit-learn's input checks, when a block is read (the registry imports this module)
        from pipeline.protocols.inputs.features import check_finite

        if block.ndim != 2 or block.shape[1] != self.n_features:
            raise DataValidationError(f"train block at row {start} has shape {block.shape}, but the features "
                                      f"have {self.n_features} columns; expected (rows, {self.n_features})")
        return check_finite(block, "train features", row_offset=start)

    def _gather(self, global_rows: np.ndarray) -> Any:
        """Rows at global positions (any order) from in-memory and cached parts."""
        part_of = np.searchsorted(self.starts, global_rows, side="right") - 1
        used = np.unique(part_of)
        if any(isinstance(self.parts[p], StreamedPart) for p in used):
            raise DataValidationError("rows of a streamed part are taken only after FeatureRows.cached()")
        if used.size == 1 and isinstance(self.parts[used[0]], np.ndarray):  # the common case: one array
            return self.parts[used[0]][global_rows - self.starts[used[0]]]
        on_device = [p for p in self.parts if not isinstance(p, (np.ndarray, CachedPart, StreamedPart))]
        if on_device:  # parts moved by on_device(): gather there
            import torch

            dtype = on_device[0].dtype
            for part in on_device[1:]:
                dtype = torch.promote_types(dtype, part.dtype)
            out = torch.empty(global_rows.shape + (self.n_features,), dtype=dtype, device=on_device[0].device)
        else:
            dtypes = [p.dtype if isinstance(p, np.ndarray) else p.data.dtype for p in self.parts
                      if not isinstance(p, StreamedPart)]
            out = np.empty(global_rows.shape + (self.n_features,), dtype=np.result_type(*dtypes))
        for p in used:
            mask = part_of == p
            local = global_rows[mask] - self.starts[p]
            part = self.parts[p]
            if isinstance(part, CachedPart):
                at = np.searchsorted(part.rows, local)
                if np.any(at >= part.rows.size) or np.any(part.rows[np.minimum(at, part.rows.size - 1)] != local):
                    raise DataValidationError("a row outside FeatureRows.cached(positions) was asked for")
                out[mask] = part.data[at]
            elif isinstance(part, np.ndarray):
                out[mask] = part[local]
            else:
                import torch

                out[torch.from_numpy(mask).to(out.device)] = part[torch.from_numpy(local).to(part.device)].to(out.dtype)
        return out

    def _run(self, global_rows: np.ndarray) -> Any:
        """``_gather`` of some rows, as a view when they are consecutive rows of one in-memory array."""
        p = int(np.searchsorted(self.starts, global_rows[0], side="right")) - 1
        lo, hi = int(global_rows[0] - self.starts[p]), int(global_rows[-1] - self.starts[p]) + 1
        part = self.parts[p]
        consecutive = bool(np.all(np.diff(global_rows) == 1))
        if consecutive and not isinstance(part, (CachedPart, StreamedPart)) and hi <= part.shape[0]:
            return part[lo:hi]
        return self._gather(global_rows)

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The rows at ``positions`` (any shape) in their stored dtype, shape positions.shape + (d,).

        No row map is applied. Streamed parts must have been ``cached`` first.

        Parameters
        ----------
        positions : numpy.ndarray
            Positions of this object's order.

        Returns
        -------
        numpy.ndarray
        """
        positions = np.asarray(positions, dtype=np.int64)
        global_rows = positions if self.index is None else self.index[positions]
        return self._gather(global_rows)

    def _raw_blocks(self, rows: int) -> Iterator[tuple[np.ndarray, int]]:
        """(numpy block, start position) covering every row once; no conversion."""
        if self.index is None:
            for p, part in enumerate(self.parts):
                lo = int(self.starts[p])
                if isinstance(part, StreamedPart):
                    for block, offset in part.blocks():
                        yield self._checked(np.asarray(block), lo + offset), lo + offset
                else:
                    data = part.data if isinstance(part, CachedPart) else part
                    for i in range(0, data.shape[0], rows):
                        yield data[i:i + rows], lo + i
            return
        index = self.index
        ordered = index.size < 2 or bool(np.all(index[1:] >= index[:-1]))
        for p, part in enumerate(self.parts):
            if not isinstance(part, StreamedPart):
                continue
            if not ordered:
                raise DataValidationError("rows of a streamed part must be selected in increasing order")
            lo = int(self.starts[p])
            for block, offset in part.blocks():
                block = self._checked(np.asarray(block), lo + offset)
                a, b = np.searchsorted(index, [lo + offset, lo + offset + block.shape[0]])
                if b > a:
                    yield block[index[a:b] - lo - offset], int(a)
        streamed = np.zeros(index.size, dtype=bool)
        for p, part in enumerate(self.parts):
            if isinstance(part, StreamedPart):
                streamed |= (index >= self.starts[p]) & (index < self.starts[p + 1])
        rest = np.flatnonzero(~streamed)
        for i in range(0, rest.size, rows):
            chunk = rest[i:i + rows]
            if chunk.size and chunk[-1] - chunk[0] == chunk.size - 1:  # a run of positions
                yield self._run(index[chunk]), int(chunk[0])
            else:  # scattered positions: yield runs so that start + i is every row's position
                for run in np.split(chunk, np.flatnonzero(np.diff(chunk) != 1) + 1):
                    yield self._gather(index[run]), int(run[0])

    def blocks(self, device: Any = None, dtype: Any = None, rows: int | None = None,
               mapped: bool = True, buffer: Any = None) -> Iterator[tuple[Any, int]]:
        """Yield (block, start): torch tensors on ``device`` covering every row once.

        ``block`` holds the rows at positions start .. start + len(block) - 1. Streamed
        parts decide their own block sizes (and order); in-memory rows come in blocks
        of ``rows``.

        Parameters
        ----------
        device : torch.device or None
            Where the blocks go; None: the CPU.
        dtype : torch.dtype or None
            The compute dtype; None: float32 for float16/float32 data, else float64.
        rows : int or None
            Rows per in-memory block; None: ``block_rows(n_features, device)``.
        mapped : bool
            Apply the row map (the default).
        buffer : torch.Tensor or None
            A (rows, d) tensor of ``dtype`` on ``device`` that blocks needing a conversion
            are copied into (valid until the next block), instead of a new tensor each.

        Yields
        ------
        tuple of (torch.Tensor, int)
        """
        import torch

        device = torch.device("cpu") if device is None else device
        rows = block_rows(self.n_features, device) if rows is None else rows
        for block, start in self._raw_blocks(rows):
            wide = block.dtype == torch.float64 if isinstance(block, torch.Tensor) else block.dtype == np.float64
            want = dtype or (torch.float64 if wide else torch.float32)
            tensor = to_torch_block(block, device, want, buffer)
            if mapped and self.row_map is not None:
                tensor = self.row_map(tensor, start)
            yield tensor, start

    def numpy(self, dtype: Any = np.float64) -> np.ndarray:
        """Every row (mapped) as one numpy array: for small problems only.

        Parameters
        ----------
        dtype : numpy dtype
            The result's dtype.

        Returns
        -------
        numpy.ndarray of shape (len(self), n_features)
        """
        import torch

        out = np.empty((len(self), self.n_features), dtype=dtype)
        tdtype = torch.float64 if np.dtype(dtype) == np.float64 else torch.float32
        for block, start in self.blocks(dtype=tdtype):
            out[start:start + block.shape[0]] = block.cpu().numpy()
        return out
