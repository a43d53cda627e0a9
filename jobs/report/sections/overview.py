"""The report's first and last sections: an overview with its contents, and the
provenance of every record (settings, fingerprints, encoder, diagnostics, timings)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from jobs.report.html import Markup, Section, anchor, el, join, label_of, name, note, section, table
from jobs.report.model import ReportRun
from storage_schema.provenance import now_iso, record_weights, short_weights, weights_summary


def contents(sections: Sequence[Any]) -> list[tuple[str, str]]:
    """(id, title) of each section that has content, in page order: the table of contents."""
    return [(s.sid, s.title) for s in sections if isinstance(s, Section) and not s.empty]


def overview_section(run: ReportRun, listed: Sequence[tuple[str, str]] = ()) -> Markup:
    """The run's facts and the table of contents: ``listed``, the sections with content."""
    facts = [
        ("generated", now_iso()),
        ("records shown (current settings, latest per cell)", len(run.records)),
        ("records set aside (older, or of changed settings)", len(run.aside)),
        ("failures on record", len(run.failures)),
        ("encoders", join([name(m) for m in run.models], ", ") if run.models else "(none)"),  # never split
        ("datasets", ", ".join(run.datasets) or "(none)"),
        ("protocol settings", ", ".join(f"{s} ({run.protocol_of.get(s)})" for s in run.settings) or "(none)"),
        ("layers", ", ".join(run.layers) or "(none)"),
        ("store", run.store),
    ]
    return section(
        "overview", "Overview",
        table(["", ""], facts, class_="facts"),
        el("nav", el("ul", [el("li", el("a", title, href=f"#{sid}")) for sid, title in listed])),
    )


_PARTS = ("settings", "fingerprints", "provenance", "diagnostics", "timings", "gpu", "metrics", "warnings")


def _block(rec: Mapping[str, Any], aside: bool) -> Markup:
    head = {k: rec.get(k) for k in ("cell_id", "model", "recorded_as", "protocol", "protocol_version",
                                    "config_hash", "splits", "converged", "n_train", "n_test", "dim", "recorded")
            if rec.get(k) is not None}
    head.update(_weights_of(rec))
    parts = [el("h4", "cell"), el("pre", json.dumps(head, indent=1, default=str))]
    for key in _PARTS:
        if key in rec:
            parts += [el("h4", key), el("pre", json.dumps(rec[key], indent=1, sort_keys=True, default=str))]
    summary = label_of(rec) + (" (set aside: older record or changed settings)" if aside else "")
    return el("details", el("summary", summary), parts, id=anchor(rec))


def _weights_of(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The weights the record says (short form) and, for a feature cell, the weights each of
    its arrays came from (``unknown`` for arrays that did not record them)."""
    prov = rec.get("provenance") or {}
    out: dict[str, Any] = {}
    if record_weights(rec):
        out["weights"] = short_weights(record_weights(rec))
    per_array = prov.get("feature_weights") if isinstance(prov, Mapping) else None
    keys = prov.get("feature_keys") if isinstance(prov, Mapping) else None
    if isinstance(per_array, Mapping):
        out["array_weights"] = {str((keys or {}).get(s, s)): short_weights(fp) for s, fp in per_array.items()}
    return out


def provenance_section(run: ReportRun) -> Markup:
    """One collapsible block per record: where its features, weights and settings came from."""
    seen: set[str] = set()
    blocks = []
    for rec, aside in [(r, False) for r in run.records] + [(r, True) for r in run.aside]:
        if anchor(rec) not in seen:
            seen.add(anchor(rec))
            blocks.append(_block(rec, aside))
    return section("provenance", "Provenance",
                   note("Settings, feature fingerprints, encoder provenance, diagnostics and timings of "
                        "every record. An encoder whose weights equal another's shares its features' "
                        "record (same fingerprints), shown under each name; 'recorded_as' is the name "
                        "it was first computed under."), checkpoints_read(run), blocks, empty=not blocks)


def checkpoints_read(run: ReportRun) -> Markup | str:
    """What was done to each encoder's checkpoint file: the state dict's key, the prefix
    stripped, the tensors dropped, the resampling (docs/checkpoints.md)."""
    rows: dict[tuple[str, str], str] = {}
    for rec in run.records:
        weights = (rec.get("provenance") or {}).get("weights")
        if isinstance(weights, Mapping) and weights.get("source") == "checkpoint":
            rows.setdefault((str(rec.get("model")), str(weights.get("file"))),
                            weights_summary(weights) or "read as it is")
    if not rows:
        return ""
    return table(["encoder", "checkpoint file", "what was done to it"],
                 [[m, f, what] for (m, f), what in sorted(rows.items())], class_="facts")
