"""What a dataset copy holds, for a check before a long run (``repeval datasets show``)."""

from __future__ import annotations

from typing import Any

from pipeline.datasets.base import DatasetAdapter
from pipeline.terminal import printable

_METRIC_TEXT = {
    "top1": "top-1 accuracy",
    "mean_per_class": "mean per-class accuracy",
    "map11": "11-point mean average precision (VOC 2007 devkit)",
}
_MODE_TEXT = {
    "stat": "file list with sizes and modification times",
    "content": "file contents (every byte hashed)",
    "generated": "generator parameters (no files)",
}
_SHOWN = 5


def dataset_summary(dataset: DatasetAdapter) -> dict[str, Any]:
    """Everything ``repeval datasets show`` prints, JSON-able.

    Parameters
    ----------
    dataset : a constructed adapter (its files have been listed).

    Returns
    -------
    dict
        ``adapter``, ``name``, the adapter's ``metadata()`` (``metric``, ``multi_label``,
        ``validation``, ``fingerprint_mode`` ...), ``num_classes``, ``class_names``,
        ``roles`` (train/val/test/pooled split names),
        ``params`` (the adapter's description without class names) and ``splits`` (one
        ``DatasetAdapter.info`` dict per split).
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
    }


def _validation_text(validation: dict[str, Any]) -> str:
    if validation.get("source") == "split":
        return f"the authors' split {validation['split']!r}"
    kind = "stratified, " if validation.get("stratified") else ""
    return (f"{100 * validation.get('fraction', 0.2):g} % of train ({kind}seeded), drawn by "
            f"{validation.get('drawn_by', 'the probe')}")


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
        f"  labels       {'multi-label (n, C); -1 marks difficult' if summary['multi_label'] else 'one class per image'}",
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
    return "\n".join(lines)


def show_dataset(adapter: str, params: dict[str, Any], name: str | None = None, as_json: bool = False) -> str:
    """Build ``adapter`` with ``params`` (reading its copy) and describe it as text or JSON.

    Parameters
    ----------
    adapter : registered adapter name.
    params : its constructor parameters (``root`` ...).
    name : dataset name (default: the adapter's).
    as_json : JSON instead of the terminal layout.

    Returns
    -------
    str
        What ``repeval datasets show`` prints.
    """
    import json

    from pipeline.datasets._registry import make_dataset

    summary = dataset_summary(make_dataset(adapter, name=name, **params))
    return json.dumps(summary, indent=1) if as_json else format_summary(summary)
