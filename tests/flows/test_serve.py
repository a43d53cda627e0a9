"""`repeval serve` as a lab leaves it running: a real local Prefect server (the serve's own)
and the CLI as a subprocess, a folder-only config scanned every few seconds.

One served session, checked step by step: a corrupt checkpoint among good ones (the good
ones evaluated in the same run, the bad one recorded once and not retried while it is
unchanged), the run's summary in Prefect's logs and artifacts, a checkpoint copied in
slowly (evaluated by a later run, never taken half-written), the serve process's memory
over many runs, and a clean stop on SIGTERM after which the run history can be listed
(killed and signalled serves: test_serve_recovery.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from storage_schema import FeatureStore
from storage_schema.ledger import FailureLog, Ledger
from tests.helpers.cli import REPO
from tests.helpers.serving import wait_for
from tests.helpers.configs import tiny_config, write_checkpoint

pytestmark = pytest.mark.slow

INTERVAL = 3  # seconds between scans
RUNS = 4  # scans sampled by the memory test: the last two against the two before them (after the earlier tests' runs)
# a scan due while the last one still runs waits for its concurrency slot 1 s, not Prefect's 30
FAST = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1", "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1",
        "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "1"}


def _wait(what: str, check, served, timeout: float = 300):
    return wait_for(what, check, served, timeout, poll=1)


def _models(store: str) -> set[str]:
    try:
        return {r["model"] for r in Ledger(FeatureStore(store, read_only=True))}
    except Exception:  # noqa: BLE001  no store yet
        return set()


def _checkpoint_failures(store: str) -> dict[str, dict]:
    try:
        return {Path(r["file"]).name: r for r in FailureLog(FeatureStore(store, read_only=True)).records("checkpoint")}
    except Exception:  # noqa: BLE001
        return {}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    ck = tmp / "ck"
    good = [write_checkpoint(ck, f"good{i}", seed=i, score=0.3 + 0.2 * i) for i in (1, 2)]
    bad = ck / "bad.safetensors"
    bad.write_bytes(good[0].read_bytes()[:5000])  # torn: the header promises more than the file holds
    old = time.time() - 60
    for path in [*good, bad]:
        os.utime(path, (old, old))
    raw = tiny_config(tmp)
    del raw["encoders"]  # a folder alone is the nightly config
    raw["checkpoints"] = [{"path": str(ck), "arch": "resnet18", "input_size": 32, "settle_seconds": 2}]
    raw["protocols"] = raw["protocols"][:1]
    raw["reference"] = {"scores": {}}
    raw["correlation"] = {"settings": []}
    raw["dask"] = {"n_workers": 1, "processes": False}
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    home = tmp / "repeval-home"
    env = dict(os.environ, REPEVAL_HOME=str(home), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **FAST)
    for name in ("PREFECT_API_URL", "PREFECT_HOME"):
        env.pop(name, None)  # the serve's own server and its own history
    log_path = tmp / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", str(config), "--interval", str(INTERVAL),
                             "--watch-interval", "3600"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "wb"), start_new_session=True)
    state = {"proc": proc, "store": raw["store"], "ck": ck, "good": good, "bad": bad, "env": env, "home": home,
             "log": lambda: log_path.read_text(errors="replace"), "config": config}
    try:
        banner = _wait("the banner", lambda: re.search(r"run history: (http://127\.0\.0\.1:\d+)", state["log"]()),
                       state, 240)
        state["ui"] = banner.group(1)
        state["api"] = banner.group(1) + "/api"
        yield state
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _client(served):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    class _Ctx:
        def __enter__(self):
            self.settings = temporary_settings(updates={PREFECT_API_URL: served["api"]})
            self.settings.__enter__()
            self.client = get_client(sync_client=True).__enter__()
            return self.client

        def __exit__(self, *exc):
            self.client.__exit__(*exc)
            self.settings.__exit__(*exc)

    return _Ctx()


def _scan_runs(served) -> int:
    """How many scheduled scans have finished."""
    from prefect.client.schemas.filters import (
        FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    final = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
        any_=[StateType.COMPLETED, StateType.FAILED, StateType.CRASHED])))
    with _client(served) as client:
        return client.count_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["repeval-scan-checkpoints"])),
                                      flow_run_filter=final)


def test_banner_links_a_served_ui(served):
    assert "no web UI" not in served["log"]() and "/deployments/" not in served["log"]()
    page = httpx.get(served["ui"], timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_good_checkpoints_are_evaluated_and_the_bad_one_recorded_once(served):
    _wait("the good checkpoints' records", lambda: _models(served["store"]) >= {"good1", "good2"}, served)
    failures = _checkpoint_failures(served["store"])
    assert set(failures) == {"bad.safetensors"} and failures["bad.safetensors"]["attempts"] == 1
    assert "is truncated" in failures["bad.safetensors"]["reason"]
    done = _scan_runs(served)
    _wait("two more scans", lambda: _scan_runs(served) >= done + 2, served)
    assert _checkpoint_failures(served["store"])["bad.safetensors"]["attempts"] == 1  # unchanged: not retried
    assert "[scan] no new checkpoints and no protocol change" in served["log"]()


def test_the_run_summary_is_in_prefect_logs_and_artifacts(served):
    from prefect.client.schemas.filters import (
        ArtifactFilter, ArtifactFilterKey, FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId, LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    _wait("the first run", lambda: _models(served["store"]) >= {"good1", "good2"}, served)
    with _client(served) as client:
        # the serve's first benchmark run (this module's server holds only the serve's runs)
        def ended() -> list:  # the records are written before the flow run reaches its final state
            runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["repeval-benchmark"])),
                                         sort=FlowRunSort.START_TIME_ASC)
            return [r for r in runs if r.state and r.state.is_final()]

        first = _wait("the first run's final state", ended, served, timeout=60)[0]
        assert first.state.is_failed() and "checkpoint" in first.state.message  # the bad file, named

        def run_log() -> str:
            return "\n".join(log.message for log in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[first.id]))))

        # the serve process ships its log lines to the server in batches, after the run's end
        text = _wait("the first run's summary in Prefect's log", lambda: "report:" in run_log() and run_log(),
                     served, timeout=60)
        assert "scan: new checkpoints: extracted" in text and "new encoders: good1, good2" in text
        assert "bad.safetensors" in text and "report:" in text
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["repeval-run-summary"])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[first.id])))
        assert [a.type for a in artifacts] == ["table"]
        rows = json.loads(artifacts[0].data) if isinstance(artifacts[0].data, str) else artifacts[0].data
        assert {"item": "why it ran", "value": "scan: new checkpoints"} in rows
    # the terminal got the same summary, timestamped and tagged with why the run started
    assert re.search(r"\d\d:\d\d:\d\d \[scan: new checkpoints\] new encoders: good1, good2", served["log"]())


def test_a_checkpoint_copied_in_slowly_is_evaluated_by_a_later_run(served):
    target = served["ck"] / "good3.safetensors"
    write_checkpoint(served["ck"].parent / "src", "good3", seed=3)
    src = (served["ck"].parent / "src" / "good3.safetensors").read_bytes()
    pieces = 8
    with open(target, "wb") as f:  # about 2 scan intervals, never pausing as long as settle_seconds
        for i in range(pieces):
            f.write(src[i * len(src) // pieces:(i + 1) * len(src) // pieces])
            f.flush()
            time.sleep(0.75)
    _wait("good3's records", lambda: "good3" in _models(served["store"]), served)
    files = _wait("the run that took good3 to end", lambda: _state(served).get("files", {}).get("good3"), served)
    assert files[0] == len(src)  # recorded as done only complete, with its final size
    assert "good3.safetensors" not in _checkpoint_failures(served["store"])


def _state(served) -> dict:
    states = list((Path(served["store"]) / "_repeval" / "watch").glob("*.json"))
    return json.loads(states[0].read_text()) if states else {}


def test_serve_memory_stays_flat_over_many_runs(served):
    proc = psutil.Process(served["proc"].pid)
    runs = _scan_runs(served)
    samples = []
    for _ in range(RUNS):  # more scheduled runs, each a process of its own (most of this file's time)
        _wait("the next scan", lambda: _scan_runs(served) > runs, served, timeout=120)
        runs = _scan_runs(served)
        samples.append(proc.memory_info().rss / 2**20)
    print(f"serve process RSS over {RUNS} runs (MiB): {[round(s) for s in samples]}")
    assert not any("libtorch" in m.path for m in proc.memory_maps())  # torch lives in the runs' processes
    # flat: the later runs do not hold more than the first ones (a few MiB of allocator noise);
    # the earlier tests' runs came first, so the serve process is past its first-run growth
    half = RUNS // 2
    assert max(samples[half:]) - max(samples[:half]) < 40, samples


def test_sigterm_stops_cleanly_and_the_history_can_be_listed(served):
    proc = served["proc"]
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM  # as a process ended by SIGTERM
    log = served["log"]()
    assert log.count("repeval serve: stopped by SIGTERM; the store and Prefect's run history are kept") == 1
    assert "Traceback" not in log
    time.sleep(2)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    env = {k: v for k, v in served["env"].items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(served["home"] / "prefect")  # as the stop message says
    out = subprocess.run([str(Path(sys.executable).parent / "prefect"), "flow-run", "ls", "--limit", "50"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "locked" not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert "repeval-scan-checkpoints" in out.stdout or "scan" in out.stdout
