"""Schedules: checkpoint-scan and protocol-change detection, and one served run end to end."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import save_file

from jobs.checkpoint_scan import scan_folder, with_scanned_checkpoints
from jobs.config import CheckpointScan, load_config
from jobs.watch import detect_changes, save_state, watch_key
from pipeline.encoders import EncoderSpec, load_encoder
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.configs import tiny_config

REPO = Path(__file__).resolve().parents[2]


def _checkpoint(folder: Path, name: str, seed: int, score: float | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model = load_encoder(EncoderSpec(name="tmp", arch="resnet18", seed=seed, input_size=32)).model
    path = folder / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    if score is not None:
        path.with_suffix(".json").write_text(json.dumps({"reference_score": score}))
    return path


def test_scan_turns_checkpoints_into_encoders_with_sidecar_scores(tmp_path):
    _checkpoint(tmp_path / "ck", "night 1", seed=3, score=0.42)
    _checkpoint(tmp_path / "ck", "night2", seed=4)
    found = scan_folder(CheckpointScan(path=str(tmp_path / "ck"), arch="resnet18", name_prefix="r18-"))
    assert [(e.name, s) for e, s in found] == [("r18-night_1", 0.42), ("r18-night2", None)]
    assert scan_folder(CheckpointScan(path=str(tmp_path / "missing"), arch="resnet18")) == []


def test_change_detection(tmp_path):
    raw = tiny_config(tmp_path)
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": "resnet18", "input_size": 32}]
    cfg = load_config(raw)
    store = FeatureStore(cfg.store)
    key = watch_key(str(tmp_path / "config.yaml"))
    first = detect_changes(store, cfg, key)
    assert first.protocols_changed and first.new_encoders == ["r18a", "r18b", "mnv3"]
    save_state(store, cfg, key)
    assert not detect_changes(store, cfg, key).any
    _checkpoint(tmp_path / "ck", "epoch5", seed=5, score=0.5)
    changes = detect_changes(store, cfg, key)
    assert changes.new_encoders == ["epoch5"] and not changes.protocols_changed
    assert with_scanned_checkpoints(cfg).reference.scores["epoch5"] == 0.5
    save_state(store, cfg, key)
    edited = copy.deepcopy(raw)
    edited["protocols"][1]["settings"] = {"alphas": [0.1, 1.0]}
    changes = detect_changes(store, load_config(edited), key)
    assert changes.protocols_changed and changes.new_encoders == []
    renamed = copy.deepcopy(raw)
    renamed["report"]["path"] = str(tmp_path / "elsewhere.html")  # not a protocol change
    assert not detect_changes(store, load_config(renamed), key).protocols_changed


@pytest.mark.slow
def test_served_schedule_runs_the_benchmark_on_a_local_prefect_api(tmp_path):
    raw = tiny_config(tmp_path)
    raw["encoders"] = raw["encoders"][:1]
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": "resnet18", "input_size": 32}]
    raw["protocols"] = raw["protocols"][:1]
    raw["dask"] = {"n_workers": 1, "processes": False}
    _checkpoint(tmp_path / "ck", "nightly", seed=7, score=0.6)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(REPO),
               # the server's scheduler and the runner poll every 60 s / 10 s by default
               PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2", PREFECT_RUNNER_POLL_FREQUENCY="2")
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", str(path), "--interval", "2",
                             "--watch-interval", "3600"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    key = watch_key(str(path))
    try:
        deadline = time.monotonic() + 240
        state = None
        while time.monotonic() < deadline and proc.poll() is None:
            store_path = Path(raw["store"])
            if (store_path / key).exists():
                state = json.loads((store_path / key).read_text())
                break
            time.sleep(1)
        assert state is not None, f"no scheduled run completed; serve exited {proc.poll()}"
        assert sorted(state["encoders"]) == ["nightly", "r18a"]
        ledger = Ledger(FeatureStore(raw["store"], read_only=True))
        assert {r["model"] for r in ledger} == {"nightly", "r18a"}  # the new checkpoint was evaluated
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
