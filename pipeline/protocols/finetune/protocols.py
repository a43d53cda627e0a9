"""The fine-tuning protocol, ``finetune``, registered with its settings, metrics and grid."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, DataValidationError
from pipeline.plain import to_plain
from pipeline.protocols.cell import ImageData
from pipeline.protocols.finetune.settings import DatasetSplits, FinetuneSettings, grid_points
from pipeline.protocols.fit_warnings import fit_warning
from pipeline.protocols.registry import ProtocolResult, register_protocol

__all__ = ["FINETUNE", "FinetuneGrid"]

FINETUNE = "finetune"


class FinetuneGrid:
    """Fine-tuning as units of work: one per grid point, then the finish (see the module doc)."""

    def points(self, settings: Mapping[str, Any]) -> int:
        """How many grid points the resolved ``settings`` train."""
        return len(grid_points(FinetuneSettings.from_dict(settings)))

    def run_point(self, data: ImageData, settings: Mapping[str, Any], index: int) -> dict[str, Any]:
        """Train and score grid point ``index`` on the validation samples, resuming a saved state."""
        # deferred: torch and timm load when a grid point runs, not when the registry is read
        from pipeline.protocols.finetune.unit import SELECT, run_grid_point

        s = FinetuneSettings.from_dict(settings)
        points = grid_points(s)
        if not 0 <= index < len(points):
            raise DataValidationError(f"grid point {index} does not exist: the grid has {len(points)} points")
        return run_grid_point(data.encoder, _splits(data), s, points[index], _part(data, f"select-{index:03d}"),
                              data.device, stage=SELECT)

    def finish(self, data: ImageData, settings: Mapping[str, Any],
               done: Mapping[int, Mapping[str, Any]]) -> ProtocolResult:
        """Select the best grid point, refit it on train + validation and test it."""
        # deferred: torch, timm and scikit-learn load when the grid finishes, not when the registry is read
        from pipeline.protocols.finetune.result import finetune_result, select_best
        from pipeline.protocols.finetune.unit import REFIT, SELECT, run_grid_point

        s = FinetuneSettings.from_dict(settings)
        grid = grid_points(s)
        splits = _splits(data)
        selections = [done[i] if i in done else run_grid_point(
            data.encoder, splits, s, point, _part(data, f"select-{i:03d}"), data.device, stage=SELECT)
            for i, point in enumerate(grid)]
        best = select_best(selections, s)
        refit = run_grid_point(data.encoder, splits, s, best["point"], _part(data, "refit"), data.device, stage=REFIT)
        out = finetune_result(selections, refit, s)
        runs = [{"stage": r["stage"], **r["point"], **r["timing"], "resumed_from_step": r["resumed_from_step"],
                 "steps_done": r["steps_done"]} for r in [*selections, refit]]
        diag = {**out["diagnostics"], "runs": runs}
        warnings = []
        if diag["diverged_points"]:
            warnings.append(fit_warning("runtime", f"{diag['diverged_points']} of {len(grid)} grid points diverged "
                                                   "(non-finite training loss)"))
        if diag["temperature_at_bound"]:
            warnings.append(fit_warning("temperature_edge", f"the fitted temperature {diag['temperature']:.3g} is at "
                                                            "its search bound"))
        return ProtocolResult(out["metrics"], diag, warnings, device_use=_gpu_use(runs), n_train=refit["n_train"],
                              n_test=refit["n_eval"])


def _splits(data: ImageData) -> DatasetSplits:
    return DatasetSplits(data.adapter, train_split=data.train_split, test_split=data.test_split,
                         val_split=data.val_split)


def _part(data: ImageData, part: str) -> Path:
    """The scratch folder of one run of the grid (``select-003``, ``refit``)."""
    if data.scratch_dir is None:
        raise ConfigError("fine-tuning keeps resumable state: give ImageData a scratch_dir")
    return Path(data.scratch_dir) / part


def _gpu_use(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Device, training steps/s over the steps this run trained, peak memory over the runs."""
    seconds = sum(r["seconds"] for r in runs if r.get("steps_per_second"))
    steps = sum(r["steps_per_second"] * r["seconds"] for r in runs if r.get("steps_per_second"))
    peaks = [r["peak_memory_bytes"] for r in runs if r.get("peak_memory_bytes") is not None]
    return {"device": runs[-1]["device"], "device_name": runs[-1]["device_name"],
            "steps_per_second": steps / seconds if seconds else None, "train_seconds": seconds,
            "steps_trained": int(round(steps)), "peak_memory_bytes": max(peaks) if peaks else None}


_GRID = FinetuneGrid()
_LOWER = ("ece", "ece_temperature_scaled", "nll", "nll_temperature_scaled")


@register_protocol(
    FINETUNE, version=1,
    defaults=to_plain({f.name: f.default for f in dataclasses.fields(FinetuneSettings)}),
    build=lambda settings: to_plain(FinetuneSettings.from_dict(settings)),
    weights=True, grid=_GRID, ignored=("save_every", "eval_batch_size", "num_workers"),
    metrics=("score", "top1", "mean_per_class", *_LOWER), unbounded=("nll", "nll_temperature_scaled"),
    lower_is_better=_LOWER,
    description="the encoder fine-tuned with a linear head: grid, selection on validation, refit, test",
)
def _finetune(data: ImageData, s: Mapping[str, Any]) -> ProtocolResult:
    return _GRID.finish(data, s, {})
