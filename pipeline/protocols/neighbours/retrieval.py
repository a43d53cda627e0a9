"""``retrieval``: each test image queries the train set; mAP@R, recall@1 and recall@5."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import STREAM_BLOCK_ROWS
from pipeline.protocols.cell import CellShape
from pipeline.protocols.evidence import Evidence, values_fingerprint
from pipeline.protocols.fit_warnings import fit_warning
from pipeline.protocols.memory import F8, RUNTIME, feature_rows, features, labels, matrix, peak, work
from pipeline.protocols.neighbours.pairs import QUERY_CACHE_BYTES
from pipeline.protocols.registry import EvalData, ProtocolResult, at_least, register_protocol

__all__ = ["RECALL_AT", "RETRIEVAL_METRICS", "average_precision_at_r", "class_counts", "random_map_at_r",
           "recall_at_k", "retrieval_depth", "retrieval_memory"]

#: The k of the recall@k metrics.
RECALL_AT = (1, 5)
#: Scalar metrics of a retrieval record; the first is the headline.
RETRIEVAL_METRICS = ("map_at_r", *(f"recall_at_{k}" for k in RECALL_AT))
_CHUNK = 1024  # queries whose (chunk x depth) relevance arrays are formed at once
_SCORE_CHUNK = 1 << 22  # elements of the search's score tile, as k-NN's
_MERGE_ROWS = 4096  # queries of one of the search's chunks at most (its score budget over a 2,048-row tile)


def class_counts(y_train: np.ndarray, y_test: np.ndarray) -> np.ndarray:
    """R of every query: the train items sharing its label."""
    y_train, y_test = np.asarray(y_train), np.asarray(y_test)
    size = int(max(y_train.max(initial=-1), y_test.max(initial=-1))) + 1
    return np.bincount(y_train, minlength=size)[y_test].astype(np.int64)


def retrieval_depth(R: np.ndarray, n_train: int, max_rank: int) -> int:
    """Ranks the search keeps: max(R) capped at ``max_rank``, at least max(``RECALL_AT``), at most the train rows."""
    return int(min(n_train, max(min(int(R.max(initial=0)), int(max_rank)), max(RECALL_AT))))


def average_precision_at_r(relevant: np.ndarray, R: np.ndarray) -> np.ndarray:
    """AP@R of each query from the relevance of its first ranks."""
    m, depth = relevant.shape
    out = np.full(m, np.nan)
    for i in range(0, m, _CHUNK):
        rel, r = relevant[i:i + _CHUNK], R[i:i + _CHUNK]
        ranks = np.arange(1, depth + 1)
        precision = np.cumsum(rel, axis=1, dtype=np.float64) / ranks
        within = ranks[None, :] <= r[:, None]  # the first R ranks only
        with np.errstate(invalid="ignore", divide="ignore"):
            out[i:i + _CHUNK] = np.where(r > 0, (precision * (rel & within)).sum(axis=1) / r, np.nan)
    return out


def recall_at_k(relevant: np.ndarray, k: int) -> np.ndarray:
    """Whether each query holds an item of its class among its first k ranks (0/1 as float)."""
    return relevant[:, :k].any(axis=1).astype(np.float64)


def random_map_at_r(R: np.ndarray, n_train: int) -> float:
    """The expected mAP@R of a random ranking: the chance level of ``map_at_r``."""
    # For R relevant items among N placed at random, E[rel_i * P@i] = (R/N) (1 + (i - 1)(R - 1)/(N - 1)) / i,
    # so E[AP@R] = (H_R + (R - H_R)(R - 1)/(N - 1)) / N with H_R the R-th harmonic number,
    # averaged over the queries with R > 0 (R/N, the expected R-precision, is larger: most
    # of a random ranking's precision sits below rank R, where AP@R does not look).
    R = np.asarray(R, dtype=np.float64)
    R = R[R > 0]
    if R.size == 0:
        return float("nan")
    harmonic = np.cumsum(1.0 / np.arange(1, int(R.max()) + 1))[R.astype(np.int64) - 1]
    n = float(n_train)
    pairs = (R - harmonic) * (R - 1) / (n - 1) if n > 1 else 0.0
    return float(np.mean((harmonic + pairs) / n))


def _retrieval_chance(data: EvalData) -> tuple[float, str]:
    return (random_map_at_r(class_counts(data.y_train, data.y_test), len(data.y_train)),
            "a random ranking's expected mAP@R")


def retrieval_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """Retrieval (streams the train split): k-NN's search at depth ``max_rank`` and the relevance arrays."""
    depth = min(int(s.get("max_rank", 1000)), c.n_train) if c.n_train else int(s.get("max_rank", 1000))
    return peak(features=features(c, streams=True), labels=labels(c),
                # each query's top-depth (score, index) pairs as k-NN's state keeps them (packed int64, or
                # float64 + int64), then as the result unpacks them: 32 bytes a query and rank at most
                top_k=matrix(c.n_test, depth, copies=2, itemsize=F8 + F8),
                # a query chunk's merge of its state with as many candidates (k-NN's _State.merge)
                merge=matrix(min(c.n_test, _MERGE_ROWS), 2 * depth, copies=2, itemsize=F8 + F8),
                # a chunk's relevance arrays: labels, precision, masks (float64 or smaller)
                relevance=matrix(min(c.n_test, _CHUNK), depth, copies=5),
                per_query=matrix(c.n_test, 4), block=feature_rows(STREAM_BLOCK_ROWS, c, copies=2),
                queries=min(QUERY_CACHE_BYTES, work(c.n_test * c.dim)), scores=work(_SCORE_CHUNK, copies=3),
                runtime=RUNTIME)


@register_protocol(
    "retrieval", version=1,
    defaults={"max_rank": 1000},
    bounds={"max_rank": at_least(max(RECALL_AT))},
    # cheap: a shallow ranking (the per-protocol tests' classes hold thousands of train rows)
    runs_on_device=True, streams_train=True, memory=retrieval_memory, cheap_settings={"max_rank": 100}, slow=True,
    metrics=RETRIEVAL_METRICS, primary_metric="map_at_r", kind="retrieval", chance=_retrieval_chance,
    description="image retrieval of the test split in the train split: mAP@R, recall@1/5 (Musgrave 2020); "
                "streams train blocks",
    about="Each test image is a query ranked against every train image by cosine similarity on L2-normalised "
          "features, with k-NN's search (one pass at depth max(R), capped by `max_rank`; equal similarities "
          "ranked by train row, the lower first). `map_at_r` is mAP@R (Musgrave, Belongie and Lim 2020, "
          "\"A metric learning reality check\"): for a query whose class has R train images, the mean over "
          "its first R ranks of the precision at each rank holding an image of its class, averaged over the "
          "queries; `recall_at_k` is the share of queries with an image of their class among the first k. "
          "Paired comparisons pair the queries' own AP@R (evidence `values`). A query whose class has no "
          "train image is left out (`no_relevant`); a query whose R exceeds `max_rank` is scored on its "
          "first `max_rank` ranks only, a lower bound (`rank_truncated`, unreliable).",
    setting_help={"max_rank": "the deepest rank the search keeps (memory: at most 32 bytes per query and rank); a class "
                              "with more train images than this makes mAP@R a lower bound, flagged "
                              "`rank_truncated`"},
    warning_codes={
        "rank_truncated": ("unreliable", "a query's class has more train items (R) than `max_rank`: its AP@R "
                                         "counts only the first `max_rank` ranks, so mAP@R is a lower bound"),
        "no_relevant": ("caution", "a query's class has no train item: its AP@R and recall are undefined and "
                                   "it is left out of the means"),
    },
)
def _retrieval(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch loads when a cell runs, not when the registry is read
    from pipeline.protocols.inputs.devices import resolve_device
    from pipeline.protocols.neighbours.knn import topk_blocks
    from pipeline.protocols.neighbours.protocols import search_blocks

    y_train, y_test = np.asarray(data.y_train), np.asarray(data.y_test)
    R = class_counts(y_train, y_test)
    n_train, depth = len(y_train), retrieval_depth(R, len(y_train), s["max_rank"])
    if n_train < max(RECALL_AT):
        raise DataValidationError(f"retrieval needs at least {max(RECALL_AT)} train rows for recall@"
                                  f"{max(RECALL_AT)}, got {n_train}")
    device = resolve_device(s["device"])
    _, idx = topk_blocks(data.X_test, search_blocks(data, device), depth, "cosine", device=device)

    ap, hits = np.full(len(y_test), np.nan), {k: np.full(len(y_test), np.nan) for k in RECALL_AT}
    for i in range(0, len(y_test), _CHUNK):
        relevant = y_train[idx[i:i + _CHUNK]] == y_test[i:i + _CHUNK, None]
        ap[i:i + _CHUNK] = average_precision_at_r(relevant, R[i:i + _CHUNK])
        for k in RECALL_AT:
            hits[k][i:i + _CHUNK] = recall_at_k(relevant, k)
    defined = R > 0
    warnings, n_defined = [], int(defined.sum())
    if n_defined < len(R):
        warnings.append(fit_warning("no_relevant", f"{len(R) - n_defined} of {len(R)} queries have no train item "
                                                   "of their class: left out of mAP@R and recall@k"))
    truncated = int((R > depth).sum())
    if truncated:
        warnings.append(fit_warning("rank_truncated", f"{truncated} of {len(R)} queries have more train items of "
                                                      f"their class (up to R = {int(R.max())}) than max_rank = "
                                                      f"{s['max_rank']}: mAP@R is a lower bound; raise max_rank"))
    mean = (lambda v: float(np.mean(v[defined]))) if n_defined else (lambda v: float("nan"))
    metrics = {"map_at_r": mean(ap), **{f"recall_at_{k}": mean(hits[k]) for k in RECALL_AT}}
    diagnostics = {"n_train": n_train, "n_queries": int(len(R)), "depth": depth, "max_r": int(R.max(initial=0)),
                   "rank_truncated": truncated, "no_relevant": int(len(R) - n_defined), "device": str(device)}
    evidence = Evidence.of_values(np.where(defined, ap, np.nan), values_fingerprint(y_test, y_train), "map_at_r") \
        if n_defined else None
    return ProtocolResult(metrics, diagnostics, warnings, evidence=evidence)
