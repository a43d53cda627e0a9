"""What a dataset copy holds, for a check before a long run (``repeval datasets show``),
and what a run warns about: classes without images in a split, folders left out, images
that do not decode."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.datasets.base import DatasetAdapter
from pipeline.datasets.registry import make_dataset
from pipeline.errors import DatasetError
from pipeline.terminal import printable

_METRIC_TEXT = {
    "top1": "top-1 accuracy",
    "mean_per_class": "mean per-class accuracy",
    "map11": "11-point mean average precision (VOC 2007 devkit)",
    "miou": "mean IoU over the test set's confusion matrix, and pixel accuracy",
    "angular": "angular error of surface normals: mean, median, % of pixels within 11.25 / 22.5 / 30 degrees",
}
_MODE_TEXT = {
    "stat": "file list with sizes and modification times",
    "content": "file contents (every byte hashed)",
    "generated": "generator parameters (no files)",
}
_SHOWN = 5


def dataset_notes(dataset: DatasetAdapter) -> list[dict[str, Any]]:
    """What a run, ``repeval datasets show`` and the report warn about for ``dataset``."""
    # A class without any image in a split (an empty class folder, or a class that only
    # other splits have) can never be learned from, or never be scored on, that split; an
    # adapter's ``layout_notes()`` adds what its layout left out (hidden folders).
    notes = []
    for split in dataset.splits:
        if split == dataset.pooled_split or getattr(dataset, "dense_task", None):
            continue  # the pooled split: said in the others; a dense split: its image labels are all 0
        labels = dataset.labels(split)
        n = len(dataset.class_names)
        counts = (labels == 1).sum(axis=0) if labels.ndim == 2 else np.bincount(labels, minlength=n)
        empty = [dataset.class_names[i] for i, c in enumerate(counts[:len(dataset.class_names)]) if c == 0]
        if empty:
            notes.append({"where": f"{dataset.name}/{split}", "kind": "empty_classes", "items": empty,
                          "what": f"{len(empty)} class(es) without any image in split {split!r}"})
    layout = getattr(dataset, "layout_notes", None)
    return notes + (list(layout()) if callable(layout) else [])


def note_line(note: dict[str, Any], shown: int = _SHOWN) -> str:
    """One line of a note: where, what, and the first items named."""
    items = [str(i) for i in note.get("items") or []]
    more = f", ... ({len(items)} in all)" if len(items) > shown else ""
    return f"{note['where']}: {note['what']}" + (f": {', '.join(items[:shown])}{more}" if items else "")


def undecodable(dataset: DatasetAdapter) -> dict[str, list[str]]:
    """Every image that does not decode, by split (ids; the pooled split is not read twice)."""
    # Each image is decoded in full, whether or not the adapter was built with ``skip_bad``
    # (then the ones it skipped are already named by ``skipped``).
    out: dict[str, list[str]] = {}
    for split in dataset.splits:
        if split == dataset.pooled_split or not dataset.has_images:
            continue
        ids = dataset.sample_ids(split)
        bad = []
        for i in range(len(ids)):
            try:
                dataset.load_image(split, i)
            except (DatasetError, OSError):
                bad.append(ids[i])
        out[split] = bad
    return out


def bad_targets(dataset: DatasetAdapter) -> dict[str, list[str]]:
    """Every per-pixel target that a run would refuse, by split: each decoded and checked as
    an extraction does (format, values, size), the message naming its file."""
    out: dict[str, list[str]] = {}
    if not getattr(dataset, "dense_task", None):
        return out
    for split in dataset.splits:
        if split == dataset.pooled_split:
            continue
        bad = []
        for i in range(len(dataset.sample_ids(split))):
            try:
                dataset.load_target(split, i)  # type: ignore[attr-defined]
            except (DatasetError, OSError) as exc:
                bad.append(str(exc))
        out[split] = bad
    return out


def dataset_summary(dataset: DatasetAdapter, decode: bool = True) -> dict[str, Any]:
    """Everything ``repeval datasets show`` prints, JSON-able.

    Parameters
    ----------
    dataset : a constructed adapter (its files have been listed).
    decode : decode every image and name those that fail (:func:`undecodable`).

    Returns
    -------
    dict
        ``adapter``, ``name``, the adapter's ``metadata()`` (``metric``, ``multi_label``,
        ``validation``, ``fingerprint_mode`` ...), ``num_classes``, ``class_names``,
        ``roles`` (train/val/test/pooled split names),
        ``params`` (the adapter's description without class names), ``splits`` (one
        ``DatasetAdapter.info`` dict per split), ``notes`` (:func:`dataset_notes`) and
        ``undecodable`` (split -> ids; None when not decoded), ``bad_targets`` (a dense
        dataset's :func:`bad_targets`; None when not decoded).
    """
    params = {k: v for k, v in dataset.describe().items() if k != "class_names"}
    meta = dataset.metadata()
    roles = {"train": meta.pop("train_split"), "val": meta.pop("val_split"), "test": meta.pop("test_split"),
             "pooled": meta.pop("pooled_split")}
    return {
        "adapter": dataset.adapter, "name": dataset.name, **meta,
        "num_classes": len(dataset.class_names), "class_names": list(dataset.class_names),
        "roles": {k: v for k, v in roles.items() if v in dataset.splits}, "params": params,
        "splits": [dataset.info(split) for split in dataset.splits],
        "notes": dataset_notes(dataset), "undecodable": undecodable(dataset) if decode else None,
        "bad_targets": bad_targets(dataset) if decode else None,
    }


def _validation_text(validation: dict[str, Any]) -> str:
    if validation.get("source") == "split":
        return f"the authors' split {validation['split']!r}"
    if validation.get("source") == "none":
        return f"none: {validation.get('why', 'nothing is selected')}"
    kind = "stratified, " if validation.get("stratified") else ""
    return (f"{100 * validation.get('fraction', 0.2):g} % of train ({kind}seeded), drawn by "
            f"{validation.get('drawn_by', 'the probe')}")


def _labels_text(summary: dict[str, Any]) -> str:
    if summary.get("dense_task") == "segmentation":
        return f"per-pixel class maps beside the images; {summary.get('ignore_index', 255)} is ignored"
    if summary.get("dense_task") == "normals":
        return "per-pixel unit normals beside the images; the zero vector where invalid"
    return "multi-label (n, C); -1 marks difficult" if summary["multi_label"] else "one class per image"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as the lines a terminal shows.

    Parameters
    ----------
    summary : dict
        From :func:`dataset_summary`.

    Returns
    -------
    str
        Names from the copy (classes, skipped files, the root) printed escaped.
    """
    names = summary["class_names"]
    shown = ", ".join(map(printable, names[:_SHOWN])) + (", ..." if len(names) > _SHOWN else "")
    mode = summary["splits"][0]["fingerprint_mode"] if summary["splits"] else ""
    where = summary["params"].get("root") or summary["params"].get("csv_path") or summary["params"].get("path")
    lines = [f"dataset {summary['name']} (adapter {summary['adapter']})"]
    if where:
        lines.append(f"  root         {printable(where)}")
    lines += [
        f"  classes      {summary['num_classes']} ({shown})",
        f"  metric       {summary['metric']}: {_METRIC_TEXT.get(summary['metric'], summary['metric'])}",
        f"  labels       {_labels_text(summary)}",
        f"  validation   {_validation_text(summary['validation'])}",
        f"  fingerprint  {mode}: {_MODE_TEXT.get(mode, mode)}",
        "",
    ]
    role_of = {v: k for k, v in summary["roles"].items()}
    header = ["split", "images", "classes", "skipped", "fingerprint", "role"]
    rows = [[s["split"], str(s["samples"]), str(s["classes"]), str(len(s["skipped"])), s["fingerprint"][:16],
             role_of.get(s["split"], "")] for s in summary["splits"]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    for s in summary["splits"]:
        if s["skipped"]:
            more = f", ... ({len(s['skipped'])} in all)" if len(s["skipped"]) > _SHOWN else ""
            lines.append(f"  skipped in {s['split']}: {', '.join(map(printable, s['skipped'][:_SHOWN]))}{more}")
    bad = summary.get("undecodable")
    if bad is None:
        lines.append("  decoded      no (--no-decode)")
    else:
        total = sum(len(v) for v in bad.values())
        lines.append(f"  decoded      every image: {total} undecodable" if total else
                     "  decoded      every image: all decode")
        for split, ids in bad.items():  # every one named: this is the check before a long run
            if ids:
                lines.append(f"  undecodable in {split}: {', '.join(map(printable, ids))}")
        if total and summary["params"].get("skip_bad") is False:  # an adapter that can leave them out
            lines.append("  an extraction stops at the first of these; `skip_bad: true` in the dataset's params "
                         "(--param skip_bad=true) leaves them out")
    targets = summary.get("bad_targets")
    if targets:  # a dense dataset, decoded: every target checked as a run would
        total = sum(len(v) for v in targets.values())
        lines.append(f"  targets      every target checked: {total} refused" if total else
                     "  targets      every target checked: all read")
        lines += [f"  bad target in {split}: {printable(m)}" for split, messages in targets.items() for m in messages]
    lines += [f"  warning: {printable(note_line(n))}" for n in summary.get("notes") or []]
    return "\n".join(lines)


def show_dataset(adapter: str, params: dict[str, Any], name: str | None = None, as_json: bool = False,
                 decode: bool = True) -> str:
    """Build ``adapter`` with ``params`` (reading its copy) and describe it as text or JSON.

    Parameters
    ----------
    adapter : registered adapter name.
    params : its constructor parameters (``root`` ...).
    name : dataset name (default: the adapter's).
    as_json : JSON instead of the terminal layout.
    decode : decode every image and name those that fail.

    Returns
    -------
    str
        What ``repeval datasets show`` prints.
    """
    import json

    summary = dataset_summary(make_dataset(adapter, name=name, **params), decode=decode)
    return json.dumps(summary, indent=1) if as_json else format_summary(summary)
