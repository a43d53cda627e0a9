"""The benchmark on a real Prefect server: `repeval deploy` to a process work pool, a cron
schedule the server's scheduler expands into runs, a run executed by a `prefect worker`,
and a rerun triggered by the protocols-changed event that computes only what changed.

Everything is a real process on 127.0.0.1: `prefect server start` (SQLite, its services
on), `prefect worker start` (which starts one process per flow run), and the CLIs users
type. Teardown kills each started process tree, also when a step fails.
"""

from __future__ import annotations

import copy
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from pipeline.errors import ConfigError, RepevalError
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.configs import tiny_config
from tests.helpers.cli import REPO, cli_env

pytestmark = pytest.mark.slow  # every test here starts servers or runs several flows

POOL = "repeval-local"
EVENT = "repeval.config.protocols-changed"
# Server and worker poll every 60 s / 10 s by default; 1 s keeps the test short.
FAST = {
    "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
    "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1",
    "PREFECT_WORKER_QUERY_SECONDS": "1",
    "PREFECT_WORKER_HEARTBEAT_SECONDS": "5",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group and every descendant (flow runs may sit in sessions of their own)."""
    if proc.poll() is not None:
        return
    try:
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = [proc.pid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with_pids = [p for p in family if psutil.pid_exists(p)]
        if not with_pids:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in with_pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        _, alive = psutil.wait_procs([psutil.Process(p) for p in with_pids if psutil.pid_exists(p)], timeout=15)
        family = [p.pid for p in alive]
    proc.wait(timeout=5)


class Stack:
    """A Prefect server, a process work pool and one worker, with the env that reaches them."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        home = root / "prefect-home"
        home.mkdir()
        env = cli_env()
        env.pop("PREFECT_API_URL", None)
        env.update(FAST, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", HF_HUB_OFFLINE="1")
        self.env = env

    def start(self, name: str, *args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=cwd, env=env or self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=self.env, capture_output=True,
                             text=True, timeout=timeout)
        assert out.returncode == 0, f"{' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
        return out

    def up(self) -> None:
        server = self.start("server", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                            str(self.port), "--no-ui", "--analytics-off")
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"prefect server exited {server.returncode}:\n{self.log('server')}"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"prefect server not up in 120 s:\n{self.log('server')}"
            time.sleep(0.5)
        self.env["PREFECT_API_URL"] = self.url
        self.run("prefect", "work-pool", "create", POOL, "--type", "process")
        # INFO: the flow runs (children of the worker) send their run logs to the server.
        # Outside the repo: the deployment names an importable module, not a checkout.
        self.start("worker", "prefect", "worker", "start", "--pool", POOL,
                   env={**self.env, "PREFECT_LOGGING_LEVEL": "INFO"}, cwd=self.root)

    def down(self) -> None:
        for proc in reversed(self.procs):  # worker (and its flow runs) before the server
            _stop(proc)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("prefect-server"))
    try:
        s.up()
        yield s
    finally:
        s.down()


@pytest.fixture
def client(stack):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: stack.url}), get_client(sync_client=True) as c:
        yield c


def _config(tmp: Path) -> dict:
    raw = tiny_config(tmp)
    raw["encoders"] = raw["encoders"][:2]
    raw["protocols"] = raw["protocols"][:2]  # knn20, ridge
    raw["dask"] = {"n_workers": 1, "processes": False}
    return raw


def _runs(client, deployment_id):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def _wait_completed(client, stack: Stack, deployment_id, pick, what: str, timeout: float = 240):
    """Wait until the run ``pick`` chooses is COMPLETED; fail at once if it failed or crashed."""
    deadline = time.monotonic() + timeout
    run = None
    while time.monotonic() < deadline:
        run = pick(_runs(client, deployment_id))
        if run is not None and run.state.is_final():
            break
        time.sleep(1)
    state = run.state.type.value if run is not None else "no run"
    if run is None or not run.state.is_completed():
        logs = _run_logs(client, run)[-4000:] if run is not None else ""
        pytest.fail(f"{what}: {state} after {timeout} s\nrun logs:\n{logs}\nworker log:\n{stack.log('worker')}")
    return run


def _by_automation(run) -> bool:
    return run.created_by is not None and run.created_by.type == "AUTOMATION"


def _run_logs(client, run) -> str:
    """The log lines of ``run`` (its own, never the server's latest)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    return "\n".join(r.message for r in client.read_logs(
        log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id]))))


def _wait_for_log(client, run, text: str, timeout: float = 30) -> str:
    """The run's logs once they hold ``text`` (they reach the server in batches, after the state)."""
    deadline = time.monotonic() + timeout
    while True:
        logs = _run_logs(client, run)
        if text in logs or time.monotonic() > deadline:
            return logs
        time.sleep(1)


@pytest.mark.timeout(600)
def test_deployed_benchmark_runs_on_the_worker_and_reruns_on_protocol_change(stack, client, tmp_path):
    t0 = time.monotonic()
    raw = _config(tmp_path)
    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump(raw))
    hour = (datetime.now(timezone.utc).hour + 12) % 24  # a nightly time far from now: no cron run mid-test
    cron = f"0 {hour} * * *"

    out = stack.run("flows.cli", "deploy", str(path), "--pool", POOL, "--cron", cron)
    lines = out.stdout.strip().splitlines()
    print(out.stdout)
    t_deploy = time.monotonic()
    deployment = client.read_deployment_by_name("repeval-config-benchmark/nightly")
    assert deployment.work_pool_name == POOL and deployment.parameters == {"config_path": str(path)}
    assert deployment.entrypoint == "flows.deploy.config_benchmark_flow"
    [schedule] = client.read_deployment_schedules(deployment.id)
    assert schedule.schedule.cron == cron and schedule.active
    [automation] = client.read_resource_related_automations(f"prefect.deployment.{deployment.id}")
    assert automation.trigger.expect == {EVENT}

    # The server's scheduler turns the cron into future runs on its own.
    deadline = time.monotonic() + 60
    while not (scheduled := [r for r in _runs(client, deployment.id) if r.state.is_scheduled()]):
        assert time.monotonic() < deadline, "the scheduler created no runs for the cron schedule"
        time.sleep(1)
    assert len(scheduled) >= 3  # PREFECT_SERVER_SERVICES_SCHEDULER_MIN_RUNS
    assert all(r.expected_start_time.hour == hour and r.expected_start_time.minute == 0
               and r.expected_start_time > datetime.now(timezone.utc) for r in scheduled)
    print(f"scheduler created {len(scheduled)} runs for {cron!r}, first at {min(r.expected_start_time for r in scheduled)}")

    # Run it now, as the deploy output says, and let the worker pick it up.
    [run_now] = [line.split("run now: ", 1)[1] for line in lines if line.startswith("run now: ")]
    stack.run(*shlex.split(run_now))
    first = _wait_completed(client, stack, deployment.id,
                            lambda runs: next((r for r in runs if not r.auto_scheduled and not _by_automation(r)),
                                              None), "the manual run")
    t_first = time.monotonic()
    assert first.work_pool_name == POOL
    ledger = Ledger(FeatureStore(raw["store"], read_only=True))
    before = {r["cell_id"]: r for r in ledger}
    assert {(r["model"], r["setting"]) for r in before.values()} == {
        (m, s) for m in ("r18a", "r18b") for s in ("knn20", "ridge")}
    assert "deployment run: computed 4 cells, 0 from the ledger" in _wait_for_log(client, first, "deployment run: computed 4 cells, 0 from the ledger")

    # Users edit the protocol settings, then emit the event (the command deploy printed).
    changed = copy.deepcopy(raw)
    changed["protocols"][0]["settings"] = {"n_neighbors": 7}
    path.write_text(yaml.safe_dump(changed))
    [emit] = [line.split(": ", 1)[1] for line in lines if line.startswith("after editing protocol settings: ")]
    assert emit.startswith(f"prefect event emit {EVENT} ")
    stack.run(*shlex.split(emit))
    rerun = _wait_completed(client, stack, deployment.id,
                            lambda runs: next((r for r in runs if _by_automation(r)), None),
                            "the event-triggered run")
    t_rerun = time.monotonic()
    after = {r["cell_id"]: r for r in Ledger(FeatureStore(raw["store"], read_only=True))}
    new = [after[c] for c in after.keys() - before.keys()]
    assert before.keys() <= after.keys()  # nothing recomputed in place, nothing lost
    assert sorted((r["model"], r["setting"]) for r in new) == [("r18a", "knn20"), ("r18b", "knn20")]
    assert "deployment run: computed 2 cells, 2 from the ledger" in _wait_for_log(client, rerun, "deployment run: computed 2 cells, 2 from the ledger")
    print(f"deploy CLI {t_deploy - t0:.1f} s, manual run done after {t_first - t_deploy:.1f} s, "
          f"event-triggered rerun done after {t_rerun - t_first:.1f} s ({len(new)} of {len(after)} cells new)")


def test_deploy_refuses_bad_input_before_creating_anything(stack, client, tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deploy import deploy_config

    raw = _config(tmp_path)
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(raw))
    count = len(client.read_deployments())
    with pytest.raises(RepevalError, match=r"work pool 'nope' does not exist .* pools there: .*repeval-local"):
        deploy_config(str(path), "nope")
    with pytest.raises(RepevalError, match=r"--cron '0 2 \* \*'.*Invalid cron string"):
        deploy_config(str(path), POOL, cron="0 2 * *")
    with pytest.raises(RepevalError, match=r"--timezone 'Mars/Base'.*Invalid timezone"):
        deploy_config(str(path), POOL, timezone="Mars/Base")
    with pytest.raises(RepevalError, match=r"deployment name 'a/b' .* contains '/'"):
        deploy_config(str(path), POOL, name="a/b")
    with pytest.raises(ConfigError, match=r"does not exist"):
        deploy_config(str(tmp_path / "missing.yaml"), POOL)
    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{_free_port()}/api"}):
        with pytest.raises(RepevalError, match="cannot reach the Prefect server"):
            deploy_config(str(path), POOL)
    with temporary_settings(updates={PREFECT_API_URL: ""}):
        with pytest.raises(RepevalError, match="needs a Prefect server: set PREFECT_API_URL"):
            deploy_config(str(path), POOL)
    assert len(client.read_deployments()) == count

    # A name already deployed for another config file is refused, not silently repointed.
    taken = deploy_config(str(path), POOL, name="shared")
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(raw))
    with pytest.raises(RepevalError, match=r"'repeval-config-benchmark/shared' already runs .*other.yaml"):
        deploy_config(str(second), POOL, name="shared")
    assert client.read_deployment(taken.id).parameters == {"config_path": str(path)}
    assert len(client.read_deployments()) == count + 1
