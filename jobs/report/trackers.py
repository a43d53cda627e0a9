"""Each newly evaluated checkpoint's primary scores, keyed by its training step, to the
experiment trackers a lab already watches (``report.trackers``): TensorBoard event files
and MLflow runs."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from jobs.analysis.compare import record_score
from jobs.config import BenchmarkConfig
from jobs.config.report import TrackerConfig
from jobs.run.failures import one_line
from storage_schema.ledger import Ledger

__all__ = ["CONNECT_SECONDS", "REQUEST_SECONDS", "ScorePoint", "log_to_trackers", "new_score_points"]

log = logging.getLogger("repeval")

#: The one connection to an MLflow server before anything is sent to it, at most this long.
CONNECT_SECONDS = 3.0
#: Each of MLflow's requests once the server answered, at most this long (no retry).
REQUEST_SECONDS = 10
_BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics
_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9_\-. /:]")  # what MLflow accepts in a metric key
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_.=+@-]")


@dataclass(frozen=True)
class ScorePoint:
    """One score for a tracker: the run (series) and step it belongs to, its key and value."""

    run: str
    step: int
    key: str
    value: float
    encoder: str


def new_score_points(store, cfg: BenchmarkConfig, outcomes: Iterable[Mapping[str, Any]]) -> list[ScorePoint]:
    """The scores of the cells this run computed, of encoders with a training step, in step order."""
    # ``cfg`` is the planned config (its encoders include the scanned checkpoints, with
    # their series and steps); ``outcomes`` the cells' outcomes (``status``, ``cell_id`` and
    # their names).
    stepped = {e.name: (e.series or e.name, e.step) for e in cfg.encoders if e.step is not None}
    ledger = Ledger(store)
    points = []
    for o in outcomes:
        model = str(o.get("model"))
        if o.get("status") != "computed" or not o.get("cell_id") or model not in stepped:
            continue
        score = record_score(ledger.get(o["cell_id"]))
        if score is None:  # no finite score: nothing a curve could show
            continue
        run, step = stepped[model]
        points.append(ScorePoint(run, int(step), f"{o.get('setting')}/{o.get('dataset')}/{o.get('layer')}",
                                 score, model))
    return sorted(points, key=lambda p: (p.run, p.step, p.key))


def log_to_trackers(store, cfg: BenchmarkConfig, outcomes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Log the new scores to every tracker of ``cfg.report.trackers``; one entry per tracker."""
    # Returns a list of ``{"kind", "where", "logged", "error", "seconds"}``: ``logged`` the
    # scores written, ``error`` None or the one-line reason the tracker could not log (also
    # one warning in the run's log), ``seconds`` the time it took. Never raises for a
    # tracker's failure.
    trackers = list(cfg.report.trackers)
    if not trackers:
        return []
    try:
        points, unread = new_score_points(store, cfg, outcomes), None
    except Exception as exc:  # noqa: BLE001  a record not read back: every tracker says so, the run goes on
        points, unread = [], exc
    out = []
    for tracker in trackers:
        where = tracker.dir if tracker.kind == "tensorboard" else tracker.tracking_uri
        entry: dict[str, Any] = {"kind": tracker.kind, "where": where, "logged": 0, "error": None}
        started = time.perf_counter()
        try:
            if unread is not None:
                raise unread
            if points:
                _WRITERS[tracker.kind](tracker, points)
            entry["logged"] = len(points)
        except Exception as exc:  # noqa: BLE001  a tracker's failure must not lose the run's records
            entry["error"] = one_line(exc)
            log.warning("%s tracker %s: the new scores were not logged: %s (the records are in the ledger)",
                        tracker.kind, where, entry["error"])
        entry["seconds"] = round(time.perf_counter() - started, 3)
        out.append(entry)
    return out


def _by_run(points: list[ScorePoint]) -> dict[str, list[ScorePoint]]:
    runs: dict[str, list[ScorePoint]] = {}
    for p in points:
        runs.setdefault(_UNSAFE_RUN.sub("_", p.run), []).append(p)
    return runs


def _tensorboard(tracker: TrackerConfig, points: list[ScorePoint]) -> None:
    """Scalars in ``<dir>/<run>/``: a new event file per run of repeval, which TensorBoard reads together."""
    # deferred: torch's writer imports the tensorboard package, configured or not installed
    from torch.utils.tensorboard import SummaryWriter

    for run, pts in _by_run(points).items():
        writer = SummaryWriter(log_dir=os.path.join(str(tracker.dir), run))
        try:
            for p in pts:
                writer.add_scalar(p.key, p.value, global_step=p.step)
        finally:
            writer.close()


def _mlflow(tracker: TrackerConfig, points: list[ScorePoint]) -> None:
    """Metrics of the series' run in the experiment (created the first time)."""
    uri = str(tracker.tracking_uri)
    if uri.startswith("file:"):  # MLflow >= 3.7 refuses its file store unless this is set
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    _check_reachable(uri)  # a server that is down: one short connection, not MLflow's minutes of back-off
    with _bounded_http():
        _mlflow_log(uri, tracker, points)


def _check_reachable(uri: str) -> None:
    """One TCP connection to an ``http(s)://`` tracking server, at most ``CONNECT_SECONDS``;
    other URIs (a local store, ``databricks``) are left to MLflow."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise ConnectionError(f"the MLflow server {parts.hostname}:{port} does not answer "
                              f"({exc.strerror or str(exc) or 'no answer'}, {CONNECT_SECONDS:g} s allowed)") from exc


@contextlib.contextmanager
def _bounded_http() -> Iterator[None]:
    """MLflow's requests without retries and with a short timeout (a lab's own settings of
    those variables win), and urllib3's warnings off the terminal, for this call only."""
    wanted = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(REQUEST_SECONDS)}
    added = [k for k in wanted if k not in os.environ]
    for k in added:
        os.environ[k] = wanted[k]
    quiet = logging.getLogger("urllib3")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)
        for k in added:
            os.environ.pop(k, None)


def _mlflow_log(uri: str, tracker: TrackerConfig, points: list[ScorePoint]) -> None:
    """The series' runs found or created, their metrics logged in batches, each run ended."""
    # deferred: mlflow loads only when a tracker names it
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(tracker.experiment)
    eid = experiment.experiment_id if experiment is not None else client.create_experiment(tracker.experiment)
    for run, pts in _by_run(points).items():
        found = client.search_runs([eid], filter_string=f"tags.`repeval.series` = '{run}'", max_results=1)
        if found:
            run_id = found[0].info.run_id
        else:
            run_id = client.create_run(eid, run_name=run, tags={"repeval.series": run}).info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric(_UNSAFE_KEY.sub("_", p.key), p.value, now, p.step) for p in pts]
        for start in range(0, len(metrics), _BATCH):
            client.log_batch(run_id, metrics=metrics[start:start + _BATCH])
        client.set_terminated(run_id)


_WRITERS = {"tensorboard": _tensorboard, "mlflow": _mlflow}
