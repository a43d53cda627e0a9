"""What ``repeval results`` and ``repeval report`` show: a config's current records under
its own names, the store's history, and the failures on record; and the same records as a
pandas table for a notebook (:func:`results_frame`), each row with its checkpoint's
series, step, file, epoch and weights fingerprint where they are known."""

from __future__ import annotations

from typing import Any

from jobs.config import BenchmarkConfig, load_config
from jobs.evaluation.identity import recorded_cells
from jobs.run.plan import list_work
from jobs.report.inputs import config_failures, history, run_records
from pipeline.analysis.series.steps import checkpoint_epoch
from storage_schema import FeatureStore
from storage_schema.ledger import FailureLog, Ledger, latest_records
from storage_schema.store import DEFAULT_STORE
from storage_schema.tables import records_frame

#: The fields :func:`checkpoint_fields` adds to every row (None where not known).
CHECKPOINT_FIELDS = ("series", "step", "epoch", "checkpoint", "weights_fingerprint")


def config_cells(store, cfg: BenchmarkConfig) -> tuple[list[dict[str, Any]], list[Any], Any]:
    """(recorded cells as ``cell_id`` + names, cells without a record, the plan) of ``cfg``
    at its current settings, the checkpoint folders listed as they are now (no encoder is
    loaded: ``jobs.evaluation.identity.recorded_cells``)."""
    plan = list_work(cfg, store=store, ready_only=False)
    found, missing = recorded_cells(store, plan.cells)
    return found, missing, plan


def config_records(store, cfg: BenchmarkConfig, all_records: bool = False) -> tuple[list[dict[str, Any]], int]:
    """(rows, cells not evaluated yet): the config's current records under its names; with
    ``all_records`` its history too (older settings, replaced weights), marked not current."""
    rows, missing, _ = _config_rows(store, cfg, all_records)
    return rows, missing


def _config_rows(store, cfg: BenchmarkConfig, all_records: bool) -> tuple[list[dict[str, Any]], int, Any]:
    cells, missing, plan = config_cells(store, cfg)
    rows = [{**r, "current": True} for r in run_records(store, cells)]
    if all_records:
        rows += [{**r, "current": False} for r in history(store, plan.config, rows)]
    return rows, len(missing), plan


def store_records(store, all_records: bool = False,
                  records: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every ledger record (``all_records``), or the latest per (model, dataset, layer,
    setting); ``records``: the ledger's records when already read."""
    records = list(Ledger(store)) if records is None else records
    if all_records:
        chosen, _ = latest_records(records)
        latest = {r.get("cell_id") for r in chosen}
        return [{**r, "current": r.get("cell_id") in latest} for r in records]
    return latest_records(records)[0]


def failed_rows(store, cfg: BenchmarkConfig | None = None) -> list[dict[str, Any]]:
    """Failure records on file (of ``cfg``'s work when given), oldest first."""
    if cfg is None:
        return FailureLog(store).records()

    plan = list_work(cfg, store=store, ready_only=False)
    return config_failures(store, plan.config, plan.cells, plan.units)


def result_rows(store, cfg: BenchmarkConfig | None, all_records: bool = False) -> tuple[list[dict[str, Any]], int]:
    """(rows, cells not evaluated yet) as ``repeval results`` shows them: ``cfg``'s records
    (:func:`config_records`), or without a config the store's latest per cell
    (:func:`store_records`), each with :func:`checkpoint_fields`."""
    if cfg is None:
        return checkpoint_fields(store_records(store, all_records), []), 0
    rows, missing, plan = _config_rows(store, cfg, all_records)
    # the scanned checkpoints are encoders of the planned config, not of the file's
    return checkpoint_fields(rows, plan.config.encoders), missing


def checkpoint_fields(rows: list[dict[str, Any]], encoders) -> list[dict[str, Any]]:
    """Each row with ``series`` and ``step`` (its encoder's, in ``encoders``), ``checkpoint``
    (the encoder's weights file, else the file its record's provenance names), ``epoch``
    (``pipeline.analysis.series.steps.checkpoint_epoch``) and ``weights_fingerprint`` (the
    record's provenance); None where not known (a record of imported features has no weights)."""
    by_name = {e.name: e for e in encoders}
    epochs: dict[str, int | None] = {}
    out = []
    for row in rows:
        enc = by_name.get(str(row.get("model")))
        prov = row.get("provenance") if isinstance(row.get("provenance"), dict) else {}
        weights = prov.get("weights") if isinstance(prov.get("weights"), dict) else {}
        path = None
        if enc is not None and enc.weights not in ("random", "pretrained") and not enc.weights.startswith("timm:"):
            path = enc.weights
        elif weights.get("source") == "checkpoint":
            path = weights.get("file")
        if path is not None and path not in epochs:
            epochs[path] = None if "://" in path else checkpoint_epoch(path)
        out.append({**row, "series": enc.series if enc is not None else None,
                    "step": enc.step if enc is not None else None, "epoch": epochs.get(path) if path else None,
                    "checkpoint": path, "weights_fingerprint": prov.get("weights_fingerprint")})
    return out


def results_frame(config=None, *, store=None, all_records: bool = False, failed: bool = False):
    """What ``repeval results`` shows, as a pandas DataFrame: ``from jobs.report.results import
    results_frame``.

    Parameters
    ----------
    config : str, dict, BenchmarkConfig or None
        A config (a YAML path, a dict or a loaded one): its records at its current settings
        under its names, as ``repeval results --config``.
    store : str or FeatureStore or None
        Without a config: a store (default ``./repeval-store``), its latest record per cell, as
        ``repeval results --store``.
    all_records : bool
        Add the history, with a ``current`` column (``--all``).
    failed : bool
        Return the failures on record instead (``--failed``).

    Returns
    -------
    pandas.DataFrame
        One row per record (the table ``--format parquet`` writes).
    """
    import pandas as pd

    cfg = load_config(config) if config is not None and not isinstance(config, BenchmarkConfig) else config
    if cfg is not None:
        st = cfg.open_store(read_only=True)
    else:
        st = store if isinstance(store, FeatureStore) else FeatureStore(store or DEFAULT_STORE, read_only=True)
    if failed:
        return pd.DataFrame(failed_rows(st, cfg))
    rows, _ = result_rows(st, cfg, all_records)
    return records_frame(rows)
