"""Episodic N-way K-shot evaluation with a nearest-centroid classifier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.inputs.devices import resolve_device

CI_Z = 1.96
#: Memory bounds per block of episodes: random sampling keys (float64) and gathered
#: features (float64), in elements.
MAX_KEY_ELEMENTS = 1 << 20
MAX_FEATURE_ELEMENTS = 1 << 21
#: Bump when :func:`sample_episodes` changes the episodes a seed gives: stored per-episode
#: accuracies carry it in their fingerprint, so old and new episodes are never paired.
EPISODE_SAMPLER_VERSION = 1

__all__ = ["EPISODE_SAMPLER_VERSION", "Episodes", "FewShotResult", "episode_accuracies", "fewshot_episodes",
           "sample_episodes"]


@dataclass(frozen=True)
class FewShotResult:
    """Mean episode accuracy (a fraction) and its 95 % interval half-width.

    Parameters
    ----------
    mean, ci95, std : float
        ``ci95`` = 1.96 * ``std`` / sqrt(``n_episodes``), ``std`` = np.std(accuracies)
        (ddof = 0).
    accuracies : numpy.ndarray
        Per episode (read-only).
    n_way, n_shot, n_query, n_episodes, seed : int
        The settings.
    eligible_classes : tuple of int
        The labels with at least n_shot + n_query images.
    """

    mean: float
    ci95: float
    std: float
    accuracies: np.ndarray
    n_way: int
    n_shot: int
    n_query: int
    n_episodes: int
    eligible_classes: tuple[int, ...]
    seed: int


class Episodes(NamedTuple):
    """Sampled episodes: sample indices into X / y and the drawn class labels."""

    classes: np.ndarray  # (n_episodes, n_way) class labels
    support: np.ndarray  # (n_episodes, n_way, n_shot) row indices
    query: np.ndarray  # (n_episodes, n_way, n_query) row indices
    eligible: np.ndarray  # labels with at least n_shot + n_query images


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataValidationError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _eligible_classes(labels: np.ndarray, n_way: int, n_shot: int, n_query: int) -> np.ndarray:
    classes, counts = np.unique(labels, return_counts=True)
    need = n_shot + n_query
    if classes.size < n_way:
        raise DataValidationError(
            f"n_way={n_way} needs at least {n_way} classes, but y has only {classes.size}: "
            f"{classes.tolist()}"
        )
    ok = counts >= need
    if ok.sum() < n_way:
        order = np.argsort(-counts, kind="stable")
        top = ", ".join(f"{classes[i]}: {counts[i]}" for i in order[:10])
        max_shot = int(counts[order[n_way - 1]]) - n_query
        hint = (
            f" With n_query={n_query}, n_shot can be at most {max_shot}."
            if max_shot >= 1
            else f" Even n_shot=1 is impossible with n_query={n_query}."
        )
        raise DataValidationError(
            f"{n_way}-way {n_shot}-shot episodes with {n_query} queries need {n_way} classes with at "
            f"least n_shot + n_query = {need} images each, but only {int(ok.sum())} of "
            f"{classes.size} classes qualify: {classes[ok].tolist()[:50]}. Largest class sizes "
            f"(label: count): {top}.{hint}"
        )
    return classes[ok]


def sample_episodes(labels: np.ndarray, n_way: int, n_shot: int, n_query: int, n_episodes: int,
                    seed: int) -> Episodes:
    """Draw every episode's classes and support/query indices, vectorised over episodes."""
    eligible = _eligible_classes(labels, n_way, n_shot, n_query)
    need = n_shot + n_query
    # Two independent streams (classes, members), each consumed in episode order, so the
    # episodes do not depend on the block size.
    class_rng, member_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))

    # Members of each eligible class as rows of a padded (n_eligible, max_count) matrix.
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.searchsorted(sorted_labels, eligible, side="left")
    counts = np.searchsorted(sorted_labels, eligible, side="right") - starts
    max_count = int(counts.max())
    slot = np.arange(max_count)
    valid = slot[None, :] < counts[:, None]
    members = np.where(valid, order[np.minimum(starts[:, None] + slot[None, :], labels.size - 1)], -1)

    way = np.empty((n_episodes, n_way), dtype=np.int64)  # positions in `eligible`
    idx = np.empty((n_episodes, n_way, need), dtype=np.int64)
    block = max(1, MAX_KEY_ELEMENTS // max(eligible.size, n_way * max_count))
    for start in range(0, n_episodes, block):
        b = min(block, n_episodes - start)
        # Classes: the n_way smallest of uniform keys = a uniform draw without replacement.
        w = np.argsort(class_rng.random((b, eligible.size)), axis=1)[:, :n_way]
        way[start : start + b] = w
        keys = member_rng.random((b, n_way, max_count))
        keys[~valid[w]] = np.inf  # padding is never drawn
        # The `need` smallest keys are a uniform subset; sorting them by key makes the
        # support/query split (first n_shot / the rest) uniform as well.
        pick = np.argpartition(keys, need - 1, axis=2)[:, :, :need]
        pick = np.take_along_axis(pick, np.argsort(np.take_along_axis(keys, pick, axis=2), axis=2), axis=2)
        idx[start : start + b] = members[w[:, :, None], pick]
    return Episodes(
        classes=eligible[way],
        support=idx[:, :, :n_shot],
        query=idx[:, :, n_shot:],
        eligible=eligible,
    )


def episode_accuracies(rows: FeatureRows | np.ndarray, support: np.ndarray, query: np.ndarray,
                       device: Any = None) -> np.ndarray:
    """Nearest-centroid accuracy of every episode, in blocks of episodes, float64 on ``device``."""
    import torch

    rows, device = FeatureRows.of(rows), resolve_device(device)
    n_episodes, n_way, n_shot = support.shape
    n_query = query.shape[2]
    d = rows.n_features
    truth = torch.arange(n_way, device=device).repeat_interleave(n_query)  # way of each query
    acc = np.empty(n_episodes, dtype=np.float64)
    block = max(1, MAX_FEATURE_ELEMENTS // (n_way * (n_shot + n_query) * d))
    for start in range(0, n_episodes, block):
        stop = min(start + block, n_episodes)
        proto = torch.from_numpy(rows.take(support[start:stop])).to(device, torch.float64).mean(dim=2)
        q = torch.from_numpy(rows.take(query[start:stop])).to(device, torch.float64)
        q = q.reshape(stop - start, n_way * n_query, d)
        # ||q - p||^2 = ||q||^2 - 2 q.p + ||p||^2, all ways and queries by one batched product
        d2 = ((q * q).sum(dim=2)[:, :, None] - 2.0 * torch.bmm(q, proto.transpose(1, 2))
              + (proto * proto).sum(dim=2)[:, None, :])
        acc[start:stop] = (d2.argmin(dim=2) == truth).to(torch.float64).mean(dim=1).cpu().numpy()
    return acc


def fewshot_episodes(
    X: Any,
    y: Any,
    n_way: int = 5,
    n_shot: int = 20,
    n_query: int = 15,
    n_episodes: int = 600,
    seed: int = 0,
    device: Any = None,
) -> FewShotResult:
    """Mean accuracy and 95 % interval of nearest-centroid N-way K-shot episodes.

    Parameters
    ----------
    X : array-like of shape (n, d) or FeatureRows
        Features (pool train, val and test as Ericsson do); streamed parts are read once,
        keeping only the rows the episodes use.
    y : array-like of shape (n,)
        Integer class labels.
    n_way, n_shot, n_query, n_episodes, seed : int
        Classes per episode, support and query images per class, episodes, seed.
    device : str, torch.device or None
        Compute device of the distances (``auto``/None: CUDA when available).

    Returns
    -------
    FewShotResult

    Raises
    ------
    DataValidationError
        Naming the qualifying classes when fewer than ``n_way`` classes have
        ``n_shot + n_query`` images; bad settings or arrays.
    """
    # deferred: scikit-learn's input checks; the episode sampler's version is imported by the evidence, which
    # the registry and the comparison of stored results import, and they fit nothing
    from pipeline.protocols.inputs.features import check_features
    from pipeline.protocols.inputs.labels import check_class_indices

    n_way = _check_int(n_way, "n_way", 2)
    n_shot = _check_int(n_shot, "n_shot", 1)
    n_query = _check_int(n_query, "n_query", 1)
    n_episodes = _check_int(n_episodes, "n_episodes", 1)
    seed = _check_int(seed, "seed", 0)
    rows = X if isinstance(X, FeatureRows) else FeatureRows.of(check_features(X, "X"))
    labels = check_class_indices(y, n_samples=len(rows), name="y")
    episodes = sample_episodes(labels, n_way, n_shot, n_query, n_episodes, seed)
    used = np.concatenate([episodes.support.ravel(), episodes.query.ravel()])
    acc = episode_accuracies(rows.cached(used), episodes.support, episodes.query, device)
    acc.setflags(write=False)
    std = float(np.std(acc))
    return FewShotResult(
        mean=float(acc.mean()),
        ci95=CI_Z * std / float(np.sqrt(n_episodes)),
        std=std,
        accuracies=acc,
        n_way=n_way,
        n_shot=n_shot,
        n_query=n_query,
        n_episodes=n_episodes,
        eligible_classes=tuple(int(c) for c in episodes.eligible),
        seed=seed,
    )
