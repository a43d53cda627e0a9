"""What the dataset adapters tolerated, as read back from the store: unreadable images left
out (``skip_bad``), classes without images in a split, folders the layout left out (hidden
ones), and classes too small for few-shot episodes. Shown by the run's summary, ``repeval ls`` and the report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from pipeline.errors import RepevalError


def label_notes(store, datasets: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """Notes on the stored labels of each (dataset, split): images left out, empty classes."""
    notes: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for dataset, split in datasets:
        try:
            labels = store.labels(dataset, split)
        except RepevalError:  # not extracted yet
            continue
        where = f"{dataset}/{split}"
        skipped = [str(s) for s in labels.attrs.get("skipped_ids") or []]
        if skipped:
            notes.append({"where": where, "what": f"{len(skipped)} unreadable image(s) left out (skip_bad)",
                          "items": skipped, "kind": "skipped"})
        names = list(labels.attrs.get("class_names") or [])
        if names and not labels.attrs.get("dense_task"):  # a dense split's image labels are all 0: no class count
            counts = _class_counts(labels.read(), len(names))
            empty = [names[i] for i, c in enumerate(counts) if c == 0]
            if empty:
                notes.append({"where": where, "what": f"{len(empty)} class(es) without any image",
                              "items": empty, "kind": "empty_classes"})
        for note in labels.attrs.get("layout_notes") or []:  # folders the adapter left out (hidden)
            if (note.get("where"), note.get("what")) not in seen:
                seen.add((note.get("where"), note.get("what")))
                notes.append(dict(note))
    return notes


def _class_counts(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Images per class: single-label rows hold a class index, multi-label rows hold 1 where
    the class is present (0 absent, -1 difficult)."""
    if labels.ndim == 2:
        return (labels == 1).sum(axis=0)
    return np.bincount(labels, minlength=n_classes)


def fewshot_notes(records: Iterable[Mapping[str, Any]], class_counts: Mapping[str, int]) -> list[dict[str, Any]]:
    """Few-shot cells that drew their episodes from fewer classes than the dataset has."""
    notes: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        eligible = (r.get("diagnostics") or {}).get("eligible_classes")
        total = class_counts.get(str(r.get("dataset")))
        key = (str(r.get("dataset")), str(r.get("setting")))
        if isinstance(eligible, int) and total and eligible < total and key not in notes:
            s = r.get("settings") or {}
            notes[key] = {"where": f"{key[0]}, few-shot setting {key[1]}",
                          "what": f"only {eligible} of {total} classes have the {s.get('n_shot')} + "
                                  f"{s.get('n_query')} images an episode needs; the others are left out of "
                                  "its episodes", "items": [], "kind": "small_classes"}
    return list(notes.values())
