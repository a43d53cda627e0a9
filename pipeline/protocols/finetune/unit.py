"""One resumable fine-tuning run: a grid point trained on train (scored on validation), or
the selected point retrained on train + validation (scored on test)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.encoders import EncoderSpec, load_encoder
from pipeline.errors import ConfigError, DataValidationError
from pipeline.plain import to_plain
from pipeline.protocols.finetune import data as fdata
from pipeline.protocols.finetune.optim import make_optimizer, make_scheduler, optimizer_weight_decay
from pipeline.protocols.finetune.settings import DatasetSplits, FinetuneSettings, GridPoint
from pipeline.protocols.finetune.state import capture_rng, load_state, restore_rng, run_identity, save_state
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.metrics import accuracy_metrics

SELECT, REFIT = "select", "refit"
STAGES = (SELECT, REFIT)
_LOSS_TAIL = 50  # steps averaged into train_loss_last
_DROPOUT_STREAM = 2  # derived_seed stream of the process-wide generator; 0 and 1 are the data's

__all__ = ["REFIT", "SELECT", "STAGES", "FinetuneClassifier", "run_grid_point", "training_plan"]


class FinetuneClassifier(nn.Module):
    """A timm backbone and a linear head on its ``pre_logits`` features.

    Parameters
    ----------
    backbone : timm model built without a classifier.
    head : linear layer from the ``pre_logits`` width to the number of classes.
    """

    def __init__(self, backbone: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits of a batch of normalised images.

        Parameters
        ----------
        x : torch.Tensor
            Images (B, 3, H, W), normalised.

        Returns
        -------
        torch.Tensor
            Logits (B, classes).
        """
        return self.head(self.backbone.forward_head(self.backbone.forward_features(x), pre_logits=True))


def _check_inputs(spec: Any, settings: Any, point: Any, stage: str) -> tuple[FinetuneSettings, GridPoint]:
    if not isinstance(spec, EncoderSpec):
        raise ConfigError(f"spec must be an EncoderSpec, got {type(spec).__name__}")
    if isinstance(settings, Mapping):
        settings = FinetuneSettings.from_dict(settings)
    if not isinstance(settings, FinetuneSettings):
        raise ConfigError(f"settings must be FinetuneSettings or a mapping, got {type(settings).__name__}")
    if isinstance(point, Mapping):
        point = GridPoint.from_dict(point)
    if not isinstance(point, GridPoint):
        raise ConfigError(f"point must be a GridPoint or a mapping, got {type(point).__name__}")
    if stage not in STAGES:
        raise ConfigError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    return settings, point


def training_plan(splits: DatasetSplits, settings: FinetuneSettings, stage: str) -> dict[str, Any]:
    """Which samples train a run of ``stage`` and which it is scored on."""
    adapter = splits.adapter
    train_labels = adapter.labels(splits.train_split)
    if splits.val_split is not None:
        train_idx = np.arange(train_labels.size)
        val_split, val_idx = splits.val_split, None
        validation = f"dataset split {splits.val_split!r}"
    else:
        train_idx, val_idx = fdata.held_out_validation(train_labels, settings.val_fraction, settings.seed)
        val_split = splits.train_split
        validation = f"stratified {settings.val_fraction:g} of train"
    samples = [(splits.train_split, int(i)) for i in train_idx]
    labels = [train_labels[train_idx]]
    if stage == REFIT:
        if splits.val_split is not None:
            val_labels = adapter.labels(splits.val_split)
            samples += [(splits.val_split, i) for i in range(val_labels.size)]
            labels.append(val_labels)
        else:  # the held-out part goes back in: all of train, in order
            samples = [(splits.train_split, i) for i in range(train_labels.size)]
            labels = [train_labels]
        eval_split, eval_idx = splits.test_split, None
    else:
        eval_split, eval_idx = val_split, val_idx
    labels_all = np.concatenate(labels).astype(np.int64)
    if np.unique(labels_all).size < 2:
        raise DataValidationError(f"fine-tuning needs at least 2 classes among the training samples, "
                                  f"got {np.unique(labels_all).tolist()}")
    eval_labels = adapter.labels(eval_split)
    if eval_idx is not None:
        eval_labels = eval_labels[eval_idx]
    return {"samples": samples, "labels": labels_all, "eval_split": eval_split, "eval_idx": eval_idx,
            "eval_labels": eval_labels.astype(np.int64), "validation": validation}


def _build_model(spec: EncoderSpec, device: torch.device, n_classes: int) -> tuple[FinetuneClassifier, Any]:
    encoder = load_encoder(spec, device=device, autocast=False)
    backbone = encoder.model
    with torch.no_grad():
        dummy = torch.zeros((1, *encoder.data_config["input_size"]), device=device)
        width = int(backbone.forward_head(backbone.forward_features(dummy), pre_logits=True).shape[-1])
    head = nn.Linear(width, n_classes).to(device)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    for param in backbone.parameters():
        param.requires_grad_(True)  # load_encoder freezes; fine-tuning trains every weight
    return FinetuneClassifier(backbone, head), encoder


@contextlib.contextmanager
def _deterministic(device: torch.device):
    """On CPU, deterministic kernels while the run lasts (warn-only where an op has none).
    On a GPU the fast kernels stay: a resumed run continues from the same state, but
    atomics in cuDNN/cuBLAS kernels may change the last bits."""
    if device.type != "cpu":
        yield
        return
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _autocast(device: torch.device, precision: str):
    if precision == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _logits(model: nn.Module, loader: Any, device: torch.device, precision: str) -> np.ndarray:
    model.eval()
    out = []
    with torch.no_grad(), _autocast(device, precision):
        for images, _ in loader:
            out.append(model(images.to(device, non_blocking=True)).float().cpu())
    return torch.cat(out).numpy()


def run_grid_point(
    spec: EncoderSpec,
    dataset: Any,
    settings: FinetuneSettings | Mapping[str, Any],
    point: GridPoint | Mapping[str, Any],
    scratch_dir: str | Path,
    device: str | torch.device | None = None,
    *,
    stage: str = SELECT,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Train ``spec`` at ``point`` and score it; resumable from ``scratch_dir``.

    Parameters
    ----------
    spec : the encoder to fine-tune (its weights are the starting point).
    dataset : an image dataset adapter (splits train / test, validation held out of
        train) or a :class:`DatasetSplits` naming the splits.
    settings : steps, batch size, seed and the rest (see :class:`FinetuneSettings`).
    point : learning rate, weight decay and augmentation of this run.
    scratch_dir : this run's own folder for its saved state; a state found there is
        resumed (it must belong to this very run).
    device : torch device (default CUDA when available, else CPU).
    stage : ``select`` trains on train (minus the held-out part) and scores the
        validation samples; ``refit`` trains on train + validation and scores test.
    progress : called as ``progress(steps_done, steps)`` after every optimizer step.

    Returns
    -------
    dict
        ``stage``, ``point``, ``optimizer_weight_decay``, ``steps``, ``steps_done``,
        ``batch_size``, ``diverged`` and ``diverged_at_step`` (the first, 0-based, step
        whose loss was not finite; training stops at the next save and the scores are NaN), ``train_loss_first``,
        ``train_loss_last`` (mean of the last 50 steps), ``validation`` (where the
        validation samples come from), ``eval_split``, ``n_train``, ``n_eval``, ``score``
        (the dataset's metric), ``top1``, ``mean_per_class``, ``logits`` (float32,
        ``(n_eval, n_classes)``), ``labels`` (int64, ``(n_eval,)``), ``identity`` (hash of
        what decides the run), ``weights_fingerprint`` (of the starting weights),
        ``resumed_from_step`` (None for a fresh start) and ``timing`` (``seconds``,
        ``steps_per_second`` of the steps run by this call, ``device``, ``device_name``,
        ``peak_memory_bytes`` on CUDA). Everything but ``timing`` and
        ``resumed_from_step`` is the same for a resumed and an uninterrupted run.
    """
    settings, point = _check_inputs(spec, settings, point, stage)
    splits = DatasetSplits.of(dataset)
    device = resolve_device(device)
    scratch = Path(scratch_dir)
    plan = training_plan(splits, settings, stage)
    adapter = splits.adapter
    n_classes = len(adapter.class_names)

    model, encoder = _build_model(spec, device, n_classes)
    used_splits = sorted({s for s, _ in plan["samples"]} | {plan["eval_split"]})
    identity = run_identity({
        "spec": to_plain(spec), "weights_fingerprint": encoder.weights_fingerprint,
        "data_config": encoder.provenance()["data_config"], "stage": stage, "point": to_plain(point),
        "settings": settings.result_settings(), "dataset": adapter.describe(),
        "fingerprints": {s: adapter.fingerprint(s) for s in used_splits},
        "splits": [splits.train_split, splits.val_split, splits.test_split],
    })
    optimizer = make_optimizer(model.parameters(), point, settings)
    scheduler = make_scheduler(optimizer, settings.steps)

    state = load_state(scratch, identity)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        restore_rng(state["rng"], device)
        start, losses, diverged_at = int(state["step"]), list(state["losses"]), state["diverged_at_step"]
    else:
        torch.manual_seed(fdata.derived_seed(settings.seed, _DROPOUT_STREAM, STAGES.index(stage)))
        start, losses, diverged_at = 0, [], None

    pin = device.type == "cuda"
    images = fdata.SeededTrainingImages(adapter, plan["samples"], plan["labels"],
                                        fdata.train_transform(encoder.data_config, point.augmentation),
                                        settings.seed)
    sampler = fdata.StepBatchSampler(len(images), settings.batch_size, settings.steps, settings.seed, start)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def save(step: int, pending: list[torch.Tensor]) -> int | None:
        """Flush pending losses, find a non-finite one, write the state; return the first
        non-finite step or None."""
        first_bad = None
        values = torch.stack(pending).cpu().tolist() if pending else []
        for offset, value in enumerate(values):
            if not np.isfinite(value):
                first_bad = step - len(values) + offset
                values = values[:offset]
                break
        losses.extend(values)
        done = step if first_bad is None else first_bad
        save_state(scratch, {"identity": identity, "step": done, "model": model.state_dict(),
                             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                             "rng": capture_rng(device), "losses": list(losses),
                             "diverged_at_step": first_bad})
        return first_bad

    t0, steps_run = time.perf_counter(), 0
    with _deterministic(device):
        if diverged_at is None and start < settings.steps:
            model.train()
            pending: list[torch.Tensor] = []
            loader = fdata.training_loader(images, sampler, settings.num_workers, pin)
            for step, (x, y) in zip(range(start, settings.steps), loader):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with _autocast(device, settings.precision):
                    logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                pending.append(loss.detach())
                steps_run += 1
                done = step + 1
                if done % settings.save_every == 0 or done == settings.steps:
                    diverged_at = save(done, pending)
                    pending = []
                    if diverged_at is not None:
                        break
                if progress is not None:
                    progress(done, settings.steps)
        seconds = time.perf_counter() - t0

        n_eval = plan["eval_labels"].size
        if diverged_at is None:
            loader = fdata.eval_loader(splits, plan["eval_split"], plan["eval_idx"],
                                       fdata.eval_transform(encoder.data_config), settings.eval_batch_size,
                                       settings.num_workers, pin)
            logits_eval = _logits(model, loader, device, settings.precision)
            metrics = accuracy_metrics(plan["eval_labels"], logits_eval.argmax(axis=1), adapter.mean_per_class)
        else:
            logits_eval = np.full((n_eval, n_classes), np.nan, dtype=np.float32)
            metrics = {"top1": float("nan"), "mean_per_class": float("nan"), "score": float("nan")}

    timing: dict[str, Any] = {"seconds": seconds, "steps_per_second": steps_run / seconds if steps_run else None,
                              "device": device.type, "device_name": None, "peak_memory_bytes": None}
    if device.type == "cuda":
        timing["device_name"] = torch.cuda.get_device_name(device)
        timing["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return {
        "stage": stage,
        "point": to_plain(point),
        "optimizer_weight_decay": optimizer_weight_decay(point),
        "steps": settings.steps,
        "steps_done": len(losses),
        "batch_size": settings.batch_size,
        "diverged": diverged_at is not None,
        "diverged_at_step": diverged_at,
        "train_loss_first": float(losses[0]) if losses else float("nan"),
        "train_loss_last": float(np.mean(losses[-_LOSS_TAIL:])) if losses else float("nan"),
        "validation": plan["validation"],
        "eval_split": plan["eval_split"],
        "n_train": len(plan["samples"]),
        "n_eval": int(n_eval),
        "score": metrics["score"],
        "top1": metrics["top1"],
        "mean_per_class": metrics["mean_per_class"],
        "logits": logits_eval.astype(np.float32),
        "labels": plan["eval_labels"],
        "identity": identity,
        "weights_fingerprint": encoder.weights_fingerprint,
        "resumed_from_step": start if state is not None else None,
        "timing": timing,
    }
