"""Selection over the grid, calibration, and the fine-tuning result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, DataValidationError
from pipeline.plain import to_plain
from pipeline.protocols.finetune.settings import DatasetSplits, FinetuneSettings, GridPoint, grid_points
from pipeline.protocols.finetune.unit import REFIT, SELECT, run_grid_point
from pipeline.protocols.audits.calibration import calibration_report

__all__ = ["finetune_result", "run_finetune", "select_best"]


def _grid_index(settings: FinetuneSettings) -> dict[GridPoint, int]:
    return {p: i for i, p in enumerate(grid_points(settings))}


def select_best(select_results: Sequence[Mapping[str, Any]], settings: FinetuneSettings) -> Mapping[str, Any]:
    """The selection run of the best grid point (see the module doc).

    Parameters
    ----------
    select_results : results of :func:`run_grid_point` with ``stage="select"``, one per
        grid point of ``settings``, in any order.
    settings : the settings every result was run with.

    Returns
    -------
    dict
        The winning result.

    Raises
    ------
    DataValidationError
        A point is missing, repeated or not in the grid, a result is not a selection
        run, or every point diverged.
    """
    index = _grid_index(settings)
    seen: dict[int, Mapping[str, Any]] = {}
    for result in select_results:
        if result.get("stage") != SELECT:
            raise DataValidationError(f"select_best needs selection runs, got stage {result.get('stage')!r}")
        point = GridPoint.from_dict(result["point"])
        if point not in index:
            raise DataValidationError(f"grid point {to_plain(point)} is not in the grid of these settings")
        if index[point] in seen:
            raise DataValidationError(f"grid point {to_plain(point)} appears twice")
        seen[index[point]] = result
    missing = [to_plain(p) for p, i in index.items() if i not in seen]
    if missing:
        raise DataValidationError(f"{len(missing)} grid point(s) have no selection result, e.g. {missing[:3]}")
    best: Mapping[str, Any] | None = None
    for i in sorted(seen):
        result = seen[i]
        if result["diverged"] or not np.isfinite(result["score"]):
            continue
        if best is None or result["score"] > best["score"]:  # strict: ties keep the earlier point
            best = result
    if best is None:
        raise DataValidationError(f"every one of the {len(seen)} grid points diverged (non-finite training "
                                  "loss); lower the learning rates")
    return best


def finetune_result(select_results: Sequence[Mapping[str, Any]], refit_result: Mapping[str, Any],
                    settings: FinetuneSettings) -> dict[str, Any]:
    """Metrics and diagnostics of a finished fine-tuning, in the protocols' record shape.

    Parameters
    ----------
    select_results : every selection run of the grid.
    refit_result : the refit run of the selected point.
    settings : the settings of all runs.

    Returns
    -------
    dict
        ``{"metrics": {...}, "diagnostics": {...}}``. Metrics: ``score`` (the dataset's
        metric), ``top1``, ``mean_per_class``, ``ece``, ``ece_temperature_scaled``,
        ``nll``, ``nll_temperature_scaled`` (test split; NaN when the refit diverged).
        Diagnostics: ``selected`` (the point), ``optimizer_weight_decay``,
        ``val_scores`` (one entry per grid point in grid order: the point, ``score``,
        ``diverged``, ``train_loss_last``), ``validation``, ``n_val`` (the validation
        images the selection runs were scored on), ``steps``, ``batch_size``,
        ``temperature``, ``temperature_at_bound``, ``diverged_points``, ``refit_diverged``,
        ``converged`` (False when the refit diverged), ``n_train``, ``n_test``,
        ``weights_fingerprint``.
    """
    best = select_best(select_results, settings)
    if refit_result.get("stage") != REFIT:
        raise DataValidationError(f"refit_result must come from stage {REFIT!r}, got {refit_result.get('stage')!r}")
    if refit_result["point"] != best["point"]:
        raise DataValidationError(f"the refit ran point {refit_result['point']} but selection chose {best['point']}")
    index = _grid_index(settings)
    ordered = sorted(select_results, key=lambda r: index[GridPoint.from_dict(r["point"])])
    metrics: dict[str, float] = {"score": refit_result["score"], "top1": refit_result["top1"],
                                 "mean_per_class": refit_result["mean_per_class"]}
    diagnostics: dict[str, Any] = {
        "selected": dict(best["point"]),
        "optimizer_weight_decay": best["optimizer_weight_decay"],
        "val_scores": [{**r["point"], "score": r["score"], "diverged": r["diverged"],
                        "train_loss_last": r["train_loss_last"]} for r in ordered],
        "validation": best["validation"],
        "n_val": int(len(best["labels"])),  # the images the selection runs were scored on
        "steps": settings.steps,
        "batch_size": settings.batch_size,
        "diverged_points": sum(bool(r["diverged"]) for r in ordered),
        "refit_diverged": bool(refit_result["diverged"]),
        "converged": not refit_result["diverged"],
        "n_train": refit_result["n_train"],
        "n_test": refit_result["n_eval"],
        "weights_fingerprint": refit_result["weights_fingerprint"],
        "temperature": None,
        "temperature_at_bound": None,
    }
    nan = float("nan")
    if refit_result["diverged"]:
        metrics.update(ece=nan, ece_temperature_scaled=nan, nll=nan, nll_temperature_scaled=nan)
    else:
        cal = calibration_report(best["logits"], best["labels"], refit_result["logits"], refit_result["labels"],
                                 n_bins=settings.calibration_bins)
        metrics.update(ece=cal.ece_before, ece_temperature_scaled=cal.ece_after, nll=cal.nll_before,
                       nll_temperature_scaled=cal.nll_after)
        diagnostics.update(temperature=cal.temperature, temperature_at_bound=cal.temperature_at_bound)
    return {"metrics": metrics, "diagnostics": diagnostics}


def run_finetune(spec: Any, dataset: Any, settings: FinetuneSettings | Mapping[str, Any],
                 scratch_root: str | Path, device: Any = None) -> dict[str, Any]:
    """The whole protocol in this process, one grid point after the other: every selection
    run, the refit of the best point, then :func:`finetune_result`. Each run keeps its state
    in its own folder under ``scratch_root`` (``select-000``, ... and ``refit``), so a
    killed call resumes where it stopped.

    Parameters
    ----------
    spec : EncoderSpec of the starting weights.
    dataset : image adapter or :class:`DatasetSplits`.
    settings : FinetuneSettings or a mapping of them.
    scratch_root : folder for the runs' saved states.
    device : torch device (default CUDA when available, else CPU).

    Returns
    -------
    dict
        As :func:`finetune_result`.
    """
    if isinstance(settings, Mapping):
        settings = FinetuneSettings.from_dict(settings)
    if not isinstance(settings, FinetuneSettings):
        raise ConfigError(f"settings must be FinetuneSettings or a mapping, got {type(settings).__name__}")
    splits = DatasetSplits.of(dataset)
    root = Path(scratch_root)
    selections = [run_grid_point(spec, splits, settings, point, root / f"select-{i:03d}", device, stage=SELECT)
                  for i, point in enumerate(grid_points(settings))]
    best = select_best(selections, settings)
    refit = run_grid_point(spec, splits, settings, best["point"], root / "refit", device, stage=REFIT)
    return finetune_result(selections, refit, settings)
