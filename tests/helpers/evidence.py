"""A small real store for paired comparisons: digits pixels imported as the features of
several "encoders" that differ by the noise added to them (more noise, lower accuracy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jobs.evaluation.evaluate import Cell, evaluate_cell
from storage_schema import ArraySpec, FeatureStore, feature_key, features_group_key, stable_hash

DATASET = "digitsnpz"
#: Cheap settings of the protocols whose evidence is compared.
SETTINGS = {
    "knn": ("knn", {"n_neighbors": 10}),
    # raw noisy pixels want more shrinkage than the default grid's 1e4: a grid that brackets it
    "ridge": ("ridge", {"alphas": [10.0 ** k for k in range(-8, 8)]}),
    "logistic": ("logistic", {"Cs": None, "C": 1.0, "max_iter": 300}),
    "few": ("fewshot", {"n_way": 5, "n_shot": 5, "n_query": 10, "n_episodes": 60}),
    "low": ("lowshot", {"shots": [2, 8], "n_seeds": 3}),
}


def digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits pixels (float32, a little jitter so there are no exact distance ties), split 70/30."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = X + np.random.default_rng(seed).normal(scale=0.05, size=X.shape)
    return tuple(train_test_split(X.astype(np.float32), y, test_size=0.3, stratify=y, random_state=0))


def put_labels(store: FeatureStore, dataset: str, split: str, labels: np.ndarray, **attrs) -> str:
    """Store a split's labels (1-D classes, or (n, C) multi-label rows); their key."""
    fp = stable_hash([dataset, split, np.asarray(labels).tolist()])
    return store.write_labels(dataset, split, labels, {"fingerprint": fp, "class_names": [], **attrs}).key


def put_features(store: FeatureStore, model: str, dataset: str, split: str, X: np.ndarray, labels_key: str,
                 layer: str = "pre_logits") -> str:
    """Store one encoder's features of a split (one chunk), pointing at ``labels_key``."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    key = feature_key(model, dataset, split, layer)
    attrs = {"fingerprint": stable_hash([model, dataset, split, layer, X.tobytes().hex()[:4096], X.shape]),
             "labels": labels_key, "model": model, "dataset": dataset, "split": split, "layer": layer,
             "encoder": {"name": model, "source": "test"}}
    with store.lease(features_group_key(model, dataset, split)) as lease:
        store.write_arrays(lease, [ArraySpec(key, X.shape, X.shape[0], "float32", attrs)], lambda todo: [(0, {key: X})])
    return key


def noisy_encoders(root: Path, noise: dict[str, float], store: FeatureStore | None = None,
                   dataset: str = DATASET, layer: str = "pre_logits") -> FeatureStore:
    """A store with one encoder per ``noise`` entry (name -> scale of the noise added to the
    pixels), all on the same stored labels."""
    Xtr, Xte, ytr, yte = digits_split()
    store = store or FeatureStore(str(root / "store"))
    labels = {"train": put_labels(store, dataset, "train", ytr), "test": put_labels(store, dataset, "test", yte)}
    for i, (name, scale) in enumerate(noise.items()):
        rng = np.random.default_rng(100 + i)
        for split, X in (("train", Xtr), ("test", Xte)):
            put_features(store, name, dataset, split, X + rng.normal(scale=scale, size=X.shape), labels[split], layer)
    return store


def evaluate_all(store: FeatureStore, models, settings=SETTINGS, dataset: str = DATASET) -> dict:
    """Evaluate every (model, setting) cell; the records by (model, setting)."""
    out = {}
    for model in models:
        for name, (protocol, params) in settings.items():
            out[model, name] = evaluate_cell(store, Cell(model, dataset, "pre_logits", name, protocol, params)).record
    return out
