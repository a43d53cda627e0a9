"""The benchmark report: one static HTML file with its plots embedded.

Sections: failures (at the top, never hidden), data problems, accuracy tables per protocol
setting and layer (best per column marked), the best layer per encoder, low-shot curves
(absolute and relative to a baseline encoder, ImageNet-CoG style), correlation scatters
against the reference (Ericsson et al. 2021, figure 1), the invariance audit, calibration,
solver warnings and, one click from every number, each record's provenance.

Where to look: ``html`` (escaping building blocks), ``plots`` (matplotlib figures),
``model`` (what the report is built from), ``scores``, ``correlation``, ``audits`` and
``overview`` (the sections), ``files`` (the atomic write).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.report.audits import VIOLATION_MARKER, data_section, failed_section, invariance_section, warnings_section
from jobs.report.correlation import correlation_section
from jobs.report.encoder import encoder_sections
from jobs.report.files import write_atomic
from jobs.report.html import page
from jobs.report.model import build_run
from jobs.report.overview import overview_section, provenance_section
from jobs.report.scores import (
    BEST_MARKER, accuracy_section, best_layer_section, calibration_section, lowshot_section,
)

if TYPE_CHECKING:
    from jobs.config import BenchmarkConfig
    from jobs.correlate import CorrelationReport

__all__ = ["BEST_MARKER", "VIOLATION_MARKER", "write_report"]


def write_report(records: list[dict], correlation: CorrelationReport | None, config: BenchmarkConfig, path: str,
                 reference: dict[str, float] | None = None, *, failures: Sequence[Mapping[str, Any]] = (),
                 aside: Sequence[Mapping[str, Any]] | None = None, data_notes: Sequence[Mapping[str, Any]] = (),
                 waiting: Sequence[str] = (), problems: Sequence[str] = ()) -> str:
    """Write the benchmark's HTML report for ``records`` (ledger records) to ``path``; return the path.

    ``failures``: failure records of this config's work (listed first); ``aside``: records
    set aside elsewhere (older settings); ``data_notes``: images left out and small classes
    per dataset split; ``waiting``: checkpoints still being written; ``problems``: run-level
    messages.
    """
    run = build_run(list(records), config, aside=aside, failures=failures, data_notes=data_notes,
                    waiting=waiting, problems=problems)
    sections = [
        failed_section(run),
        overview_section(run),
        data_section(run),
        accuracy_section(run),
        best_layer_section(run),
        lowshot_section(run),
        correlation_section(run, correlation, reference),
        invariance_section(run),
        calibration_section(run),
        *encoder_sections(run, config),  # fine-tuning, saliency, colour detail
        warnings_section(run),
        provenance_section(run),
    ]
    out = Path(path)
    write_atomic(out, page("repeval benchmark report", sections))
    return str(out)
