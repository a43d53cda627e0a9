"""Fingerprints that decide whether two cells' evidence can be paired.

A paired comparison is valid only when both encoders were scored on the same test examples
in the same order (classification), or on the same episodes (few-shot). Episodes depend
only on the sampler, its seed, the label of each pooled image (in pooled order) and the
episode shape, never on the features, so two encoders given the same fingerprint saw the
same support and query images.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.episodic.fewshot import EPISODE_SAMPLER_VERSION

__all__ = ["EPISODE_SAMPLER_VERSION", "check_paired", "evidence_sha256", "episodes_fingerprint", "labels_fingerprint"]


def labels_fingerprint(y_true: object) -> str:
    """SHA-256 of a label array: its shape and its values as little-endian int64.

    Integer and boolean arrays with the same values give the same fingerprint whatever
    their dtype (int16 class indices hash like int64 ones); a multi-label indicator matrix
    hashes with its (examples, classes) shape.

    Parameters
    ----------
    y_true : array-like of int or bool
        Class indices (n,) or a 0/1 indicator matrix (n, n_classes).

    Returns
    -------
    str
        Hex digest.
    """
    y = np.asarray(y_true)
    if not (y.dtype == bool or np.issubdtype(y.dtype, np.integer)):
        raise DataValidationError(f"labels must be integers or booleans, got dtype {y.dtype}")
    digest = hashlib.sha256(f"labels\x00{y.shape}\n".encode())
    digest.update(np.ascontiguousarray(y, dtype="<i8").tobytes())
    return digest.hexdigest()


def episodes_fingerprint(
    labels: object, seed: int, n_way: int, n_shot: int, n_query: int, n_episodes: int
) -> str:
    """SHA-256 identifying a set of few-shot episodes.

    Parameters
    ----------
    labels : array-like of int, shape (n,)
        Label of each image of the pool the episodes are drawn from, in pool order.
    seed : int
        The sampler's seed.
    n_way, n_shot, n_query, n_episodes : int
        The episode shape and count.

    Returns
    -------
    str
        Hex digest over the sampler version, these settings and :func:`labels_fingerprint`.
    """
    settings = {
        "sampler": EPISODE_SAMPLER_VERSION,
        "seed": int(seed),
        "n_way": int(n_way),
        "n_shot": int(n_shot),
        "n_query": int(n_query),
        "n_episodes": int(n_episodes),
        "labels": labels_fingerprint(labels),
    }
    return hashlib.sha256(("episodes\x00" + json.dumps(settings, sort_keys=True)).encode()).hexdigest()


def check_paired(fingerprint_a: str, fingerprint_b: str, what: str = "test labels") -> None:
    """Raise unless two cells' evidence fingerprints agree, so their outputs can be paired.

    Parameters
    ----------
    fingerprint_a, fingerprint_b : str
        :func:`labels_fingerprint` (classification) or :func:`episodes_fingerprint`
        (few-shot) of the cells of encoders A and B.
    what : str
        What the fingerprints cover, for the message.

    Returns
    -------
    None
    """
    for name, value in (("fingerprint_a", fingerprint_a), ("fingerprint_b", fingerprint_b)):
        if not isinstance(value, str) or not value:
            raise DataValidationError(f"{name} must be a non-empty fingerprint string, got {value!r}")
    if fingerprint_a != fingerprint_b:
        raise DataValidationError(
            f"The two cells were not scored on the same {what} (fingerprint {fingerprint_a[:12]} vs "
            f"{fingerprint_b[:12]}): a paired comparison needs the same examples or episodes, in the "
            "same order. Re-run both encoders on the current data."
        )


def evidence_sha256(values: object) -> str:
    """SHA-256 of a stored evidence array: its dtype, its shape and its bytes (little-endian).

    Recomputed from the array read back, it tells whether stored predictions, scores or
    episode accuracies are still the ones a record was made from.

    Parameters
    ----------
    values : numpy.ndarray
        The array as stored (its dtype is part of the digest).

    Returns
    -------
    str
        Hex digest.
    """
    arr = np.asarray(values)
    little = arr.dtype.newbyteorder("<")
    digest = hashlib.sha256(f"evidence\x00{little.str}\x00{arr.shape}\n".encode())
    digest.update(np.ascontiguousarray(arr, dtype=little).tobytes())
    return digest.hexdigest()
