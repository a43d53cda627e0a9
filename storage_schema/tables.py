"""Records as one tidy, typed table: what ``repeval results --format`` writes and what
``jobs.report.results.results_frame`` returns to a notebook."""

from __future__ import annotations

import json
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.errors import ConfigError
from pipeline.protocols.fit_warnings import unreliable_reasons, warning_codes
from storage_schema.provenance import canonical_json

__all__ = ["EXPORT_FORMATS", "NAME_COLUMNS", "export_records", "records_frame"]

EXPORT_FORMATS = ("table", "csv", "parquet", "json")
#: The columns that say which cell a row is, in this order, first in the table.
NAME_COLUMNS = ("model", "series", "step", "epoch", "dataset", "layer", "setting", "protocol")
#: Whole numbers that a missing value must not turn into floats (a step of 1200.0).
_INTEGER_COLUMNS = ("step", "epoch", "n_train", "n_test", "dim", "protocol_version")


def records_frame(records: Iterable[Mapping[str, Any]]):
    """Records as a pandas table: one row per record; scalar metrics as ``metric.<name>``
    and diagnostics as ``diag.<name>`` columns; settings as canonical JSON; ``warnings`` the
    record's warning codes (``pipeline.protocols.fit_warnings``) joined by commas, ``-``
    for none, and ``unreliable`` whether one of them says the score is not to be trusted;
    ``recorded`` a UTC timestamp; ``step``, ``epoch``, the counts and every column of whole
    numbers nullable integers (``Int64``), yes/no columns nullable booleans (``boolean``),
    both ``<NA>`` where missing; text columns None where missing (as Parquet reads them back)."""
    import pandas as pd

    rows = []
    for rec in records:
        row = {k: v for k, v in rec.items() if not isinstance(v, (dict, list))}
        row["warnings"] = ",".join(warning_codes(rec)) or "-"
        row["unreliable"] = bool(unreliable_reasons(rec))
        for name, value in (rec.get("metrics") or {}).items():
            if isinstance(value, (int, float, str, bool)) or value is None:
                row[f"metric.{name}"] = value
        for name, value in (rec.get("diagnostics") or {}).items():
            if isinstance(value, (int, float, str, bool)) or value is None:
                row[f"diag.{name}"] = value
        row["settings"] = canonical_json(rec.get("settings", {}))
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    for col in frame.columns:  # each column typed by what its rows hold, missing values alike
        dtype = _column_type([row.get(col) for row in rows], integer=col in _INTEGER_COLUMNS)
        if dtype is not None:
            frame[col] = pd.array([row.get(col) for row in rows], dtype=dtype)
        elif frame[col].dtype == object:  # text: a missing value is None, as Parquet and JSON read it back
            frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
    if "recorded" in frame:  # every record is stamped in ISO 8601 (storage_schema.provenance.now_iso)
        frame["recorded"] = pd.to_datetime(frame["recorded"], utc=True, format="ISO8601")
    order = [c for c in ("model", "dataset", "layer", "protocol", "setting") if c in frame]
    frame = frame.sort_values(order + ["cell_id"]).reset_index(drop=True)
    first = [c for c in NAME_COLUMNS if c in frame]
    metrics = [c for c in frame.columns if c.startswith("metric.")]
    return frame[first + metrics + [c for c in frame.columns if c not in first and c not in metrics]]


def _column_type(values: list[Any], integer: bool) -> str | None:
    """``Int64`` for whole numbers (a missing value must not turn 18 into 18.0), ``boolean``
    for yes/no, both nullable (``<NA>`` where missing, in the frame and read back from
    Parquet); None for anything else (floats keep NaN, text keeps None)."""
    present = [v for v in values if v is not None and v == v]  # v != v: a NaN already
    if integer and all(isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()
                       for v in present):
        return "Int64"
    if not present:
        return None
    if all(isinstance(v, bool) for v in present):
        return "boolean"
    if all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in present):
        return "Int64"
    return None


def export_records(records: list[Mapping[str, Any]], path: str, fmt: str) -> None:
    """Write records to ``path``: csv or parquet (the table of ``records_frame``) or json
    (the records as they are, nested settings, metrics and diagnostics included)."""
    if fmt not in ("csv", "parquet", "json"):
        raise ConfigError(f"export format {fmt!r} is not supported; choose csv, parquet or json")
    if fmt == "json":
        with open(path, "w") as f:
            json.dump([dict(r) for r in records], f, indent=1, default=str)
        return
    frame = records_frame(records)
    if fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        _write_parquet(frame, path)


def _write_parquet(frame, path: str) -> None:
    """The table with ``settings`` as Arrow's JSON type (a reader sees JSON, not just text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    if "settings" in frame and hasattr(pa, "json_"):  # pyarrow >= 19
        i = table.schema.get_field_index("settings")
        table = table.set_column(i, pa.field("settings", pa.json_()),
                                 pa.array(frame["settings"].tolist(), type=pa.json_()))
    pq.write_table(table, path)
