"""The dense readouts' section: a table per task (segmentation: mIoU and pixel accuracy;
surface normals: mean and median angular error, % of pixels within 11.25, 22.5 and 30
degrees) and, per setting and dataset, a few test images' predicted maps beside their
ground truth for the best encoder and the baseline, read from the store."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from jobs.report.html import Markup, el, is_number, link, note, num, pct, row_head, section, table
from jobs.report.model import ReportRun
from jobs.report.plots import png
from pipeline.errors import RepevalError

__all__ = ["DENSE_PROTOCOLS", "dense_section", "is_dense"]

DENSE_PROTOCOLS = ("segmentation", "normals")
N_EXAMPLES = 3  # test images shown per setting and dataset
_IGNORE = 255


def is_dense(rec: Mapping[str, Any]) -> bool:
    """Whether a record is a dense protocol's (shown here, not among the accuracy tables)."""
    return rec.get("protocol") in DENSE_PROTOCOLS


def _seconds_per_epoch(rec: Mapping[str, Any]) -> str:
    d = rec.get("diagnostics") or {}
    run = d.get("refit") or d.get("train") or {}
    return num(run.get("seconds_per_epoch"), 3)


def _segmentation_rows(recs: list[dict]) -> list[list[Any]]:
    rows = []
    for r in recs:
        m, d = r.get("metrics") or {}, r.get("diagnostics") or {}
        rows.append([row_head(r.get("model")), r.get("dataset"), r.get("layer"), link(r, pct(m.get("miou"))),
                     pct(m.get("pixel_accuracy")), m.get("classes_scored"), num(d.get("learning_rate"), 4),
                     d.get("validation"), _seconds_per_epoch(r), d.get("device")])
    return rows


def _normals_rows(recs: list[dict]) -> list[list[Any]]:
    rows = []
    for r in recs:
        m, d = r.get("metrics") or {}, r.get("diagnostics") or {}
        rows.append([row_head(r.get("model")), r.get("dataset"), r.get("layer"), num(m.get("mean_angle_error"), 2),
                     num(m.get("median_angle_error"), 2), link(r, pct(m.get("within_11_25"))),
                     pct(m.get("within_22_5")), pct(m.get("within_30")), d.get("head"), _seconds_per_epoch(r),
                     d.get("device")])
    return rows


def _reader(config: Any) -> Callable[[str], np.ndarray | None]:
    """``read(key)``: the first test images of a stored array in the config's store (None if unreadable)."""
    try:
        store = config.open_store(read_only=True)
    except (RepevalError, OSError):
        return lambda key: None

    def read(key: str) -> np.ndarray | None:
        try:
            array = store.open_array(key)
            return array.read(slice(0, N_EXAMPLES))
        except (RepevalError, OSError, KeyError):
            return None

    return read


def _colour(values: np.ndarray, task: str) -> np.ndarray:
    """RGB in [0, 1]: classes by a fixed palette (ignored pixels black); normals as (n + 1) / 2
    (invalid pixels grey)."""
    if task == "normals":
        n = values.astype(np.float64)
        invalid = ~np.any(n != 0, axis=-1)
        rgb = np.clip((n + 1.0) / 2.0, 0.0, 1.0)
        rgb[invalid] = 0.5
        return rgb
    palette = np.random.default_rng(0).uniform(0.1, 1.0, (256, 3))
    palette[_IGNORE] = 0.0
    return palette[values.astype(np.int64)]


def _examples(targets: np.ndarray, columns: list[tuple[str, np.ndarray]], task: str, title: str) -> Markup:
    rows = min(len(targets), *(len(m) for _, m in columns))
    fig = Figure(figsize=(2.2 * (1 + len(columns)), 2.2 * rows + 0.4))
    axes = np.atleast_2d(fig.subplots(rows, 1 + len(columns)))
    for i in range(rows):
        for j, (name, image) in enumerate([("ground truth", targets), *columns]):
            ax = axes[i, j]
            ax.imshow(_colour(image[i], task), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(name, fontsize="small")
    fig.suptitle(title, fontsize="small")
    return png(fig)


def _pictures(run: ReportRun, recs: list[dict], read) -> list[Markup]:
    out: list[Markup] = []
    for setting in dict.fromkeys(str(r.get("setting")) for r in recs):
        for dataset in dict.fromkeys(str(r.get("dataset")) for r in recs if r.get("setting") == setting):
            mine = [r for r in recs if r.get("setting") == setting and r.get("dataset") == dataset
                    and is_number((r.get("metrics") or {}).get("score"))]
            if not mine:
                continue
            best = max(mine, key=lambda r: (r["metrics"]["score"], str(r.get("model"))))
            base = [r for r in mine if r.get("model") == run.baseline]
            baseline = max(base, key=lambda r: r["metrics"]["score"]) if base else None
            if baseline is best:
                shown = [("best and baseline", best)]
            else:
                shown = [("best", best)] + ([("baseline", baseline)] if baseline is not None else [])
            title = f"{setting} on {dataset}: first test images"
            targets_key = (best.get("evidence") or {}).get("labels")
            targets = read(str(targets_key)) if targets_key else None
            metric = "mIoU" if best.get("protocol") == "segmentation" else "within 11.25 deg"
            columns = []
            for role, r in shown:
                maps = read(str((r.get("predicted_maps") or {}).get("key"))) if r.get("predicted_maps") else None
                if maps is not None:
                    score = pct(r["metrics"]["score"])
                    columns.append((f"{role}: {r.get('model')} {r.get('layer')}\n({metric} {score} %)", maps))
            if targets is None or not columns:
                out.append(note(f"{title}: no predicted maps stored."))
                continue
            if baseline is None:
                out.append(note(f"{title}: no record of a baseline encoder to show beside the best "
                                f"(report.baseline: {run.baseline or 'not set'})."))
            task = "normals" if best.get("protocol") == "normals" else "segmentation"
            who = "; ".join(f"{role}: {r.get('model')} ({r.get('layer')})" for role, r in shown)
            out.append(el("details", el("summary", f"{title}, ground truth beside {who}"),
                          _examples(targets, columns, task, title), open=True))
    return out


def dense_section(run: ReportRun, config: Any = None, read: Callable[[str], np.ndarray | None] | None = None) -> Markup:
    """Tables of both dense tasks and predicted maps beside the ground truth."""
    seg = [r for r in run.records if r.get("protocol") == "segmentation"]
    nrm = [r for r in run.records if r.get("protocol") == "normals"]
    body: list[Any] = [note(
        "Heads trained on frozen spatial maps (layers block<i>.map), their outputs upsampled bilinearly to the "
        "ground truth laid over the encoder's input crop. Segmentation: mIoU over the test set's confusion matrix "
        "(classes absent from both ground truth and predictions left out) and pixel accuracy, in %. Surface "
        "normals: mean and median angular error in degrees over valid pixels (lower is better) and % of pixels "
        "within 11.25, 22.5 and 30 degrees. Seconds per epoch: the final training run, on its device.")]
    if not seg and not nrm:
        return section("dense", "Dense readouts", body + [note("No dense records.")], empty=True)
    if seg:
        body += [el("h3", "Semantic segmentation"),
                 table(["encoder", "dataset", "layer", "mIoU (%)", "pixel accuracy (%)", "classes scored",
                        "learning rate", "validation", "s / epoch", "device"], _segmentation_rows(seg))]
    if nrm:
        body += [el("h3", "Surface normals"),
                 table(["encoder", "dataset", "layer", "mean error (deg)", "median error (deg)", "< 11.25 (%)",
                        "< 22.5 (%)", "< 30 (%)", "head", "s / epoch", "device"], _normals_rows(nrm))]
    read = read or (_reader(config) if config is not None else (lambda key: None))
    body += _pictures(run, seg + nrm, read)
    return section("dense", "Dense readouts", body)
