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
from jobs.trackers import _WRITERS, log_to_trackers
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
    from jobs.plan import make_plan

    folder = tmp / "run7"
    folder.mkdir(parents=True, exist_ok=True)
    for step in noise:
        save_file({"w": np.full(2, step, np.float32)}, str(folder / f"ck-step{step}.safetensors"))
    cfg = load_config(raw)
    store = noisy_encoders(tmp, {f"ck-step{s}": v for s, v in noise.items()}, store=cfg.open_store())
    plan = make_plan(cfg, check=False, ready_only=False)
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
