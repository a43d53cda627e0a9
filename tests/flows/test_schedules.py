"""Checkpoint scans and change detection: files still being written, bad files, what a run
records as done, folder-only configs, one scheduled evaluation at a time per store.
(`repeval serve` itself: test_serve.py.)"""

from __future__ import annotations

import copy
import json
import os
import time

import pytest

from jobs.config.checkpoint_folders import scan_checkpoints, scan_folder, with_scanned_checkpoints
from jobs.config import CheckpointScan, load_config
from jobs.run.plan import make_plan
from jobs.run.changes import detect_changes, load_state, save_state, watch_key
from jobs.run.plan import list_work
from pipeline.errors import ConfigError
from storage_schema import FeatureStore
from storage_schema.ledger import FailureLog
from tests.helpers.configs import tiny_config, write_checkpoint


def _age(path, seconds: float) -> None:
    """Make a file look written ``seconds`` ago."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_scan_turns_checkpoints_into_encoders_with_sidecar_scores(tmp_path):
    write_checkpoint(tmp_path / "ck", "night 1", seed=3, score=0.42)
    write_checkpoint(tmp_path / "ck", "night2", seed=4)
    found = scan_folder(CheckpointScan(path=str(tmp_path / "ck"), arch="resnet18", name_prefix="r18-"))
    assert [(e.name, s) for e, s in found] == [("r18-night_1", 0.42), ("r18-night2", None)]
    assert scan_folder(CheckpointScan(path=str(tmp_path / "missing"), arch="resnet18")) == []


def test_a_file_is_taken_once_it_has_settled_or_is_marked_done(tmp_path):
    path = write_checkpoint(tmp_path / "ck", "ep1", seed=1)
    raw = tiny_config(tmp_path)
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": "resnet18", "settle_seconds": 30}]
    scan = scan_checkpoints(load_config(raw))
    assert scan.taken == [] and scan.waiting == [str(path)]  # just written: maybe still being written
    _age(path, 31)
    assert [f.encoder.name for f in scan_checkpoints(load_config(raw)).taken] == ["ep1"]

    raw["checkpoints"][0]["done_suffix"] = ".done"  # the training script's marker decides
    assert scan_checkpoints(load_config(raw)).waiting == [str(path)]
    (tmp_path / "ck" / "ep1.safetensors.done").touch()
    assert [f.encoder.name for f in scan_checkpoints(load_config(raw)).taken] == ["ep1"]


def test_a_bad_scanned_checkpoint_is_refused_alone_and_not_retried_while_unchanged(tmp_path):
    good = write_checkpoint(tmp_path / "ck", "good", seed=1)
    bad = tmp_path / "ck" / "bad.safetensors"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # a torn copy
    other = write_checkpoint(tmp_path / "other", "r50", seed=0, arch="resnet50")
    os.replace(other, tmp_path / "ck" / "r50.safetensors")  # another architecture
    raw = tiny_config(tmp_path)
    raw["encoders"] = []  # a folder alone is the nightly config
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": "resnet18", "input_size": 32, "settle_seconds": 0}]
    cfg = load_config(raw)
    plan = make_plan(cfg)
    assert [e.name for e in plan.config.encoders] == ["good"]
    assert {u.encoder.name for u in plan.units} == {"good"} and {c.model for c in plan.cells} == {"good"}
    refused = {r["encoder"]: r for r in plan.checkpoint_failures}
    assert "bad.safetensors" in refused["bad"]["reason"] and "does not fit resnet18" in refused["r50"]["reason"]
    records = {r["encoder"]: r for r in FailureLog(FeatureStore(cfg.store)).records("checkpoint")}
    assert records["bad"]["size"] == bad.stat().st_size and records["bad"]["attempts"] == 1

    again = make_plan(cfg)  # unchanged: skipped, not checked and not counted again
    assert [e.name for e in again.config.encoders] == ["good"] and not again.checkpoint_failures
    assert {r["encoder"] for r in again.scan.skipped} == {"bad", "r50"}
    assert FailureLog(FeatureStore(cfg.store)).get("checkpoint", records["bad"]["id"])["attempts"] == 1
    assert {e.name for e in make_plan(cfg, retry_failed=True).config.encoders} == {"good"}  # retried, refused
    failed = {r["file"]: r for r in FailureLog(FeatureStore(cfg.store)).records("checkpoint")}
    fixed = copy.deepcopy(raw)
    fixed["checkpoints"][0]["arch"] = "resnet50"  # the config's arch corrected: its files are read again
    assert "r50" in [f.encoder.name for f in scan_checkpoints(load_config(fixed), failed).taken]
    bad.write_bytes(good.read_bytes())  # the file was finished: taken again
    assert {e.name for e in make_plan(cfg).config.encoders} == {"good", "bad"}


def test_state_records_only_what_the_run_planned_and_completed(tmp_path):
    raw = tiny_config(tmp_path)
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": "resnet18", "input_size": 32, "settle_seconds": 0}]
    write_checkpoint(tmp_path / "ck", "ep1", seed=1, score=0.5)
    write_checkpoint(tmp_path / "ck", "ep2", seed=2)
    cfg = load_config(raw)
    store = FeatureStore(cfg.store)
    key = watch_key(str(tmp_path / "config.yaml"))
    first = detect_changes(store, list_work(cfg, store=store), key)
    assert first.protocols_changed and first.new_encoders == ["r18a", "r18b", "mnv3", "ep1", "ep2"]
    plan = list_work(cfg)
    write_checkpoint(tmp_path / "ck", "ep3", seed=3)  # arrives while the run works
    save_state(store, plan.config, key, completed=[e.name for e in plan.config.encoders if e.name != "ep2"],
               files=plan.scan.signatures())
    assert load_state(store, key).encoders == ["r18a", "r18b", "mnv3", "ep1"]
    changes = detect_changes(store, list_work(cfg, store=store), key)
    assert changes.new_encoders == ["ep2", "ep3"] and not changes.protocols_changed  # neither marked done early
    assert with_scanned_checkpoints(cfg).reference.scores["ep1"] == 0.5

    write_checkpoint(tmp_path / "ck", "ep1", seed=11)  # rewritten in place: new weights, same name
    assert "ep1" in detect_changes(store, list_work(cfg, store=store), key).new_encoders
    edited = copy.deepcopy(raw)
    edited["protocols"][1]["settings"] = {"alphas": [0.1, 1.0]}
    assert detect_changes(store, list_work(load_config(edited), store=store), key).protocols_changed
    renamed = copy.deepcopy(raw)
    renamed["report"]["path"] = str(tmp_path / "elsewhere.html")  # not a protocol change
    assert not detect_changes(store, list_work(load_config(renamed), store=store), key).protocols_changed


def test_a_folder_only_config_is_accepted(tmp_path):
    raw = tiny_config(tmp_path)
    del raw["encoders"]
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": "resnet18", "input_size": 32,
                           "layers": ["pre_logits", "block3"], "settle_seconds": 0}]
    raw["protocols"][0]["layers"] = ["block3"]  # a layer only the scanned checkpoints give
    plan = make_plan(load_config(raw))  # an empty folder: nothing to do yet, not an error
    assert plan.units == [] and plan.cells == []
    write_checkpoint(tmp_path / "ck", "ep1", seed=1)
    plan = make_plan(load_config(raw))
    assert {(c.model, c.layer, c.setting) for c in plan.cells if c.setting == "knn20"} == {("ep1", "block3", "knn20")}
    with pytest.raises(ConfigError, match="config.encoders: no encoders and no checkpoints folder"):
        load_config({k: v for k, v in raw.items() if k != "checkpoints"})


@pytest.mark.slow  # five flow runs on the session's Prefect API
def test_the_watcher_runs_only_on_edited_settings_and_never_beside_a_scan(tmp_path, prefect_harness):
    import threading

    import yaml

    from flows.schedules import schedule_lease, scan_checkpoints_flow, watch_protocols_flow

    raw = tiny_config(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = str(path)
    # serve's first cycle: nothing recorded yet, so the scan evaluates; the watcher does not too
    assert watch_protocols_flow(config) == {"ran": False, "reason": "no run recorded yet (the scan evaluates first)"}

    def record_a_run() -> None:
        cfg = load_config(config)
        save_state(cfg.open_store(), list_work(cfg).config, watch_key(config))

    record_a_run()
    assert watch_protocols_flow(config) == {"ran": False, "reason": "unchanged"}
    raw["protocols"][0]["settings"] = {"n_neighbors": 7}  # edited while a scan runs
    path.write_text(yaml.safe_dump(raw))
    with schedule_lease(config):  # the scan in progress holds the store
        assert watch_protocols_flow(config) == {"ran": False, "reason": "busy"}  # left to it: no second run

    record_a_run()  # the scan ran the edited settings: nothing left to do
    held = schedule_lease(config)
    held.acquire()  # now a watcher's run in progress: the next scan waits for it
    results = []
    scan = threading.Thread(target=lambda: results.append(scan_checkpoints_flow(config)))
    scan.start()
    scan.join(timeout=1)
    assert scan.is_alive() and not results  # waiting on the store, not evaluating beside the watcher
    held.release()
    scan.join(timeout=120)
    assert results == [{"ran": False, "new_encoders": []}]  # it looked again once the store was free


def _imported(tmp_path, models, configured) -> dict:
    """A config of imported features (no extraction: quick): ``models`` in its store, ``configured`` in it."""
    import numpy as np

    from flows.cli.main import main

    rng = np.random.default_rng(0)
    y = {"train": np.arange(40) % 2, "test": np.arange(20) % 2}
    for i, model in enumerate(models):
        feats = {f"{s}_features": (rng.normal(size=(len(y[s]), 4)) + (1 + i) * y[s][:, None]).astype(np.float32)
                 for s in y}
        np.savez(tmp_path / f"{model}.npz", **{f"{s}_labels": y[s] for s in y}, **feats)
        assert main(["import-features", "--store", str(tmp_path / "store"), "--model", model, "--path",
                     str(tmp_path / f"{model}.npz"), "--dataset-name", "blobs"]) == 0
    return {"store": str(tmp_path / "store"), "dask": {"n_workers": 1, "processes": False},
            "encoders": [{"name": m, "source": "store"} for m in configured],
            "datasets": [{"name": "blobs", "adapter": "features", "params": {"path": str(tmp_path / "a.npz")}}],
            "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 3}},
                          {"name": "ridge", "protocol": "ridge"}],
            "reference": {"scores": {}}, "correlation": {"settings": []},
            "report": {"path": str(tmp_path / "report.html")}}


@pytest.mark.slow  # a run and a scan on the session's Prefect API
def test_the_first_scan_after_a_run_knows_what_the_ledger_holds(tmp_path, prefect_harness, capsys):
    import yaml

    from flows.cli.main import main
    from flows.schedules import scan_checkpoints_flow

    raw = _imported(tmp_path, ["a", "b", "c"], ["a", "b"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = str(path)
    assert main(["run", config]) == 0  # everything evaluated, before serve ever ran
    cfg = load_config(config)
    changes = detect_changes(cfg.open_store(), list_work(cfg, store=cfg.open_store()), watch_key(config))
    assert not changes.recorded and changes.new_encoders == []  # not "new encoders: a, b"
    capsys.readouterr()
    assert scan_checkpoints_flow(config) == {"ran": False, "new_encoders": []}
    assert "[scan] no new checkpoints: all 4 cells are in the ledger" in capsys.readouterr().err
    assert load_state(cfg.open_store(), watch_key(config)).encoders == ["a", "b"]  # recorded for the next scans

    other = tmp_path / "other.yaml"  # the same store, a config with one encoder no run evaluated
    raw["encoders"].append({"name": "c", "source": "store"})
    other.write_text(yaml.safe_dump(raw))
    cfg = load_config(str(other))
    changes = detect_changes(cfg.open_store(), list_work(cfg, store=cfg.open_store()), watch_key(str(other)))
    assert not changes.recorded and changes.new_encoders == ["c"]


def test_a_scheduled_run_is_judged_dead_only_when_its_process_is_known_gone(tmp_path):
    import subprocess
    import sys

    from prefect.client.schemas.objects import FlowRun
    from prefect.states import Running

    from flows.reclaim import RELEASED_GRACE, START_GRACE, judge, run_lease_key
    from storage_schema.leases import LeaseInfo

    store = FeatureStore(str(tmp_path / "store"))
    run = FlowRun(flow_id="00000000-0000-0000-0000-000000000001", state=Running())
    started = run.state.timestamp.timestamp()
    assert judge(run, None, now=started + 5) is None  # its process is still starting
    assert "no process ran it for 181 s" in judge(run, None, now=started + START_GRACE + 1)

    live = store.lease(run_lease_key("live"))
    live.acquire()
    try:
        assert judge(run, live.current()) is None  # this process: alive
    finally:
        live.release()
    released = store.lease(run_lease_key("live")).current()
    assert judge(run, released, now=released.heartbeat + 1) is None  # its final state is on its way
    assert "without a final state" in judge(run, released, now=released.heartbeat + RELEASED_GRACE + 1)

    # a holder that died holding it (kill -9): known dead at once, on this machine
    code = ("import os, sys; from storage_schema import FeatureStore; from flows.reclaim import run_lease_key; "
            "FeatureStore(sys.argv[1]).lease(run_lease_key('dead')).acquire(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], check=True, timeout=120)
    dead = store.lease(run_lease_key("dead")).current()
    assert not dead.released and f"process {dead.process['pid']} is gone" == judge(run, dead)
    # a holder on another machine: alive while it beats, dead after its ttl without one
    remote = LeaseInfo(0, "gpu3:1:x", dead.heartbeat, 60.0, False, {**dead.process, "host": "gpu3"})
    assert judge(run, remote, now=remote.heartbeat + 30) is None
    assert "no heartbeat for 61 s" in judge(run, remote, now=remote.heartbeat + 61)


@pytest.mark.slow  # a reclaim on the session's Prefect API
def test_reclaim_leaves_live_and_other_configs_runs_and_forgets_old_leases(tmp_path, prefect_harness):
    import time as clock

    import yaml

    from flows import reclaim as rc
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    raw = tiny_config(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    store = FeatureStore(raw["store"])

    @flow(name="repeval-scan-checkpoints")
    def scan(config_path: str) -> None:  # a scan's name and parameters, never run
        pass

    with get_client(sync_client=True) as client:
        mine = client.create_flow_run(scan, parameters={"config_path": str(path)}, state=Running())
        other = client.create_flow_run(scan, parameters={"config_path": str(tmp_path / "other.yaml")},
                                       state=Running())
        held = store.lease(rc.run_lease_key(str(mine.id)))
        held.acquire()  # its process (this one) lives
        try:
            assert rc.reclaim(str(path), say=lambda line: None) == []
        finally:
            held.release()
        lines = []
        old = clock.time() - rc.RELEASED_GRACE - 1  # its code ended long ago, no final state came
        record = json.loads(store.backend.read(f"_repeval/leases/{rc.run_lease_key(str(mine.id))}/0.json"))
        store.backend.write_atomic(f"_repeval/leases/{rc.run_lease_key(str(mine.id))}/0.json",
                                   json.dumps({**record, "heartbeat": old}).encode())
        found = rc.reclaim(str(path), say=lines.append)
        assert [r.id for r in found] == [str(mine.id)] and len(lines) == 1
        assert lines[0].startswith(f"reclaimed flow run {mine.name} ({mine.id}) of a dead serve (its flow ended")
        assert client.read_flow_run(mine.id).state.is_crashed()
        assert client.read_flow_run(other.id).state.is_running()  # another config's: never touched

    done = store.lease(rc.run_lease_key("finished"))
    done.acquire()
    done.release()
    key = f"_repeval/leases/{rc.run_lease_key('finished')}/0.json"
    store.backend.write_atomic(key, json.dumps({**json.loads(store.backend.read(key)),
                                                "heartbeat": clock.time() - 7200}).encode())
    rc.reclaim(str(path), say=lambda line: None)
    assert store.backend.read(key) is None  # a released lease of two hours ago: removed
