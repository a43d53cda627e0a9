"""The ``segmentation`` and ``normals`` runners: heads trained on a cell's frozen maps."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.errors import DataValidationError
from pipeline.protocols.finetune.state import run_identity
from pipeline.protocols.cell import ProtocolResult
from pipeline.protocols.dense import metrics as dm
from pipeline.protocols.dense.codebook import codebook_loss, decode_normals, normal_codebook
from pipeline.protocols.dense.data import DenseData
from pipeline.protocols.dense.heads import make_head
from pipeline.protocols.dense.training import Rows, Schedule, TrainOutcome, channel_stats, predict_batches, train_head
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.evidence import Evidence
from pipeline.protocols.fit_warnings import fit_warning, grid_warnings

__all__ = ["normals_loss", "run_normals", "run_segmentation", "segmentation_loss"]


def _schedule(s: Mapping[str, Any], learning_rate: float) -> Schedule:
    return Schedule(float(learning_rate), int(s["epochs"]), int(s["batch_size"]), float(s["momentum"]),
                    float(s["weight_decay"]), float(s["power"]), int(s["seed"]), int(s["save_every"]))


def _parts(data: DenseData) -> tuple[list[Any], list[Any]]:
    maps, targets = [data.X_train], [data.y_train]
    if data.X_val is not None:
        maps.append(data.X_val)
        targets.append(data.y_val)
    return maps, targets


def _index(rows: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.stack([np.full(len(r), p), r], axis=1) for p, r in enumerate(rows)]).astype(np.int64)


def _scratch(data: DenseData, part: str) -> Path | None:
    return None if data.scratch_dir is None else Path(data.scratch_dir) / part


def _fit(data: DenseData, s: Mapping[str, Any], rows: list[np.ndarray], kind: str, out_channels: int,
         learning_rate: float, loss, part: str, device: torch.device) -> tuple[torch.nn.Module, TrainOutcome]:
    """One head trained on ``rows`` (train rows of each part) with its own standardisation."""
    maps, targets = _parts(data)
    mean, std = channel_stats(maps, rows)
    head = make_head(kind, int(np.shape(data.X_train)[3]), out_channels, int(s.get("hidden_units", 1)), mean, std,
                     int(s["seed"])).to(device)
    schedule = _schedule(s, learning_rate)
    identity = run_identity({"part": part, "settings": dict(s), "learning_rate": learning_rate,
                             "rows": [int(len(r)) for r in rows], "shape": list(np.shape(data.X_train)[1:]),
                             "targets": list(np.shape(data.y_train)[1:])})
    on_step = None if data.on_step is None else (lambda steps: data.on_step(part, steps))
    outcome = train_head(head, Rows(maps, targets, _index(rows)), schedule, loss, data.target_size, device,
                         _scratch(data, part), identity, on_step=on_step)
    return head, outcome


def _run_record(outcome: TrainOutcome, rows: int, batch_size: int) -> dict[str, Any]:
    per_epoch = -(-rows // batch_size)
    trained = outcome.steps - (outcome.resumed_from or 0)
    return {"steps": outcome.steps, "total_steps": outcome.total_steps, "diverged": outcome.diverged,
            "final_loss": outcome.losses[-1] if outcome.losses else None, "resumed_from": outcome.resumed_from,
            "seconds_per_epoch": outcome.seconds * per_epoch / trained if trained else None}


# -- segmentation ----------------------------------------------------------------------------
def segmentation_loss(ignore: int):
    """Cross-entropy of upsampled logits over the labelled pixels of a batch."""
    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = targets.long()
        labelled = (t != ignore).sum().clamp(min=1)
        return F.cross_entropy(outputs, t, ignore_index=ignore, reduction="sum") / labelled
    return loss


def _class_maps(outputs: torch.Tensor) -> torch.Tensor:
    return outputs.argmax(dim=1).to(torch.uint8)


def _selection_rows(data: DenseData, s: Mapping[str, Any]) -> tuple[list[np.ndarray], np.ndarray | None, str]:
    """(train rows per part for the selection fits, held-out train rows or None, where validation is)."""
    n = len(data.y_train)
    if data.X_val is not None:
        return [np.arange(n)], None, "dataset split"
    n_val = max(1, int(round(float(s["val_fraction"]) * n)))
    if n - n_val < 1:
        raise DataValidationError(f"the train split has {n} image(s): too few to hold out a validation share "
                                  f"(val_fraction={s['val_fraction']}); give the dataset a validation split")
    order = np.random.default_rng(int(s["seed"])).permutation(n)
    return [np.sort(order[n_val:])], np.sort(order[:n_val]), f"seeded {s['val_fraction']:g} of train images"


def _confusion(head, maps, targets, data: DenseData, batch_size: int, device) -> np.ndarray:
    conf = np.zeros((data.n_classes, data.n_classes), dtype=np.int64)
    for start, pred in predict_batches(head, maps, data.target_size, batch_size, device, _class_maps):
        conf += dm.confusion_matrix(pred, np.asarray(targets[start:start + len(pred)]), data.n_classes,
                                    data.ignore_index)
    return conf


def run_segmentation(data: DenseData, s: Mapping[str, Any]) -> ProtocolResult:
    """Learning rate by validation mIoU, then the linear head retrained on every training
    row and scored on test (see the module doc)."""
    device = resolve_device(s["device"])
    loss = segmentation_loss(data.ignore_index)
    rows, held_out, validation = _selection_rows(data, s)
    val_maps = data.X_val if held_out is None else _Subset(data.X_train, held_out)
    val_targets = data.y_val if held_out is None else _Subset(data.y_train, held_out)
    grid, runs, warnings = [float(v) for v in s["learning_rates"]], [], []
    for i, lr in enumerate(grid):
        head, outcome = _fit(data, s, rows, "linear", data.n_classes, lr, loss, f"select-{i:02d}", device)
        score = None if outcome.diverged else dm.segmentation_metrics(
            _confusion(head, val_maps, val_targets, data, int(s["batch_size"]), device))["miou"]
        runs.append({"learning_rate": lr, "val_miou": score, **_run_record(outcome, len(rows[0]), s["batch_size"])})
    scored = [r for r in runs if r["val_miou"] is not None]
    if not scored:
        raise DataValidationError(f"every learning rate of {grid} diverged (non-finite loss); try smaller ones")
    chosen = max(scored, key=lambda r: r["val_miou"])  # max keeps the first of equal scores
    by_rate = sorted(runs, key=lambda r: r["learning_rate"])
    # a diverged fit beside the edge counts as beaten (NaN); a tie at the edge is no edge
    warnings += grid_warnings("learning rate", [r["learning_rate"] for r in by_rate],
                              [math.nan if r["val_miou"] is None else r["val_miou"] for r in by_rate],
                              by_rate.index(chosen), criterion="validation mIoU", plateau=False,
                              setting="learning_rates")
    all_rows = [np.arange(len(t)) for t in _parts(data)[1]]
    head, outcome = _fit(data, s, all_rows, "linear", data.n_classes, chosen["learning_rate"], loss, "refit", device)
    if outcome.diverged:
        raise DataValidationError(f"the refit with learning rate {chosen['learning_rate']:g} diverged at step "
                                  f"{outcome.steps}; no test score")
    pred = np.empty(np.shape(data.y_test), dtype=np.uint8)
    for start, block in predict_batches(head, data.X_test, data.target_size, int(s["batch_size"]), device,
                                        _class_maps):
        pred[start:start + len(block)] = block
    y = np.asarray(data.y_test)
    counts, conf = _image_counts(pred, y, data)
    found = dm.segmentation_metrics(conf)
    labelled = y != data.ignore_index
    if len(np.unique(pred[labelled])) <= 1 < len(np.unique(y[labelled])):
        warnings.append(fit_warning("one_class", "the head predicts one class on every labelled test pixel"))
    metrics = {"score": found["miou"], "miou": found["miou"], "pixel_accuracy": found["pixel_accuracy"],
               "classes_scored": found["classes_scored"], "labelled_pixels": found["labelled_pixels"]}
    dm.check_scores(metrics, ("miou", "pixel_accuracy"))
    # the counts of what was done: the grid trained on the selection rows and was scored on
    # the validation images (a held-out share of train, or the split); the refit on all rows
    diagnostics = {"learning_rate": chosen["learning_rate"], "selection": runs, "validation": validation,
                   "iou": found["iou"], "refit": _run_record(outcome, sum(len(r) for r in all_rows), s["batch_size"]),
                   **_shapes(data, n_train=sum(len(r) for r in all_rows), n_val=len(val_targets)),
                   "n_selection_images": int(len(rows[0])), "device": str(device), "converged": True}
    evidence = Evidence.of_pixel_counts(y, counts, "miou")
    return ProtocolResult(metrics, diagnostics, warnings, evidence=evidence, maps=pred)


def _image_counts(pred: np.ndarray, y: np.ndarray, data: DenseData) -> tuple[np.ndarray, np.ndarray]:
    """Per-image (TP, FP, FN) per class and the set's confusion matrix, one image at a time."""
    conf = np.zeros((data.n_classes, data.n_classes), dtype=np.int64)
    counts = np.zeros((len(y), data.n_classes, 3), dtype=np.int64)
    for i in range(len(y)):
        one = dm.confusion_matrix(pred[i], y[i], data.n_classes, data.ignore_index)
        tp = np.diag(one)
        counts[i, :, 0], counts[i, :, 1], counts[i, :, 2] = tp, one.sum(axis=0) - tp, one.sum(axis=1) - tp
        conf += one
    return counts, conf


class _Subset:
    """Rows of an array by position, without copying it (held-out validation images)."""

    def __init__(self, array: Any, rows: np.ndarray) -> None:
        self.array, self.rows = array, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: slice) -> np.ndarray:
        return np.asarray(self.array[self.rows[item]])


# -- normals ---------------------------------------------------------------------------------
def normals_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cosine distance ``1 - <p, g>`` of the normalised outputs over the valid pixels."""
    pred = F.normalize(outputs, dim=1)
    true = F.normalize(targets.permute(0, 3, 1, 2).to(torch.float32), dim=1)  # the zero vector stays zero
    valid = (true.abs().sum(dim=1) > 0).to(torch.float32)
    return ((1.0 - (pred * true).sum(dim=1)) * valid).sum() / valid.sum().clamp(min=1.0)


def _unit_normals(outputs: torch.Tensor) -> torch.Tensor:
    return F.normalize(outputs, dim=1).permute(0, 2, 3, 1).to(torch.float16)


def run_normals(data: DenseData, s: Mapping[str, Any]) -> ProtocolResult:
    """The head trained on every training row (train, and validation where the cell has one)
    and scored on test by the angular-error metrics (see the module doc)."""
    device = resolve_device(s["device"])
    rows = [np.arange(len(t)) for t in _parts(data)[1]]
    formulation = {"formulation": s["formulation"]}
    if s["formulation"] == "classification":
        codebook = normal_codebook(_parts(data)[1], rows, int(s["clusters"]), int(s["seed"]))
        loss, finish, outputs = codebook_loss(codebook), decode_normals(codebook), len(codebook)
        formulation.update(clusters=int(len(codebook)), codebook=np.round(codebook, 6).tolist())
    else:
        loss, finish, outputs = normals_loss, _unit_normals, 3
    head, outcome = _fit(data, s, rows, s["head"], outputs, float(s["learning_rate"]), loss, "train", device)
    if outcome.diverged:
        raise DataValidationError(f"training diverged (non-finite loss) at step {outcome.steps} with learning rate "
                                  f"{s['learning_rate']:g}; lower learning_rate")
    pred = np.empty(np.shape(data.y_test), dtype=np.float16)
    for start, block in predict_batches(head, data.X_test, data.target_size, int(s["batch_size"]), device,
                                        finish):
        pred[start:start + len(block)] = block
    y = np.asarray(data.y_test)
    errors = [dm.angular_errors(pred[i], y[i]) for i in range(len(y))]  # from the stored float16 predictions
    found = dm.normals_metrics(np.concatenate(errors))
    counts = np.array([[e.size, *(np.count_nonzero(e < t) for t in dm.ANGLE_THRESHOLDS)] for e in errors],
                      dtype=np.int64).reshape(len(y), 1 + len(dm.ANGLE_THRESHOLDS))
    metrics = {"score": found["within_11_25"], **found}
    dm.check_scores(metrics, dm.NORMAL_METRICS)
    # one learning rate, no selection: no image is spent on validation (a validation split is trained on)
    trained = sum(len(r) for r in rows)
    validation = "none: one learning rate" + ("; the validation split is trained on" if data.X_val is not None else "")
    diagnostics = {"train": _run_record(outcome, trained, s["batch_size"]),
                   **_shapes(data, n_train=trained, n_val=0), "validation": validation,
                   "head": s["head"], **formulation, "device": str(device), "converged": True}
    return ProtocolResult(metrics, diagnostics, evidence=Evidence.of_pixel_counts(y, counts, "within_11_25"),
                          maps=pred)


def _shapes(data: DenseData, n_train: int, n_val: int) -> dict[str, Any]:
    """The maps' geometry and the images used: ``n_train`` trained the final head, ``n_val``
    scored the selection (0: none was made), as the runner did, not as the splits are."""
    (h, w), (H, W) = data.grid, data.target_size
    return {"grid": [h, w], "target_size": [H, W], "upsampling": [H / h, W / w],
            "n_train_images": int(n_train), "n_test_images": int(len(data.y_test)), "n_val_images": int(n_val)}
