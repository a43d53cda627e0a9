"""The encoder protocols' units of work, each runnable without Prefect.

Fine-tuning is ``1 + N`` units: :func:`finetune_point` trains and scores one grid point
(resumable from its scratch folder; any number run in parallel, one per process), then
:func:`finetune_finish` selects the best point, refits it on train + validation, tests it
and writes the record. A diagnostic (saliency, colour detail) is one unit,
:func:`diagnostic_cell`. Every unit first looks its cell up in the ledger: a recorded cell
is answered without training. One training run at a time per process: dropout draws from
the process-wide torch generator, which two runs in threads of one process would share.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from jobs.config import ExtractConfig
from jobs.evaluation.encoder_cells import (
    CellIdentity, EncoderCell, identify, point_to, put_record, remove_scratch, scratch_folder,
)
from jobs.evaluation.evaluate import json_ready
from jobs.plan import make_adapter
from pipeline.encoder_protocols import FINETUNE, PERCEPTUAL, SALIENCY, get_encoder_protocol
from pipeline.errors import DataValidationError
from storage_schema.ledger import Ledger, config_hash
from storage_schema.provenance import now_iso

__all__ = ["DONE", "diagnostic_cell", "finetune_finish", "finetune_point"]

DONE = "done"  # a grid point trained and scored (not a cell status)
_ONE_RUN = threading.Lock()


def _outcome(cell: EncoderCell, cid: str, status: str) -> dict[str, Any]:
    return {"label": cell.label(), "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
            "setting": cell.setting, "protocol": cell.protocol, "cell_id": cid, "status": status}


def _cached(store: Any, cell: EncoderCell, ident: CellIdentity, ledger: Ledger) -> dict[str, Any] | None:
    """The cached outcome when the ledger holds the cell (its name now points at it)."""
    if not ledger.has(ident.cell_id):
        return None
    if not store.read_only:
        point_to(store, cell, ident.cell_id)
    return _outcome(cell, ident.cell_id, "cached")


def _splits(cell: EncoderCell, adapter: Any):
    from pipeline.protocols.finetune import DatasetSplits

    d = cell.dataset_config
    return DatasetSplits(adapter, train_split=d.train_split, test_split=d.test_split, val_split=d.val_split)


def finetune_point(store: Any, cell: EncoderCell, index: int, extract: ExtractConfig) -> dict[str, Any]:
    """Train and score grid point ``index`` of a fine-tuning cell, resuming a saved state.

    Parameters
    ----------
    store : the FeatureStore the record goes to (and, when local, the scratch folder).
    cell : a ``finetune`` cell.
    index : the point's position in ``grid_points(settings)``.
    extract : the config's ``extract`` section (``device``, ``scratch_dir``).

    Returns
    -------
    dict
        ``status`` (``cached`` when the cell is recorded, else ``done``), ``cell_id``,
        ``index`` and, when done, ``result`` (what ``run_grid_point`` returned).
    """
    from pipeline.protocols.finetune import FinetuneSettings, grid_points, run_grid_point

    adapter = make_adapter(cell.dataset_config)
    ident = identify(cell, adapter)
    cached = _cached(store, cell, ident, Ledger(store))
    if cached is not None:
        return {**cached, "index": index}
    store.check_writable()
    settings = FinetuneSettings.from_dict(ident.settings)
    points = grid_points(settings)
    if not 0 <= index < len(points):
        raise DataValidationError(f"grid point {index} does not exist: the grid has {len(points)} points")
    scratch = scratch_folder(store, extract, FINETUNE, ident.cell_id, f"select-{index:03d}")
    with _ONE_RUN:
        result = run_grid_point(cell.encoder.spec(), _splits(cell, adapter), settings, points[index], scratch,
                                extract.device, stage="select")
    return {"status": DONE, "cell_id": ident.cell_id, "index": index, "result": result}


def finetune_finish(store: Any, cell: EncoderCell, points: Sequence[Mapping[str, Any]],
                    extract: ExtractConfig) -> dict[str, Any]:
    """Select the best grid point, refit it on train + validation, test it, record the cell.

    Parameters
    ----------
    store : the FeatureStore.
    cell : a ``finetune`` cell.
    points : the outcomes of :func:`finetune_point`, one per grid point; a point not done
        here (cached meanwhile) is run again from its saved state.
    extract : the config's ``extract`` section.

    Returns
    -------
    dict
        The cell's outcome: names, ``cell_id``, ``status`` (``computed`` or ``cached``).

    Raises
    ------
    DataValidationError
        A grid point failed (its reason is named), or every point diverged.
    """
    from pipeline.protocols.finetune import FinetuneSettings, finetune_result, grid_points, run_grid_point, select_best

    adapter = make_adapter(cell.dataset_config)
    ident = identify(cell, adapter)
    ledger = Ledger(store)
    cached = _cached(store, cell, ident, ledger)
    if cached is not None:
        return cached
    store.check_writable()
    failed = [p for p in points if p.get("status") == "failed"]
    if failed:
        raise DataValidationError(f"{len(failed)} of {len(points)} grid points failed, e.g. point "
                                  f"{failed[0].get('index')}: {failed[0].get('reason')}")
    settings = FinetuneSettings.from_dict(ident.settings)
    grid = grid_points(settings)
    done = {int(p["index"]): p["result"] for p in points if p.get("status") == DONE and p["cell_id"] == ident.cell_id}
    spec, splits = cell.encoder.spec(), _splits(cell, adapter)
    selections = []
    with _ONE_RUN:
        for i, point in enumerate(grid):
            if i not in done:
                done[i] = run_grid_point(spec, splits, settings, point, scratch_folder(
                    store, extract, FINETUNE, ident.cell_id, f"select-{i:03d}"), extract.device, stage="select")
            selections.append(done[i])
        best = select_best(selections, settings)
        refit = run_grid_point(spec, splits, settings, best["point"],
                               scratch_folder(store, extract, FINETUNE, ident.cell_id, "refit"), extract.device,
                               stage="refit")
    out = finetune_result(selections, refit, settings)
    runs = [{"stage": r["stage"], **r["point"], **r["timing"], "resumed_from_step": r["resumed_from_step"],
             "steps_done": r["steps_done"]} for r in [*selections, refit]]
    diag = {**out["diagnostics"], "runs": runs}
    from pipeline.protocols.fit_warnings import fit_warning

    warnings = []
    if diag["diverged_points"]:
        warnings.append(fit_warning("runtime", f"{diag['diverged_points']} of {len(grid)} grid points diverged "
                                               "(non-finite training loss)"))
    if diag["temperature_at_bound"]:
        warnings.append(fit_warning("temperature_edge", f"the fitted temperature {diag['temperature']:.3g} is at "
                                                        "its search bound"))
    record = _record(store.url, cell, ident, out["metrics"], diag, warnings, _gpu_use(runs),
                     n_train=refit["n_train"], n_test=refit["n_eval"], converged=bool(diag["converged"]))
    added = put_record(store, cell, record, None)
    remove_scratch(store, extract, FINETUNE, ident.cell_id)
    return _outcome(cell, ident.cell_id, "computed" if added else "cached")


def _gpu_use(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Device, training steps/s over the steps this run trained, peak memory over the runs."""
    seconds = sum(r["seconds"] for r in runs if r.get("steps_per_second"))
    steps = sum(r["steps_per_second"] * r["seconds"] for r in runs if r.get("steps_per_second"))
    peaks = [r["peak_memory_bytes"] for r in runs if r.get("peak_memory_bytes") is not None]
    return {"device": runs[-1]["device"], "device_name": runs[-1]["device_name"],
            "steps_per_second": steps / seconds if seconds else None, "train_seconds": seconds,
            "steps_trained": int(round(steps)), "peak_memory_bytes": max(peaks) if peaks else None}


def diagnostic_cell(store: Any, cell: EncoderCell, extract: ExtractConfig) -> dict[str, Any]:
    """Run a ``saliency`` or ``colour_detail`` cell and record it with its example pictures.

    Parameters
    ----------
    store : the FeatureStore.
    cell : the cell.
    extract : the config's ``extract`` section (``device``).

    Returns
    -------
    dict
        The cell's outcome: names, ``cell_id``, ``status`` (``computed`` or ``cached``).
    """
    import torch

    from pipeline.protocols import diagnostics as diag_mod
    from pipeline.protocols.inputs.devices import resolve_device

    adapter = make_adapter(cell.dataset_config)
    ident = identify(cell, adapter)
    cached = _cached(store, cell, ident, Ledger(store))
    if cached is not None:
        return cached
    store.check_writable()
    device = resolve_device(extract.device)
    s = dict(ident.settings)
    split = cell.dataset_config.test_split
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    with _ONE_RUN:
        if cell.protocol == SALIENCY:
            out = diag_mod.saliency_study(cell.encoder.spec(), adapter, split, diag_mod.SaliencySettings(**s), device)
            ex = out["examples"]
            png = diag_mod.render_saliency_png(ex["images"], ex["maps"]) if len(ex["images"]) else None
        else:
            net = s.pop(PERCEPTUAL)
            out = diag_mod.colour_detail_study(cell.encoder.spec(), adapter, split, diag_mod.InversionSettings(**s),
                                               device, diag_mod.PerceptualNet(**net) if net else None)
            ex = out["examples"]
            png = (diag_mod.render_reconstructions_png(ex["originals"], ex["reconstructions"])
                   if len(ex["originals"]) else None)
    seconds = time.perf_counter() - t0
    n_images = int(out["diagnostics"]["n_images"])
    gpu = {"device": device.type, "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "seconds": seconds, "images_per_second": n_images / seconds if seconds else None,
           "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None}
    diagnostics = {**out["diagnostics"], "split": split, "examples": png is not None}
    record = _record(store.url, cell, ident, out["metrics"], diagnostics, [], gpu, n_train=0, n_test=n_images,
                     converged=True)
    added = put_record(store, cell, record, png)
    return _outcome(cell, ident.cell_id, "computed" if added else "cached")


def _record(store_url: str, cell: EncoderCell, ident: CellIdentity, metrics: Mapping[str, Any],
            diagnostics: Mapping[str, Any], warnings: list[dict[str, str]], gpu: Mapping[str, Any], *, n_train: int,
            n_test: int, converged: bool) -> dict[str, Any]:
    """A ledger record of the same shape as a feature cell's, plus the device it ran on."""
    entry = get_encoder_protocol(cell.protocol)
    return json_ready({
        "cell_id": ident.cell_id, "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
        "setting": cell.setting, "protocol": cell.protocol, "protocol_version": entry.version,
        "settings": ident.settings, "config_hash": config_hash(ident.result_settings), "splits": cell.splits(),
        "fingerprints": ident.fingerprints, "metrics": dict(metrics), "diagnostics": dict(diagnostics),
        "warnings": warnings, "converged": converged, "n_train": n_train, "n_test": n_test,
        "timings": {"read_s": 0.0, "fit_s": gpu.get("train_seconds", gpu.get("seconds"))}, "gpu": dict(gpu),
        "provenance": {**ident.provenance, "encoder_protocol": True, "store": store_url},
        "recorded": now_iso(),
    })
