"""Writing the report: every section in page order, the overview's contents, one atomic file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.report.sections.audits import (
    VIOLATION_MARKER, data_section, failed_section, invariance_section, warnings_section,
)
from jobs.report.sections.cog import cog_section
from jobs.report.sections.correlation import correlation_section
from jobs.report.sections.dense import dense_section
from jobs.report.sections.early import EARLY_MARKER, early_section
from jobs.report.sections.encoder import encoder_sections
from jobs.report.files import write_atomic
from jobs.report.html import page
from jobs.report.model import build_run
from jobs.report.sections.overview import contents, overview_section, provenance_section
from jobs.report.sections.ranks import ranks_section
from jobs.report.sections.scores import (
    BEST_MARKER, accuracy_section, best_layer_section, calibration_section, lowshot_section,
)
from jobs.report.sections.series import series_section
from jobs.report.sections.summary import REGRESSION_MARKER, summary_section

if TYPE_CHECKING:
    from jobs.config import BenchmarkConfig
    from jobs.analysis.correlate import CorrelationReport

__all__ = ["BEST_MARKER", "EARLY_MARKER", "REGRESSION_MARKER", "VIOLATION_MARKER", "write_report"]


def write_report(records: list[dict], correlation: CorrelationReport | None, config: BenchmarkConfig, path: str,
                 reference: dict[str, float] | None = None, *, failures: Sequence[Mapping[str, Any]] = (),
                 aside: Sequence[Mapping[str, Any]] | None = None, data_notes: Sequence[Mapping[str, Any]] = (),
                 waiting: Sequence[str] = (), problems: Sequence[str] = (), series: Sequence[Any] = (),
                 summary: Mapping[str, Any] | None = None, changes: Mapping[str, Any] | None = None,
                 early: Mapping[str, Any] | None = None) -> str:
    """Write the benchmark's HTML report for ``records`` to ``path``; return the path.

    Parameters
    ----------
    records : list of dict
        Ledger records.
    correlation : CorrelationReport or None
        The correlations against the reference.
    config : BenchmarkConfig
        The run's config.
    path : str
        The HTML file written.
    reference : dict or None
        Encoder name -> reference score.
    failures : sequence of mapping
        Failure records of this config's work (listed first).
    aside : sequence of mapping or None
        Records set aside elsewhere (older settings).
    data_notes : sequence of mapping
        Images left out and small classes per dataset split.
    waiting : sequence of str
        Checkpoints still being written.
    problems : sequence of str
        Run-level messages.
    series : sequence
        The analysis of each checkpoint series (``jobs.analysis.series``).
    summary : mapping or None
        The run summary (``jobs.report.events``: leaderboard, regressions).
    changes : mapping or None
        What changed since the previous run's summary (None when there was none).
    early : mapping or None
        The early estimates of the config's encoders (``jobs.early.view``).

    Returns
    -------
    str
        ``path``.
    """
    run = build_run(list(records), config, aside=aside, failures=failures, data_notes=data_notes,
                    waiting=waiting, problems=problems)
    run.series, run.summary = list(series), dict(summary) if summary is not None else None
    run.changes = dict(changes) if changes is not None else None
    run.reference = dict(reference or {})
    run.early = dict(early) if early else None
    sections = [
        failed_section(run),
        summary_section(run),  # the first screen: verdicts, leaderboard, what is not to be trusted
        series_section(run),
        early_section(run),  # estimates, apart from every exact table
        data_section(run),
        accuracy_section(run),
        best_layer_section(run),
        lowshot_section(run),
        cog_section(run),
        correlation_section(run, correlation, reference),
        ranks_section(run, reference or (correlation.reference if correlation else None),
                      config.correlation.bootstrap, config.correlation.seed),
        invariance_section(run),
        calibration_section(run),
        dense_section(run, config),  # segmentation and surface normals: tables and predicted maps
        *encoder_sections(run, config),  # fine-tuning, saliency, colour detail
        warnings_section(run),
        provenance_section(run),
    ]
    # a section with nothing to show is left out; after what needs reading first (failures,
    # the run's summary): the overview, whose contents list the sections shown
    sections = [s for s in sections if not getattr(s, "empty", False)]
    at = next(i for i, s in enumerate(sections) if getattr(s, "sid", "") == "summary") + 1
    sections.insert(at, overview_section(run, contents(sections)))
    out = Path(path)
    write_atomic(out, page("repeval benchmark report", sections))
    return str(out)
