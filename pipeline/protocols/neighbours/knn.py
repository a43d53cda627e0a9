"""k-nearest-neighbour classification over streamed train blocks, in torch on any device."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from numbers import Integral
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import ThreadpoolController

from pipeline.errors import ConfigError, DataValidationError, unknown_name
from pipeline.protocols.blocks import FeatureRows, to_torch_block
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.neighbours.pairs import KNN_METRICS, QUERY_CACHE_BYTES, check_metric_weights
from pipeline.protocols.transforms.transformers import l2_normalize_block
from pipeline.protocols.inputs.features import check_features, check_finite, validate_features
from pipeline.protocols.inputs.labels import check_min_classes, encode_labels
from pipeline.protocols.inputs.parameters import check_number

__all__ = ["METRICS", "KNNClassifier", "check_metric_weights", "knn_class_weights", "knn_predict_from_topk",
           "topk_blocks"]

#: Supported metrics and the weightings valid with each.
METRICS = KNN_METRICS

# Elements of one (query chunk x train tile) score matrix per device type (32 MiB of
# float32 on a CPU, 2 GiB on a GPU): queries are scored in chunks of equal size that stay
# under it (5,000 queries as 2 x 2,500 against 2,048-row tiles).
_SCORE_BUDGET = {"cpu": 1 << 23, "cuda": 1 << 29}
# Train rows of one score tile. BLAS packs both operands of every product again, so the
# packing grows with 1 / tile rows + 1 / chunk rows: on one CPU thread (OpenBLAS, AMD
# EPYC) 2,500 x 2,048 products of 5,000 x 20,000 ran at 0.99 of one large GEMM's time,
# 2,500 x 1,024 at 1.04, 1,667 x 2,048 at 1.09, 256 x 8,192 15-20 % slower.
_TILE_ROWS = {"cpu": 2048, "cuda": 1 << 15}
# Train rows gathered before they are scored: the queries are normalised once per buffer
# (not per block), so small streamed blocks cost what large ones do.
_BUFFER_ROWS = {"cpu": 8192, "cuda": 1 << 17}
# Groups of a score tile's columns whose maxima the threshold pass takes. On the numpy
# path a group is a run of 32 adjacent columns (b / 32 groups of a b-wide tile): torch
# takes their maxima about 10 % slower than those of strided groups, but the groups that
# pass are then rows of a (rows * b / 32, 32) view, which np.take copies about 3x faster than
# strided columns are gathered from a tile the product has left in memory, not in the
# cache (on the AMD EPYC of the development machine: 0.4 ms against 1.1 ms a 2,048 x
# 1,024 tile). On the torch path (and for deep searches) group j holds the columns j, j
# + 32, j + 64, ...: a maximum over the middle dimension of a (rows, b / 32, 32) view is
# a vectorised element-wise max of contiguous runs, 2.3x faster in torch than one over
# runs of 32 adjacent columns; fewer than 32 groups take a slow path.
_GROUPS = 32
# A deep search (retrieval's top-R, R in the hundreds) lets about k / seen of a tile's scores
# through: groups of 32 columns then nearly all hold one, and the tile is read twice. With
# 256 groups (4 columns each at 1024-wide tiles, 8 at 2048) most groups stay below the
# threshold; at k = 200 on 20,000 x 5,000 this cut the selection's time by more than half.
_DEEP_K, _DEEP_GROUPS = 64, 256
# The first tile of a search is this many tiles wide at most (on the numpy path: the whole
# first buffer), and its query chunks are cut so that its scores stay within _FIRST_BUDGET
# (32 MiB of float32: 1,000-query chunks against 8,192 train rows). Its k-th best sets the
# first thresholds: at 20,000 x 5,000 (k = 20) a first tile of 8,192 train rows let 43
# candidates per query through the whole search, one of 4,096 rows 60.
_FIRST_TILE = 4
_FIRST_BUDGET = 1 << 23
_NO_INDEX = np.iinfo(np.int64).max
# A query chunk's candidates are merged into its state (and its thresholds raised) when
# they add up to this many times k per query on average.
_MERGE_AT = 0.5


def _check_k(k: Any) -> int:
    if not isinstance(k, Integral) or isinstance(k, bool) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _per_device(table: dict[str, int], device: torch.device) -> int:
    return table.get(device.type, table["cpu"])


def _numpy_path(device: torch.device) -> bool:
    """Whether the score products and the selection's small-array work run in numpy (CPU tensors) or torch."""
    # On one CPU thread numpy's comparisons, flatnonzero, partition, sort and small-array
    # arithmetic cost 2-5x less than torch's. Its products go to the OpenBLAS its wheels
    # bundle, which picks the CPU's kernels at load time; torch's go to the MKL it links,
    # which on the AMD EPYC (AVX2) of the development machine ran the same float32 products
    # 1.1-1.6x slower. On a GPU everything stays in torch.
    return device.type == "cpu"


_BLAS_POOLS: ThreadpoolController | None = None


def _blas_pools() -> ThreadpoolController:
    """The BLAS libraries loaded (numpy's among them), found once: a scan costs 20 ms, a limit 0.1 ms."""
    global _BLAS_POOLS
    if _BLAS_POOLS is None:
        _BLAS_POOLS = ThreadpoolController().select(user_api="blas")
    return _BLAS_POOLS


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty``, from numpy's allocator on a CPU: the search's large buffers then get huge pages."""
    # numpy asks the kernel for transparent huge pages on arrays of 4 MiB and more (where
    # the kernel leaves that to the program, as most do by default); torch does not. The
    # buffers are new for every search, and a 16-32 MiB buffer in 4 KiB pages cost 4,000-
    # 8,000 page faults on first touch: 1-2 % of a 5,000 x 20,000 search on one thread.
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.empty(shape, dtype=torch.empty(0, dtype=dtype).numpy().dtype))


def _row_norms(block: torch.Tensor) -> torch.Tensor:
    """Euclidean norms of the rows in float64, as ``torch.linalg.vector_norm(..., dtype=float64)``."""
    # Computed 512 rows at a time: the same values, 6-10x faster on one CPU thread than
    # one call over a block of thousands of rows.
    out = torch.empty(block.shape[0], dtype=torch.float64, device=block.device)
    for i in range(0, block.shape[0], 512):
        torch.linalg.vector_norm(block[i:i + 512], dim=1, dtype=torch.float64, out=out[i:i + 512])
    return out


def _sort_best_first(keys: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row by key descending, equal keys by train index ascending (two stable sorts)."""
    by_index = torch.argsort(idx, dim=1, stable=True)
    keys, idx = keys.gather(1, by_index), idx.gather(1, by_index)
    order = torch.argsort(keys, dim=1, descending=True, stable=True)
    return keys.gather(1, order), idx.gather(1, order)


def _block_topk(S: torch.Tensor, k: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest scores of each row of S and their train indices (``index[column]``), ties to the lower index."""
    # torch.topk picks arbitrarily among equal scores. Asking for k + 1 shows whether the
    # k-th and (k+1)-th scores are equal, i.e. whether a tie straddles the cut; only such
    # rows are redone with a stable sort (by train index, as a buffer may hold blocks that
    # arrived out of order).
    if k >= S.shape[1]:
        return S, index.expand(S.shape[0], -1)
    values, cols = torch.topk(S, k + 1, dim=1, largest=True, sorted=True)
    tied = torch.nonzero(values[:, k] == values[:, k - 1]).flatten()
    values, idx = values[:, :k], index[cols[:, :k]]
    if tied.numel():
        keys, order = _sort_best_first(S[tied], index.expand(tied.numel(), -1))
        values = values.clone()
        values[tied], idx[tied] = keys[:, :k], order[:, :k]
    return values, idx


def _group_maxima(S: torch.Tensor, n_groups: int, runs: bool) -> torch.Tensor:
    """The maxima of ``n_groups`` groups of S's columns per row: contiguous runs, or strided (see ``_candidates``)."""
    a, b = S.shape
    if runs:
        return S.view(a, n_groups, b // n_groups).amax(2)
    return S.view(a, b // n_groups, n_groups).amax(1)


def _candidates(S: torch.Tensor, groups: torch.Tensor | None, thr: torch.Tensor,
                runs: bool = False) -> tuple[Any, Any, Any]:
    """(row, column, score) of the scores of a contiguous S that reach their row's threshold, sorted by row."""
    # ``groups[:, j]`` holds the maxima of group j of S's columns (None for a tile narrower
    # than the groups, which is read whole): with ``runs`` the columns j w .. j w + w - 1
    # (w = b / g), else the columns j, j + g, j + 2g, ... (g groups). Only the groups whose
    # maximum reaches the threshold are read again. numpy arrays where ``_numpy_path``,
    # else torch tensors.
    a, b = S.shape
    if _numpy_path(S.device):
        S, thr = S.numpy(), thr.numpy()
        if groups is None:
            flat = np.flatnonzero(S >= thr[:, None])
            rows = flat // b
            return rows, flat - rows * b, S.ravel()[flat]
        n_groups = groups.shape[1]
        group = np.flatnonzero(groups.numpy() >= thr[:, None])
        if runs:
            # a group is a run of adjacent scores: the groups that pass are rows of an
            # (a g, w) view, which np.take copies about 3x faster than indexing gathers strided
            # columns from a tile no longer in the cache
            w = b // n_groups
            rows = group // n_groups
            values = np.take(S.reshape(a * n_groups, w), group, axis=0)  # (groups passed, their columns)
            hit = np.flatnonzero(values >= thr[rows, None])
            which = hit // w
            return rows[which], (group[which] - rows[which] * n_groups) * w + (hit - which * w), values.ravel()[hit]
        rows, first = np.divmod(group, n_groups)
        values = S.reshape(a, b // n_groups, n_groups)[rows, :, first]  # (groups passed, their columns)
        hit = np.flatnonzero(values >= thr[rows, None])
        which, step = np.divmod(hit, b // n_groups)
    else:
        if groups is None:
            flat = torch.nonzero((S >= thr[:, None]).view(-1)).flatten()
            rows = flat // b
            return rows, flat - rows * b, S.view(-1)[flat]
        n_groups = groups.shape[1]
        group = torch.nonzero((groups >= thr[:, None]).view(-1)).flatten()
        rows, first = group // n_groups, group % n_groups
        values = S.view(a, b // n_groups, n_groups)[rows, :, first]
        hit = torch.nonzero((values >= thr[rows, None]).view(-1)).flatten()
        which, step = hit // (b // n_groups), hit % (b // n_groups)
    return rows[which], step * n_groups + first[which], values.reshape(-1)[hit]


def _pack(keys: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """float32 scores and train indices (< 2^32) as int64 that sort as (score, -index)."""
    # The score's bits, made to order as signed integers, fill the high half; the index,
    # counted down from 2^32 - 1, the low half: one ascending sort of the packed values is
    # the order by score, equal scores by descending train index. Adding 0.0 first makes
    # -0.0 the +0.0 it equals.
    bits = (keys + np.float32(0)).view(np.int32).astype(np.int64)
    return ((bits ^ ((bits >> 31) & 0x7FFFFFFF)) << 32) | (0xFFFFFFFF - idx)


def _unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (float32 scores, train indices) of ``_pack``'s values."""
    high = packed >> 32
    keys = (high ^ ((high >> 31) & 0x7FFFFFFF)).astype(np.int32).view(np.float32)
    return keys, 0xFFFFFFFF - (packed & 0xFFFFFFFF)


# (-inf, train index 0) packed: below every real pair, the padding of a packed merge
_PACKED_PAD = int(_pack(np.array([-np.inf], np.float32), np.zeros(1, np.int64))[0])


class _State:
    """Each query's k best (score, train index) pairs, best first, ties by train index."""
    # Until k train rows are merged the rows are padded with (-inf, ``_NO_INDEX``), which
    # every real score beats. ``merge`` takes (keys, idx) arrays of a query chunk padded
    # the same way. With float32 scores on the ``_numpy_path`` (and train indices below
    # 2^32) the pairs are kept packed in int64 (``_pack``): a merge is then one numpy sort, which is 5x
    # faster than torch.topk on rows of a few dozen; otherwise a torch top-k whose rows
    # with equal scores are sorted again by index.

    def __init__(self, m: int, k: int, dtype: torch.dtype, device: torch.device):
        self.k, self.dtype, self.device = k, dtype, device
        self.packed = None
        self.keys = torch.full((m, k), -torch.inf, dtype=dtype, device=device)
        self.idx = torch.full((m, k), _NO_INDEX, dtype=torch.int64, device=device)
        if _numpy_path(device) and dtype == torch.float32:
            self.packed = _pack(self.keys.numpy(), np.zeros((m, k), np.int64))

    def allow_index(self, largest: int) -> None:
        """Leave the packed form before a train index that does not fit it is merged."""
        if self.packed is not None and largest >= 0xFFFFFFFF:
            self.keys[:], self.idx[:] = self.result()
            self.packed = None

    def kth(self, rows: slice) -> torch.Tensor:
        """Each query's k-th best score (valid once k train rows are merged)."""
        if self.packed is None:
            return self.keys[rows, self.k - 1]
        return torch.from_numpy(_unpack(self.packed[rows, self.k - 1])[0])

    def merge(self, rows: slice, keys: Any, idx: Any) -> None:
        """Merge candidates (numpy arrays or tensors, padded with -inf) into the queries ``rows``."""
        k = self.k
        if self.packed is not None:
            keys, idx = np.asarray(keys), np.asarray(idx)
            new = _pack(keys, np.where(keys == -np.inf, 0, idx))  # padding: any index below every real pair
            both = np.concatenate([self.packed[rows], new], axis=1)
            both.sort(axis=1)
            self.packed[rows] = both[:, :-k - 1:-1]
            return
        keys = torch.cat([self.keys[rows], torch.as_tensor(keys, device=self.device)], dim=1)
        idx = torch.cat([self.idx[rows], torch.as_tensor(idx, device=self.device)], dim=1)
        top, pos = torch.topk(keys, min(k + 1, keys.shape[1]), dim=1, sorted=True)
        tied = torch.nonzero((top[:, 1:] == top[:, :-1]).any(dim=1)).flatten()
        best_keys, best_idx = top[:, :k], idx.gather(1, pos[:, :k])
        if tied.numel():
            tk, ti = _sort_best_first(keys[tied], idx[tied])
            best_keys[tied], best_idx[tied] = tk[:, :k], ti[:, :k]
        self.keys[rows], self.idx[rows] = best_keys, best_idx

    def merge_scattered(self, rows: slice, width: int, row: np.ndarray, slot: np.ndarray, keys: np.ndarray,
                        idx: np.ndarray) -> None:
        """``merge`` on the packed form, of candidates given as (row, slot in the row, score, train index) arrays."""
        # the padded rows are formed packed: one (queries x (k + width)) int64 array, with no
        # float and index arrays to pad, scatter and pack first
        k = self.k
        both = np.empty((rows.stop - rows.start, k + width), np.int64)
        both[:, :k] = self.packed[rows]
        both[:, k:] = _PACKED_PAD
        both[row, k + slot] = _pack(keys, idx)
        both.sort(axis=1)
        self.packed[rows] = both[:, :-k - 1:-1]

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, train indices), best first."""
        if self.packed is None:
            return self.keys, self.idx
        keys, idx = _unpack(self.packed)
        return torch.from_numpy(keys.copy()), torch.from_numpy(np.where(keys == -np.inf, _NO_INDEX, idx))


class _Queries:
    """Query rows on the device in chunks, normalised (cosine) in the compute dtype."""
    # Queries whose converted copy fits ``QUERY_CACHE_BYTES`` are converted once and kept;
    # larger ones are converted chunk by chunk for every buffer of train rows, so there is
    # no full-size copy of them.

    def __init__(self, query: np.ndarray, metric: str, device: torch.device, dtype: torch.dtype):
        self.rows = FeatureRows.of(query)
        self.metric, self.device, self.dtype = metric, device, dtype
        self.sq_norms = torch.zeros(len(self.rows), dtype=torch.float64, device=device)
        for Q, start in self.rows.blocks(device, dtype):  # norms once; zero rows fail here
            norms = _row_norms(Q)
            if metric == "cosine" and bool((norms == 0).any()):
                l2_normalize_block(Q, start, "query")  # raises, naming the rows
            self.sq_norms[start:start + Q.shape[0]] = norms ** 2
        # the divisor in the compute dtype: a float32 division is 10x cheaper than a
        # float64 one and rounds within one ulp of it; norms below float32's normal
        # range keep the float64 division
        self.scale = self.sq_norms.sqrt()
        if dtype != torch.float64 and not bool((self.scale < torch.finfo(dtype).tiny).any()):
            self.scale = self.scale.to(dtype)
        self.cache = None
        if len(self.rows) * query.shape[1] * torch.finfo(dtype).bits // 8 <= QUERY_CACHE_BYTES:
            self.cache = _empty((len(self.rows), query.shape[1]), dtype, device)
            for Q, start in self._converted(None):
                self.cache[start:start + Q.shape[0]] = Q

    def _converted(self, rows: int | None) -> Iterator[tuple[torch.Tensor, int]]:
        for Q, start in self.rows.blocks(self.device, self.dtype, rows=rows):
            if self.metric == "cosine":
                Q = (Q / self.scale[start:start + Q.shape[0], None]).to(self.dtype)
            yield Q, start

    def chunks(self, rows: int) -> Iterator[tuple[torch.Tensor, int]]:
        if self.cache is None:
            yield from self._converted(rows)
            return
        for start in range(0, self.cache.shape[0], rows):
            yield self.cache[start:start + rows], start


class _Search:
    """The running top-k of every query (``_State``), fed train rows through a bounded buffer."""
    # Candidates found in the tiles of a query chunk are collected and merged at once when
    # they add up to k / 2 per query on average (``_MERGE_AT``; early on: after every tile)
    # or when the buffer is done.

    def __init__(self, queries: _Queries, k: int, d: int, normalize: bool):
        self.queries, self.k, self.normalize = queries, k, normalize
        device, dtype, m = queries.device, queries.dtype, len(queries.rows)
        self.device = device
        self.state = _State(m, k, dtype, device)
        self.buffer = _empty((_per_device(_BUFFER_ROWS, device), d), dtype, device)
        self.index = torch.empty(self.buffer.shape[0], dtype=torch.int64, device=device)
        self.filled = 0
        # the threshold pass's column groups: a tile's width must be a whole number of them
        deep = k >= _DEEP_K and _per_device(_TILE_ROWS, device) % _DEEP_GROUPS == 0
        self.groups = _DEEP_GROUPS if deep else _GROUPS
        # on the numpy path a shallow search's groups are runs of ``_GROUPS`` adjacent
        # columns (b / 32 groups of a b-wide tile), strided otherwise (see _candidates)
        self.runs = _numpy_path(device) and not deep
        self.seen = 0  # train rows merged into the state of every query
        self.scores = torch.empty(0, dtype=dtype, device=device)

    def add(self, block: np.ndarray, offset: int) -> None:
        """Copy (and normalise) a train block into the buffer, scoring the buffer whenever it fills."""
        if not self.normalize:  # a normalised block is checked by its norms
            check_finite(block, "train features", row_offset=offset)
        B = to_torch_block(block, self.device, self.buffer.dtype)
        self.state.allow_index(offset + B.shape[0] - 1)
        i = 0
        while i < B.shape[0]:
            part = B[i:i + self.buffer.shape[0] - self.filled]
            r = slice(self.filled, self.filled + part.shape[0])
            if self.normalize:
                self._normalize_into(self.buffer[r], part, block, offset, i)
            else:
                self.buffer[r].copy_(part)
            torch.arange(offset + i, offset + i + part.shape[0], out=self.index[r])
            self.filled += part.shape[0]
            i += part.shape[0]
            if self.filled == self.buffer.shape[0]:
                self.flush()

    @staticmethod
    def _normalize_into(out: torch.Tensor, part: torch.Tensor, block: np.ndarray, offset: int, i: int) -> None:
        """``part`` (rows i.. of ``block``) normalised into ``out``, 512 rows at a time."""
        # The norms and the division read each row while it is in cache. Non-finite norms
        # (NaN or inf in the row) and zero norms raise with the block's positions. A float32
        # row is divided by its float32 norm (within one ulp of the float64 division, 10x
        # cheaper); norms below float32's normal range keep the float64 division.
        tiny = torch.finfo(out.dtype).tiny
        for j in range(0, part.shape[0], 512):
            rows, dest = part[j:j + 512], out[j:j + 512]
            norms = _row_norms(rows)
            scale = norms if out.dtype == torch.float64 else norms.to(out.dtype)
            if not bool(torch.isfinite(norms).all()) or bool((scale < tiny).any()):
                check_finite(block, "train features", row_offset=offset)  # raises for NaN/inf
                if bool((norms == 0).any()) or out.dtype != torch.float64:  # zero (raises) or subnormal
                    dest.copy_(l2_normalize_block(rows, offset + i + j, "train features"))
                    continue
            torch.div(rows, scale[:, None], out=dest)

    def flush(self) -> None:
        """Score the buffered train rows against every query and merge them into the state."""
        n, self.filled = self.filled, 0
        if n == 0:
            return
        train, index = self.buffer[:n], self.index[:n]
        sq_train = (train * train).sum(dim=1) if self.queries.metric == "euclidean" else None
        cols = min(_per_device(_TILE_ROWS, self.device), n)
        rows = max(1, _per_device(_SCORE_BUDGET, self.device) // cols)
        # tiles of whole groups, then the rows left over (fewer than a group) as a tile of their own
        whole = n - n % self.groups
        first = 0
        if self.seen == 0 and _numpy_path(self.device):
            # the first tile, which sets the thresholds, is wider: its k-th best is higher,
            # and the tiles after it let about 1/_FIRST_TILE as many scores through; its
            # query chunks are smaller, to keep its scores within _FIRST_BUDGET
            first = min(whole, _FIRST_TILE * cols)
            rows = min(rows, max(1, _FIRST_BUDGET // max(first, 1)))
        m = max(1, len(self.queries.rows))
        rows = -(-m // -(-m // rows))  # chunks of equal size: 5,000 queries as 2 x 2,500, not 4,096 + 904
        tiles = ([(0, first)] if first else []) + [(j, min(cols, whole - j)) for j in range(first, whole, cols)]
        tiles += [(j, min(cols, n - j)) for j in range(whole, n, cols)]
        if self.scores.numel() < rows * max(cols, first):
            self.scores = _empty((rows * max(cols, first),), self.buffer.dtype, self.device)
        for Q, start in self.queries.chunks(rows):
            chunk = _Chunk(self, start, Q.shape[0])
            for j, w in tiles:
                S = self.scores[:Q.shape[0] * w].view(Q.shape[0], w)
                if _numpy_path(self.device):  # numpy's BLAS: see _numpy_path
                    np.matmul(Q.numpy(), train[j:j + w].numpy().T, out=S.numpy())
                else:
                    torch.mm(Q, train[j:j + w].T, out=S)
                if sq_train is not None:  # 2 q.x - ||x||^2 = ||q||^2 - ||q - x||^2 (||q||^2 is per query)
                    S.mul_(2).sub_(sq_train[j:j + w])
                chunk.select(S, index[j:j + w])
            chunk.merge()
        self.seen += n


class _Chunk:
    """The selection for one query chunk over one buffer's tiles."""

    def __init__(self, search: _Search, start: int, rows: int):
        self.search, self.k = search, search.k
        self.rows = slice(start, start + rows)
        self.merged = search.seen  # train rows already in this chunk's state
        self.pending_rows = 0  # train rows scored but not merged yet
        self.parts: list[tuple[Any, ...]] = []  # (row, slot, score, train index) arrays, as _candidates gives
        self.n_pending = 0
        self.thr = None  # the k-th best scores, while no merge changes them
        self.cpu = _numpy_path(search.device)
        # candidates pending per query
        self.filled = np.zeros(rows, np.int64) if self.cpu else torch.zeros(rows, dtype=torch.int64,
                                                                            device=search.device)

    def select(self, S: torch.Tensor, index: torch.Tensor) -> None:
        a, b = S.shape
        if self.merged >= self.k:  # every query holds k real neighbours: its k-th score is a threshold
            # tiles are whole multiples of the groups, or narrower than one of each
            g, runs = self.search.groups, self.search.runs
            groups = _group_maxima(S, b // g if runs else g, runs) if b >= g else None
            if self.thr is None:  # it changes only when candidates are merged
                self.thr = self.search.state.kth(self.rows)
            thr = self.thr
        else:
            # the k-th largest group maximum: k scores of this tile reach it. 4k groups or
            # more seldom hold two of the k best, so the bound is close to the k-th score
            # and few scores besides the k best are read
            n_groups = self.search.groups
            while n_groups < 4 * self.k and b % (2 * n_groups) == 0:
                n_groups *= 2
            if n_groups < 4 * self.k or b < n_groups:  # no bound: the plain top-k of the tile
                self.merge()
                self.search.state.merge(self.rows, *_block_topk(S, min(self.k, b), index))
                self.merged += b
                self.thr = None
                return
            groups = _group_maxima(S, n_groups, self.search.runs)
            if self.cpu:  # numpy's partition is 4x faster than torch.topk here
                thr = torch.from_numpy(np.partition(groups.numpy(), -self.k, axis=1)[:, -self.k])
            else:
                thr = torch.topk(groups, self.k, dim=1, sorted=False).values.amin(1)
        rows, cols, values = _candidates(S, groups, thr, self.search.runs)
        # each candidate's slot in its query's row of the padded merge (rows come sorted)
        if self.cpu:
            counts = np.bincount(rows, minlength=a)
            slot = np.arange(rows.size) - (np.cumsum(counts) - counts)[rows]
            index = index.numpy()
        else:
            counts = torch.bincount(rows, minlength=a)
            slot = torch.arange(rows.numel(), device=rows.device) - (torch.cumsum(counts, 0) - counts)[rows]
        self.parts.append((rows, slot + self.filled[rows], values, index[cols]))
        self.filled += counts
        self.n_pending += len(rows)
        self.pending_rows += b
        if self.merged < self.k or self.n_pending >= a * self.k * _MERGE_AT:
            self.merge()

    def merge(self) -> None:
        """Merge the collected candidates, one padded row per query (padding sorts last)."""
        if self.parts:
            a, width = self.filled.shape[0], int(self.filled.max())
            state = self.search.state
            if self.cpu and state.packed is not None:
                state.merge_scattered(self.rows, width, *(np.concatenate(t) for t in zip(*self.parts)))
            elif self.cpu:
                rows, slot, values, idx = (np.concatenate(t) for t in zip(*self.parts))
                K = np.full((a, width), -np.inf, dtype=values.dtype)
                I = np.full((a, width), _NO_INDEX, dtype=np.int64)
                K[rows, slot], I[rows, slot] = values, idx
                state.merge(self.rows, K, I)
            else:
                rows, slot, values, idx = (torch.cat(t) for t in zip(*self.parts))
                K = torch.full((a, width), -torch.inf, dtype=values.dtype, device=values.device)
                I = torch.full((a, width), _NO_INDEX, dtype=torch.int64, device=values.device)
                K[rows, slot], I[rows, slot] = values, idx
                state.merge(self.rows, K, I)
            self.parts, self.n_pending, self.thr = [], 0, None
            self.filled[:] = 0
        self.merged += self.pending_rows
        self.pending_rows = 0


def topk_blocks(
    query: np.ndarray,
    blocks: Iterable[tuple[np.ndarray, int]],
    k: int,
    metric: str = "cosine",
    *,
    blocks_normalized: bool = False,
    device: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest train rows of every query row, merged over streamed train blocks.

    Parameters
    ----------
    query : array-like of shape (m, d)
        Query features.
    blocks : iterable of (numpy.ndarray, int)
        (train features block, row offset) pairs, in any order and of any size; row
        indices in the result are ``row_offset`` + the row within the block.
    k : int
        Neighbours per query. The result is sorted best first, so its first k' columns
        are the top-k' for every k' < k (one search serves several k).
    metric : str
        ``cosine`` (features L2-normalised here, the store keeps raw features) or
        ``euclidean``.
    blocks_normalized : bool
        The train blocks are already L2-normalised (cosine).
    device : str, torch.device or None
        Compute device (``auto``/None: CUDA when available).

    Returns
    -------
    scores, indices : numpy.ndarray of shape (m, k)
        Best first: cosine similarity (descending) for ``cosine``, Euclidean distance
        (ascending) for ``euclidean``. Equal computed scores are ordered by train
        index (a product may round one ulp apart in blocks of different shapes, which
        then decides instead). Arithmetic is in the inputs' common float dtype
        (float16 computes in float32); float32 rows are normalised by a float32
        division (within one ulp of the float64 one).
    """
    if metric not in METRICS:
        raise unknown_name("metric", metric, METRICS)
    k = _check_k(k)
    query = check_features(query, "query")
    device = resolve_device(device)
    if not _numpy_path(device):
        return _topk_blocks(query, blocks, k, metric, blocks_normalized, device)
    # numpy's BLAS keeps its own thread pool (all cores by default): give it torch's budget
    with _blas_pools().limit(limits=torch.get_num_threads()):
        return _topk_blocks(query, blocks, k, metric, blocks_normalized, device)


def _topk_blocks(query: np.ndarray, blocks: Iterable[tuple[np.ndarray, int]], k: int, metric: str,
                 blocks_normalized: bool, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    m, d = query.shape
    search = None
    n_seen = 0
    for block, offset in blocks:
        block = np.asarray(block)
        if block.ndim != 2 or block.shape[1] != d:
            raise DataValidationError(
                f"train block at row {offset} has shape {block.shape}, but the query has "
                f"{d} features; expected ({block.shape[0] if block.ndim else '?'}, {d})"
            )
        if block.shape[0] == 0:
            continue
        if search is None:  # the common dtype of the query and the first block (float16: float32)
            wide = np.result_type(query.dtype, block.dtype, np.float32) == np.float64
            queries = _Queries(query, metric, device, torch.float64 if wide else torch.float32)
            search = _Search(queries, k, d, normalize=metric == "cosine" and not blocks_normalized)
        search.add(block, offset)
        n_seen += block.shape[0]
    if n_seen < k:
        raise DataValidationError(
            f"k={k} neighbours requested, but the blocks held only {n_seen} train rows"
        )
    search.flush()
    best_keys, best_idx = search.state.result()
    if metric == "euclidean":
        sq_q = search.queries.sq_norms.to(best_keys.dtype)
        best_keys = torch.sqrt(torch.clamp(sq_q[:, None] - best_keys, min=0.0))
    return best_keys.cpu().numpy(), best_idx.cpu().numpy()


def knn_class_weights(
    scores: np.ndarray,
    indices: np.ndarray,
    y_train: np.ndarray,
    n_classes: int,
    weights: str = "exp",
    temperature: float = 0.07,
) -> np.ndarray:
    """Per-class vote weights from a top-k result.

    Parameters
    ----------
    scores, indices : numpy.ndarray of shape (m, k)
        A ``topk_blocks`` result.
    y_train : numpy.ndarray
        Class indices 0..n_classes-1 of the train rows.
    n_classes : int
    weights : str
        ``exp``: w_c = sum exp(s_i / temperature) over kept neighbours of class c
        (``scores`` are cosine similarities); ``uniform``: neighbour counts.
    temperature : float

    Returns
    -------
    numpy.ndarray of shape (m, n_classes)
    """
    if weights not in ("exp", "uniform"):
        raise unknown_name("weights", weights, ("exp", "uniform"))
    labels = np.asarray(y_train)[indices]  # (m, k)
    if weights == "exp":
        if not temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {temperature!r}")
        with np.errstate(over="ignore"):
            w = np.exp(np.asarray(scores, dtype=np.float64) / temperature)
        if not np.isfinite(w).all():
            raise ConfigError(
                f"exp(s / temperature) overflows float64 for temperature={temperature} "
                f"(max score {float(np.max(scores)):.4g}); use temperature >= 0.0015"
            )
    else:
        w = np.ones(labels.shape)
    m = labels.shape[0]
    flat = (np.arange(m)[:, None] * n_classes + labels).ravel()
    return np.bincount(flat, weights=w.ravel(), minlength=m * n_classes).reshape(m, n_classes)


def knn_predict_from_topk(
    scores: np.ndarray,
    indices: np.ndarray,
    y_train: np.ndarray,
    n_classes: int,
    weights: str = "exp",
    temperature: float = 0.07,
) -> np.ndarray:
    """Predicted class indices: argmax of ``knn_class_weights``, ties to the smallest index."""
    return np.argmax(knn_class_weights(scores, indices, y_train, n_classes, weights, temperature), axis=1)


class KNNClassifier(ClassifierMixin, BaseEstimator):
    """Weighted cosine k-NN (default) or plain Euclidean k-NN, via ``topk_blocks``.

    Parameters
    ----------
    n_neighbors : int
        k, at most the number of train rows.
    metric : str
        ``cosine`` (on L2-normalised features) or ``euclidean``.
    weights : str
        ``exp`` (exp(s / temperature), cosine only) or ``uniform`` (majority vote).
    temperature : float
        tau of the ``exp`` weighting.
    block_size : int
        Train rows scored at once.
    device : str, torch.device or None
        Compute device: ``auto``/None (CUDA when available), ``cpu``, ``cuda[:i]``.

    Attributes
    ----------
    classes_ : numpy.ndarray
        The labels as given (sorted).
    n_features_in_ : int

    Notes
    -----
    The train features are kept as given (no normalised copy; blocks are normalised
    when scored). ``decision_function`` returns the class weights w_c (n, K); for two
    classes it returns w_1 - w_0 (n,), positive for classes_[1], as scikit-learn expects.
    """

    def __init__(self, n_neighbors: int = 20, metric: str = "cosine", weights: str = "exp",
                 temperature: float = 0.07, block_size: int = 8192, device: Any = None):
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.weights = weights
        self.temperature = temperature
        self.block_size = block_size
        self.device = device

    def fit(self, X: Any, y: Any) -> KNNClassifier:
        """Keep the train features and labels (checked; nothing else is computed).

        Parameters
        ----------
        X : array-like of shape (n, d)
        y : array-like of shape (n,)
            Class labels of any sortable kind.

        Returns
        -------
        KNNClassifier
            self.
        """
        check_number(self.n_neighbors, "n_neighbors", 1, integer=True)
        check_number(self.temperature, "temperature", 0, low_open=True)
        check_number(self.block_size, "block_size", 1, integer=True)
        check_metric_weights(self.metric, self.weights)
        X = validate_features(self, X, reset=True)
        self.classes_, self._y = encode_labels(y, n_samples=X.shape[0])
        check_min_classes(self.classes_)
        if self.n_neighbors > X.shape[0]:
            raise DataValidationError(
                f"n_neighbors={self.n_neighbors} is larger than the {X.shape[0]} train "
                f"samples; use n_neighbors <= {X.shape[0]}"
            )
        if self.metric == "cosine":  # a zero row is an error now, not at predict time
            step = _per_device(_BUFFER_ROWS, torch.device("cpu"))
            for start in range(0, X.shape[0], step):  # a cheap test; the normalisation names the rows
                if not X[start:start + step].any(axis=1).all():
                    l2_normalize_block(torch.from_numpy(np.array(X[start:start + step])), start, "X")
        self._fit_X = X
        return self

    def _train_blocks(self) -> Iterator[tuple[np.ndarray, int]]:
        for start in range(0, self._fit_X.shape[0], self.block_size):
            yield self._fit_X[start : start + self.block_size], start

    def kneighbors(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """Scores and train indices of the k nearest train rows, best first (see ``topk_blocks``).

        Parameters
        ----------
        X : array-like of shape (m, d)

        Returns
        -------
        scores, indices : numpy.ndarray of shape (m, k)
        """
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        return topk_blocks(X, self._train_blocks(), self.n_neighbors, self.metric, device=self.device)

    def _class_weights(self, X: Any) -> np.ndarray:
        scores, indices = self.kneighbors(X)
        return knn_class_weights(
            scores, indices, self._y, self.classes_.size, self.weights, self.temperature
        )

    def decision_function(self, X: Any) -> np.ndarray:
        """Class weights.

        Parameters
        ----------
        X : array-like of shape (m, d)

        Returns
        -------
        numpy.ndarray
            (m, K); w_1 - w_0 (m,) for two classes.
        """
        check_is_fitted(self)
        w = self._class_weights(X)
        return w[:, 1] - w[:, 0] if self.classes_.size == 2 else w

    def predict(self, X: Any) -> np.ndarray:
        """Class with the largest weight, the smallest class on ties.

        Parameters
        ----------
        X : array-like of shape (m, d)

        Returns
        -------
        numpy.ndarray of shape (m,)
            Labels from ``classes_``.
        """
        check_is_fitted(self)
        return self.classes_[np.argmax(self._class_weights(X), axis=1)]
