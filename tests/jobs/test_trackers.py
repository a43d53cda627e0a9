"""``report.trackers``: each newly evaluated checkpoint's primary scores, keyed by its step,
in TensorBoard event files and an MLflow store, read back with their own libraries; a
tracker that cannot log is a warning; an unknown kind is a config error."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from jobs.config import load_config
from jobs.config.report import TRACKER_KINDS
from jobs.report.trackers import _WRITERS, log_to_trackers
from pipeline.errors import ConfigError
from storage_schema.ledger import Ledger
from tests.helpers.evidence import noisy_encoders
from tests.helpers.small_series import series_config

pytest.importorskip("tensorboard", reason="the trackers extra: pip install -e '.[trackers]'")
pytest.importorskip("mlflow", reason="the trackers extra: pip install -e '.[trackers]'")

SETTINGS = {"knn": ("knn", {"n_neighbors": 10})}
KEY = "knn/digitsnpz/pre_logits"


def _night(tmp: Path, raw: dict, noise: dict[int, float]) -> tuple[object, list[dict]]:
    """Checkpoints of ``noise``'s steps in the folder, their features in the store, the
    plan's cells evaluated: (planned config, outcomes), as a run has them."""
    from jobs.evaluation.evaluate import evaluate_cells
    from jobs.run.plan import list_work

    folder = tmp / "run7"
    folder.mkdir(parents=True, exist_ok=True)
    for step in noise:
        save_file({"w": np.full(2, step, np.float32)}, str(folder / f"ck-step{step}.safetensors"))
    cfg = load_config(raw)
    store = noisy_encoders(tmp, {f"ck-step{s}": v for s, v in noise.items()}, store=cfg.open_store())
    plan = list_work(cfg, ready_only=False)
    return plan.config, evaluate_cells(store, plan.cells)


def _scores(cfg) -> dict[int, float]:
    store = cfg.open_store(read_only=True)
    return {int(r["model"].removeprefix("ck-step")): r["metrics"]["score"] for r in Ledger(store)}


def test_kinds_have_writers():
    assert set(TRACKER_KINDS) == set(_WRITERS)


def test_new_scores_read_back_with_tensorboard_and_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    raw = series_config(tmp_path, SETTINGS, trackers=[{"kind": "tensorboard"}, {"kind": "mlflow"}])
    cfg, outcomes = _night(tmp_path, raw, {100: 6.0, 200: 0.5})
    tb, uri = Path(cfg.report.trackers[0].dir), cfg.report.trackers[1].tracking_uri
    assert tb == tmp_path / "out" / "tensorboard" and uri == (tmp_path / "out" / "mlruns").as_uri()  # beside the report
    logged = log_to_trackers(cfg.open_store(), cfg, outcomes)
    assert [(t["kind"], t["logged"], t["error"]) for t in logged] == [("tensorboard", 2, None), ("mlflow", 2, None)]

    # the next night: one new checkpoint; the two already logged are answered from the ledger
    cfg, outcomes = _night(tmp_path, raw, {100: 6.0, 200: 0.5, 300: 2.0})
    assert sorted(o["status"] for o in outcomes) == ["cached", "cached", "computed"]
    assert [t["logged"] for t in log_to_trackers(cfg.open_store(), cfg, outcomes)] == [1, 1]
    scores = _scores(cfg)

    events = EventAccumulator(str(tb / "run7"))
    events.Reload()
    assert KEY in events.Tags()["scalars"]
    read = {e.step: e.value for e in events.Scalars(KEY)}
    assert sorted(read) == [100, 200, 300]  # each step once: nothing logged twice
    assert read == pytest.approx(scores, abs=1e-6)  # float32 in the event file

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("repeval")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_name for r in runs] == ["run7"]  # the second night found the series' run
    history = client.get_metric_history(runs[0].info.run_id, KEY)
    assert sorted(m.step for m in history) == [100, 200, 300]
    assert {m.step: m.value for m in history} == pytest.approx(scores)


def test_a_tracker_that_cannot_log_is_a_warning(tmp_path, caplog):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the event folder would go")
    raw = series_config(tmp_path, SETTINGS, trackers=[{"kind": "tensorboard", "dir": str(blocked)}])
    cfg, outcomes = _night(tmp_path, raw, {100: 6.0})
    with caplog.at_level(logging.WARNING, logger="repeval"):
        (entry,) = log_to_trackers(cfg.open_store(), cfg, outcomes)
    assert entry["logged"] == 0 and entry["error"]
    assert "tensorboard tracker" in caplog.text and "the records are in the ledger" in caplog.text
    assert len(list(Ledger(cfg.open_store(read_only=True)))) == 1  # the record stays


def test_unknown_kind_is_a_config_error_naming_the_choices(tmp_path):
    raw = series_config(tmp_path, SETTINGS, trackers=[{"kind": "wandb"}])
    with pytest.raises(ConfigError) as caught:
        load_config(raw)
    message = str(caught.value)
    assert "report.trackers[0].kind: 'wandb'" in message and "tensorboard, mlflow" in message
    raw = series_config(tmp_path, SETTINGS, trackers=[{"kind": "mlflow", "dir": "tb"}])
    with pytest.raises(ConfigError, match="only a tensorboard tracker has a dir"):
        load_config(raw)


def test_tracker_paths_are_taken_from_the_config_folder(tmp_path):
    raw = series_config(tmp_path, SETTINGS, trackers=[{"kind": "tensorboard", "dir": "tb"},
                                                      {"kind": "mlflow", "tracking_uri": "ml"},
                                                      {"kind": "mlflow", "tracking_uri": "sqlite:///m.db"}])
    path = tmp_path / "conf" / "config.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(raw))
    tb, local, other = load_config(path).report.trackers
    assert tb.dir == str(tmp_path / "conf" / "tb")
    assert local.tracking_uri == (tmp_path / "conf" / "ml").as_uri()
    assert other.tracking_uri == "sqlite:///m.db"  # a URI is the tracker's to read


def _warnings(caplog) -> list[tuple[str, str]]:
    """(logger, message) of every warning or worse the test captured, from any logger."""
    return [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """One night's cells evaluated, once for the tests that only change the tracker."""
    tmp = tmp_path_factory.mktemp("trackers")
    return _night(tmp, series_config(tmp, SETTINGS), {100: 6.0, 200: 0.5})


def _tracked_by(cfg, uri: str):
    """``cfg`` with one MLflow tracker at ``uri``."""
    import dataclasses

    from jobs.config.report import TrackerConfig

    return dataclasses.replace(cfg, report=dataclasses.replace(cfg.report, trackers=[
        TrackerConfig(kind="mlflow", tracking_uri=uri)]))


def test_a_tracker_that_is_down_costs_seconds_warns_once_and_is_in_the_summary_and_report(evaluated, caplog):
    """An MLflow server that is down (nothing listens on the port): one short connection, one
    warning, no third-party retry noise; the failure kept in report.summary.json and shown
    on the report's first screen."""
    import json
    import time

    from jobs.report.inputs import correlate_and_report

    cfg, outcomes = evaluated
    cfg = _tracked_by(cfg, "http://127.0.0.1:9")  # the discard port: nothing listens there
    with caplog.at_level(logging.DEBUG):  # every logger: urllib3's and MLflow's too
        started = time.perf_counter()
        (entry,) = log_to_trackers(cfg.open_store(), cfg, outcomes)
        took = time.perf_counter() - started
    assert took < 10 and entry["seconds"] < 10, took
    assert entry["logged"] == 0 and "the MLflow server 127.0.0.1:9 does not answer" in entry["error"]
    assert [name for name, _ in _warnings(caplog)] == ["repeval"]  # once, and only ours
    assert "mlflow tracker http://127.0.0.1:9: the new scores were not logged" in _warnings(caplog)[0][1]

    out = correlate_and_report(cfg.open_store(), cfg, [o for o in outcomes if o.get("cell_id")], trackers=[entry])
    written = json.loads(Path(out["summary_path"]).read_text())
    assert written["trackers"] == [json.loads(json.dumps(entry))]
    text = Path(out["report"]).read_text(encoding="utf-8")
    verdict = text[text.index('<div id="verdict">'):text.index("</div>", text.index('<div id="verdict">'))]
    assert "mlflow tracker" in verdict and "127.0.0.1:9" in verdict and "does not answer" in verdict
    assert "Nothing failed" not in verdict


def test_an_mlflow_server_that_errors_is_not_retried(evaluated, caplog):
    """A server that answers every request with 503: MLflow would retry it seven times with
    back-off (minutes); here its one request fails at once, quietly, and MLflow's settings
    are left as they were."""
    import os
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Unavailable(BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _answer

        def log_message(self, *args):  # the server's own access log is not the test's output
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cfg, outcomes = evaluated
        cfg = _tracked_by(cfg, f"http://127.0.0.1:{server.server_address[1]}")
        with caplog.at_level(logging.DEBUG):
            started = time.perf_counter()
            (entry,) = log_to_trackers(cfg.open_store(), cfg, outcomes)
            took = time.perf_counter() - started
    finally:
        server.shutdown()
        server.server_close()
    assert took < 10, took
    assert entry["logged"] == 0 and entry["error"]
    assert [name for name, _ in _warnings(caplog)] == ["repeval"]
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
    assert logging.getLogger("urllib3").level == logging.NOTSET
