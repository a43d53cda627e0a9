"""The life of one run: a config file loaded once, its store opened once, its checkpoint
folders scanned once, its work listed once, then answered, planned, executed and recorded."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.config import BenchmarkConfig, load_config
from jobs.config.checkpoint_folders import ScanResult, alias_line, wait_for_settled
from jobs.evaluation.encoder_identity import name_clash_lines
from jobs.run.changes import Changes, detect_changes, save_state, settings_edited
from jobs.run.ledger_answer import Answer, ledger_answer, record_run
from jobs.run.plan import (
    Plan, check_work, keep_scan_facts, list_work, open_store_if_any, record_refused, scan_folders,
)
from pipeline.errors import RepevalError
from pipeline.terminal import printable
from storage_schema import FeatureStore
from storage_schema.record_keys import watch_key

__all__ = ["Run", "RunSummary"]

log = logging.getLogger("repeval")

#: What executes a checked plan (``flows.benchmark.run_plan`` or a shell around it):
#: ``execute(plan, reason=..., new_encoders=..., early=..., dask_address=...)`` -> the flow's summary.
Executor = Callable[..., Mapping[str, Any]]


@dataclass(frozen=True)
class RunSummary:
    """What one run did: counts, failures, the report, the correlation figures.

    Read by attribute; ``summary[key]`` and ``summary.get(key)`` read the flow's whole
    summary (``details``: every key ``repeval run --json`` prints).

    Attributes
    ----------
    reason : str
        Why it ran (``run``, ``scan: new checkpoints``, ...).
    units, cells : int
        The extraction units and evaluation cells planned.
    computed, cached : int
        Cells evaluated now, and taken from the ledger.
    failures : list of dict
        The failure records of everything that failed (units, cells, checkpoints, the
        correlation).
    report : str or None
        The HTML report's path.
    correlation : dict or None
        The correlation figures (``jobs.analysis.correlate``).
    figures : list of str
        The correlation's lines, as ``repeval run`` ends with them.
    waiting : list of str
        Checkpoints still being written after their ``settle_seconds``: not evaluated.
    all_skipped : list of dict
        Failure records, when every file of the folders failed before and is unchanged
        (the folders gave this run nothing); else empty.
    nothing_to_do : bool
        Answered from the ledger: nothing ran.
    said : str
        The ledger's answer in one line (when ``nothing_to_do``).
    ran : bool
        Whether the flow ran.
    details : dict
        The flow's summary as it returned it.
    """

    reason: str
    units: int = 0
    cells: int = 0
    computed: int = 0
    cached: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    report: str | None = None
    correlation: dict[str, Any] | None = None
    figures: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    all_skipped: list[dict[str, Any]] = field(default_factory=list)
    nothing_to_do: bool = False
    said: str = ""
    ran: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.details[key]

    def get(self, key: str, default: Any = None) -> Any:
        """A key of the flow's summary, or ``default``.

        Parameters
        ----------
        key : str
            A field's name.
        default : Any
            Returned for a name that is no field.

        Returns
        -------
        Any
        """
        return self.details.get(key, default)

    def problems(self) -> str | None:
        """What makes the run's exit status 3, in words; None when nothing did.

        Returns
        -------
        str or None
        """
        parts = []
        if self.failures:
            parts.append(f"{len(self.failures)} failure(s)")
        if self.waiting:
            parts.append(f"{len(self.waiting)} checkpoint(s) left out")
        if self.all_skipped:
            parts.append(f"every checkpoint file ({len(self.all_skipped)}) skipped as failed before")
        return "; ".join(parts) if parts else None


class Run:
    """One run of a benchmark config: what every caller of "run this config" walks.

    The config is loaded once, the store opened once (read-only until the run writes),
    the folders scanned once and the work listed once, however many verbs ask.

    Parameters
    ----------
    config : str, path, BenchmarkConfig or mapping
        The config file (its path keys what the schedules remember), a loaded config, or
        a config's contents.
    retry_failed : bool
        Take scanned files that failed before even if unchanged (and never answer from
        the ledger).
    scheduled : bool
        A scheduled run (serve's scan and watch, a deployment): a checkpoint folder whose
        settings are wrong refuses its files one by one instead of failing the run.
    say : callable, optional
        Where the run's lines go (a file refused, an alias, a name clash, a data warning).
    """

    def __init__(self, config: str | os.PathLike | BenchmarkConfig | Mapping[str, Any], *, retry_failed: bool = False,
                 scheduled: bool = False, say: Callable[[str], None] | None = None):
        if isinstance(config, (str, os.PathLike)):
            self.path = os.path.abspath(config)
            self.config = load_config(self.path)
        else:  # loaded already, or a mapping as a config file holds it
            self.path, self.config = None, config if isinstance(config, BenchmarkConfig) else load_config(config)
        self.retry_failed, self.scheduled = retry_failed, scheduled
        self._say = say or (lambda line: None)
        self._stores: dict[bool, FeatureStore | None] = {}
        self._scan: ScanResult | None = None
        self._listing: Plan | None = None

    # -- what the run reads once -------------------------------------------------------
    def store(self, writable: bool = False) -> FeatureStore | None:
        """The config's store: writable (made if missing), or read-only (None when there
        is none yet); opened once each way.

        Parameters
        ----------
        writable : bool
            Open it for writing (made if missing).

        Returns
        -------
        FeatureStore or None
        """
        if writable not in self._stores:
            self._stores[writable] = self.config.open_store() if writable else (
                self._stores.get(True) or open_store_if_any(self.config))
        return self._stores[writable]

    @property
    def scan(self) -> ScanResult:
        """The checkpoint folders, scanned once."""
        if self._scan is None:
            self._scan = scan_folders(self.config, self.store(), retry_failed=self.retry_failed)
        return self._scan

    @property
    def listing(self) -> Plan:
        """The work the config asks for, listed once (no check)."""
        if self._listing is None:
            self._listing = list_work(self.config, self.scan)
        return self._listing

    @property
    def watch_key(self) -> str | None:
        """Where the schedules keep what the runs of this config file covered."""
        return watch_key(self.path) if self.path else None

    # -- verbs ---------------------------------------------------------------------------
    def settle(self) -> list[str]:
        """Wait for the folders' files still being written (at most their ``settle_seconds``),
        so a file written just before a one-shot run is evaluated by it; those still not
        ready.

        Returns
        -------
        list of str
            The files still being written after the wait.
        """
        if not self.config.checkpoints:
            return []
        left = wait_for_settled(self.config, say=self._say)
        self._scan = self._listing = None  # what settled is scanned afresh
        return left

    def changes(self) -> Changes:
        """What changed since the runs recorded: new checkpoints, edited protocol settings.

        Returns
        -------
        Changes
        """
        return detect_changes(self.store(writable=True), self.listing, self.watch_key or "")

    def settings_edited(self) -> bool:
        """Whether the protocol settings differ from those a recorded run used (read from
        the store alone: no folder scanned).

        Returns
        -------
        bool
        """
        return settings_edited(self.store(writable=True), self.config, self.watch_key or "")

    def ledger_answer(self) -> Answer | None:
        """A rerun's answer when the ledger and the store hold everything, else None.

        Returns
        -------
        Answer or None
        """
        return None if self.retry_failed else ledger_answer(self.store(), self.listing)

    def check(self) -> Plan:
        """Every check of the config and its scanned files, writing nothing; raises the
        config's mistakes (one ConfigError).

        Returns
        -------
        Plan
        """
        return check_work(self.config, self.scan, self.store(), strict_folders=not self.scheduled)

    def plan(self) -> Plan:
        """The checked plan; the files it refused recorded (the store made, once the config
        is known good).

        Returns
        -------
        Plan
        """
        plan = self.check()
        if self.config.checkpoints:
            store = self.store(writable=True)
            record_refused(store, plan)
            keep_scan_facts(store, plan.scan)
        return plan

    def go(self, execute: Executor, *, reason: str = "run", new_encoders: list[str] | None = None,
           early: bool | None = None, dask_address: str | None = None, answer: bool = True) -> RunSummary:
        """Run the config: the ledger's answer when it has everything (``answer``), else the
        checked plan executed by ``execute``, and what it covered recorded.

        Parameters
        ----------
        execute : callable
            Executes a checked plan (the flow, from ``flows``).
        reason : str
            Why it runs, as its lines and the report say.
        new_encoders : list of str, optional
            The encoders new since the last recorded run (named in the summary).
        early : bool, optional
            The early pass first (default: the config's ``early.enabled``).
        dask_address : str, optional
            An existing Dask scheduler (default: the config's, else a local cluster).
        answer : bool
            Answer an unchanged rerun from the ledger without running anything.

        Returns
        -------
        RunSummary
        """
        if answer:
            found = self.ledger_answer()
            if found is not None:
                return RunSummary(reason, units=found.units, cells=found.cells, cached=found.cells,
                                  report=found.report, correlation=found.correlation, figures=list(found.figures),
                                  nothing_to_do=True, said=found.line(), details=found.summary())
        plan = self.plan()
        self._tell(plan)
        skipped = list(plan.scan.skipped) if plan.scan.all_skipped else []
        if skipped and not plan.cells and not plan.units:  # the folders give nothing: said, no flow
            return RunSummary(reason, all_skipped=skipped, details={"all_skipped": True,
                                                                    "skipped_checkpoints": skipped})
        planned = {e.name for e in plan.config.encoders}  # a refused checkpoint is not a new encoder
        details = dict(execute(plan, reason=reason, early=early, dask_address=dask_address,
                               new_encoders=[n for n in new_encoders or [] if n in planned]))
        summary = _summary(reason, details, plan, skipped)
        self.record(plan, summary)
        return summary

    def record(self, plan: Plan, summary: RunSummary) -> None:
        """Note what the run covered: the ledger's answer for an unchanged rerun (a run
        without failures) and, for a scheduled run, the encoders the schedules count as done
        (before the first, the schedules ask the ledger what a ``repeval run`` did).

        Parameters
        ----------
        plan : Plan
            The run's plan.
        summary : RunSummary
            What the run did.
        """
        try:
            store = self.store(writable=True)
            if not summary.failures:
                record_run(store, self.listing, summary.details)
            if self.scheduled and self.watch_key:
                failed_units = {f.get("model") for f in summary.get("failed_extractions") or []}
                save_state(store, plan.config, self.watch_key,
                           [e.name for e in plan.config.encoders if e.name not in failed_units],
                           plan.scan.signatures())
        except (RepevalError, OSError) as exc:  # only costs the next rerun its full check
            log.warning("what the run covered was not noted for the next one: %s", exc)

    def note_ledger_state(self) -> None:
        """Record, as the schedules' state, that the ledger holds every cell (a ``repeval
        run`` did the work before any scheduled run)."""
        save_state(self.store(writable=True), self.listing.config, self.watch_key or "",
                   files=self.listing.scan.signatures())

    def _tell(self, plan: Plan) -> None:
        for rec in plan.checkpoint_failures:
            if rec not in plan.scan.collisions:
                self._say(f"checkpoint refused: {rec.get('file')}: {rec.get('reason')}")
        for alias in plan.scan.aliases:  # DINO's checkpoint.pth beside checkpoint0005.pth: one encoder
            self._say(alias_line(alias))
        for line in name_clash_lines(self.store(), plan.cells):  # two configs, one name, other weights
            self._say(line)
        if plan.scan.all_skipped:
            for line in all_skipped_lines(plan.scan.skipped):
                self._say(line)
        if plan.data_notes:
            # deferred: the dataset adapters and PIL, once a plan has built the datasets
            from pipeline.datasets.inspection import note_line

            for data_note in plan.data_notes:  # an empty class is never learned from, or never scored
                self._say(f"data warning: {note_line(data_note)}")


def all_skipped_lines(skipped: list[dict[str, Any]]) -> list[str]:
    """Every folder file was skipped as failed before, unchanged, under unchanged settings."""
    lines = [f"NOTHING EVALUATED FROM THE CHECKPOINT FOLDERS: every file ({len(skipped)}) failed before and neither "
             "the file nor the settings that read it (arch, checkpoint_key, strip_prefixes, input_size, layers, "
             "extract) changed since:"]
    lines += [f"  {printable(str(rec.get('file')))}: {printable(str(rec.get('reason')))}" for rec in skipped[:10]]
    if len(skipped) > 10:
        lines.append(f"  ... ({len(skipped)} in all: repeval results --failed)")
    lines.append("fix the config or the files (a changed setting or file is taken again), or try them again as "
                 "they are: repeval run --retry-failed")
    return lines


def _summary(reason: str, details: dict[str, Any], plan: Plan, skipped: list[dict[str, Any]]) -> RunSummary:
    # deferred: the correlation's lines, for a summary that has figures
    from jobs.analysis.correlate import figure_lines

    return RunSummary(reason, units=int(details.get("units") or 0), cells=int(details.get("cells") or 0),
                      computed=int(details.get("computed") or 0), cached=int(details.get("cached") or 0),
                      failures=list(details.get("failures") or []), report=details.get("report"),
                      correlation=details.get("correlation"), figures=figure_lines(details.get("correlation")),
                      waiting=list(plan.scan.waiting), all_skipped=skipped, ran=True, details=details)
