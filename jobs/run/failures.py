"""What failed in a run, in one line each, and its records in the store's failure log."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.errors import CheckpointError, CorruptImageError, RepevalError, StoreError
from storage_schema.ledger import FailureLog, failure_id

log = logging.getLogger(__name__)

FAILED = "failed"


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (a long message cut to 400 characters)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > 400:
        text = text[:397] + "..."
    if isinstance(exc, CorruptImageError) and "skip_bad" not in text:
        text += "; to leave unreadable images out, set skip_bad: true in the dataset's params"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """An I/O failure that a retry may cure (network, object store); never bad input."""
    return not isinstance(exc, RepevalError) and isinstance(exc, (OSError, TimeoutError, ConnectionError))


def extraction_failure(model: str, dataset: str, split: str, weights: str, exc: BaseException,
                       arch: str | None = None) -> dict[str, Any]:
    """The failure record of an extraction that raised: what was extracted, with which weights, and why it failed."""
    return {"kind": "extraction", "id": failure_id(model, dataset, split), "status": FAILED,
            "label": f"{model}/{dataset}/{split}", "model": model, "dataset": dataset, "split": split,
            "weights": weights, "arch": arch, "error_type": type(exc).__name__, "reason": one_line(exc),
            "checkpoint_error": isinstance(exc, CheckpointError)}


def cell_failure(cell: Any, reason: str, error_type: str) -> dict[str, Any]:
    """The failure record of a cell that could not be evaluated, under the cell's names."""
    return {"kind": "cell", "id": failure_id(cell.model, cell.dataset, cell.layer, cell.setting), "status": FAILED,
            "label": cell.label(), "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
            "setting": cell.setting, "protocol": cell.protocol, "cell_id": None, "error_type": error_type,
            "reason": reason}


def checkpoint_failure(path: str, size: int, mtime_ns: int, encoder: str, arch: str, reason: str,
                       error_type: str = "CheckpointError", settings: str | None = None) -> dict[str, Any]:
    """A scanned checkpoint file refused; its size and mtime tell when it changed, ``arch``
    what it was read as and ``settings`` the hash of every setting that decides how it is
    read and evaluated (``jobs.config.checkpoint_folders.reading_settings``): a corrected
    ``checkpoint_key:``, ``arch:``, ``layers:``... in the config tries it again."""
    return {"kind": "checkpoint", "id": failure_id(path), "status": FAILED, "label": path,
            "encoder": encoder, "file": path, "size": size, "mtime_ns": mtime_ns, "arch": arch,
            "settings": settings, "error_type": error_type, "reason": reason}


def correlation_failure(report_path: str, exc: BaseException) -> dict[str, Any]:
    """The failure record of a run whose correlation or report could not be made."""
    return {"kind": "correlation", "id": failure_id(report_path), "status": FAILED,
            "label": f"correlation and report {report_path}", "report": report_path,
            "error_type": type(exc).__name__, "reason": one_line(exc)}


def correlation_setting_failure(report_path: str, setting: str, reason: str) -> dict[str, Any]:
    """A correlation setting that could not be computed (a record lacks its metric, a
    measured reference is missing...): a failure like a failed cell, one per setting."""
    return {"kind": "correlation", "id": failure_id(report_path, setting), "status": FAILED,
            "label": f"correlation {setting}", "report": report_path, "setting": setting,
            "error_type": "CorrelationFailed", "reason": reason}


def sync_correlation_failures(store, report_path: str, failing: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Record the failed correlation settings of ``report_path`` and clear those of its
    settings that no longer fail; return the failures (as written, or as given when the
    store cannot be written: a report re-rendered from a read-only store still lists them)."""
    failing = list(failing)
    current = {str(f["id"]) for f in failing}
    log_ = FailureLog(store)
    try:
        for rec in log_.records("correlation"):
            if rec.get("report") == report_path and rec.get("setting") is not None and rec.get("id") not in current:
                log_.clear("correlation", str(rec["id"]))
        return [_write(log_, f) for f in failing]
    except (StoreError, OSError) as exc:  # a read-only or full store: the failures are still reported
        log.warning("could not update the failure records of %s: %s", store.url, exc)
        return failing


def sync_failures(store, *, extractions: Iterable[Mapping[str, Any]] = (), cells: Iterable[Mapping[str, Any]] = (),
                  correlation: Mapping[str, Any] | None = None, report_path: str | None = None,
                  scanned: Mapping[str, tuple[Any, ...]] | None = None,
                  checkpoints: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Record this run's failures and clear the records of what succeeded; return the failures."""
    # ``checkpoints``: scanned files refused by the plan's checks. ``scanned`` maps the
    # encoders that came from a checkpoint scan to their file's (size, mtime_ns, reading
    # settings hash): a checkpoint error while extracting one is recorded against the file, so
    # an unchanged file under unchanged settings is not taken again.
    failures = FailureLog(store)
    written: list[dict[str, Any]] = []
    scanned = scanned or {}
    try:
        known = {kind: failures.ids(kind) for kind in ("checkpoint", "extraction", "cell", "correlation")}
        written.extend(_write(failures, rec) for rec in checkpoints)
        for ext in extractions:
            if ext.get("status") == FAILED:
                written.append(_write(failures, ext))
                file = scanned.get(str(ext.get("model")))
                if ext.get("checkpoint_error") and file is not None:
                    written.append(_write(failures, checkpoint_failure(
                        str(ext["weights"]), file[0], file[1], str(ext["model"]), str(ext.get("arch")),
                        str(ext["reason"]), str(ext["error_type"]), file[2] if len(file) > 2 else None)))
                continue
            fid = failure_id(ext.get("model"), ext.get("dataset"), ext.get("split"))
            if fid in known["extraction"]:
                failures.clear("extraction", fid)
            file_id = failure_id(str(ext.get("weights"))) if ext.get("weights") else None
            if file_id in known["checkpoint"]:
                failures.clear("checkpoint", file_id)
        for out in cells:
            if out.get("status") == FAILED:
                written.append(_write(failures, out))
                continue
            fid = failure_id(out.get("model"), out.get("dataset"), out.get("layer"), out.get("setting"))
            if fid in known["cell"]:
                failures.clear("cell", fid)
        if correlation is not None:
            written.append(_write(failures, correlation))
        elif report_path is not None and failure_id(report_path) in known["correlation"]:
            failures.clear("correlation", failure_id(report_path))
    except (StoreError, OSError) as exc:  # a read-only or full store: failures are still reported
        log.warning("could not update the failure records of %s: %s", store.url, exc)
    return written


_RECORD_FIELDS = ("kind", "id", "status", "worker", "checkpoint_error")


def _write(failures: FailureLog, outcome: Mapping[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in outcome.items() if k not in _RECORD_FIELDS}
    return failures.record(str(outcome["kind"]), str(outcome["id"]), body)


def failure_line(rec: Mapping[str, Any]) -> str:
    """One terminal line for a failure record or outcome."""
    return f"{rec.get('label')}: {rec.get('reason')}"
