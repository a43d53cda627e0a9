"""`repeval deploy`: one config file's benchmark as a deployment on a Prefect server."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a worker imports this before timm, as the CLI does

from prefect import flow  # noqa: E402

from flows.schedules import CHANGED_EVENT, DEFAULT_CRON, config_resource_id, run_or_fail  # noqa: E402
from jobs.config import load_config  # noqa: E402
from jobs.run.plan import check_plan  # noqa: E402
from pipeline.errors import RepevalError  # noqa: E402

FLOW_NAME = "repeval-config-benchmark"
_BANNED_IN_NAMES = "/%&><"  # Prefect refuses these in deployment names


@flow(name=FLOW_NAME)
def config_benchmark_flow(config_path: str):
    """What the deployment runs: the benchmark of the config file as it reads now (its
    summary; a Failed state naming what failed, when something did)."""
    return run_or_fail(config_path, "deployment run")


@dataclass(frozen=True)
class Deployed:
    """A deployment made by ``deploy_config``: its id and name, the server, the config, the event that reruns it."""

    id: str
    name: str  # "<flow>/<deployment>", as `prefect deployment run` takes it
    api_url: str
    config_path: str
    resource_id: str  # the event resource the trigger matches

    def emit_command(self) -> str:
        """The command that emits the protocol-change event (after editing the settings)."""
        return f"prefect event emit {CHANGED_EVENT} --resource-id '{self.resource_id}'"


def deploy_config(config: str, pool: str, name: str | None = None, cron: str = DEFAULT_CRON,
                  timezone: str | None = None) -> Deployed:
    """Create or update the deployment of ``config`` on the Prefect server of PREFECT_API_URL."""
    # Everything that can be wrong (config, cron, name, server, pool, a name taken by another
    # config) is refused before anything is created on the server.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.deployments.runner import EntrypointType
    from prefect.events import DeploymentEventTrigger
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL
    from pydantic import ValidationError

    path = os.path.abspath(config)  # the same key `repeval serve` uses for this file
    check_plan(load_config(path))
    name = name or Path(path).stem
    bad = [c for c in _BANNED_IN_NAMES if c in name]
    if not name.strip() or bad:
        raise RepevalError(f"deployment name {name!r} is empty or contains {bad[0] if bad else 'only spaces'!r}; "
                           f"use letters, digits, '-', '_', '.' (not any of {' '.join(_BANNED_IN_NAMES)})")
    try:
        CronSchedule(cron=cron, timezone=timezone)  # validates both
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"]
        raise RepevalError(f"--cron {cron!r} / --timezone {timezone!r} rejected: {problem}; "
                           "expected five cron fields like '0 2 * * *' and an IANA zone like 'Europe/Paris'") from None
    api = PREFECT_API_URL.value()
    if not api:
        raise RepevalError("repeval deploy needs a Prefect server: set PREFECT_API_URL, e.g. "
                           "`prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`")

    full_name = f"{FLOW_NAME}/{name}"
    with get_client(sync_client=True) as client:
        unhealthy = client.api_healthcheck()
        if unhealthy is not None:
            raise RepevalError(f"cannot reach the Prefect server at {api}: {unhealthy}")
        _check_pool(client, pool, api)
        _check_name_free(client, full_name, path)

    resource_id = config_resource_id(path)
    trigger = DeploymentEventTrigger(
        name=f"{name}: rerun on protocol change", expect={CHANGED_EVENT},
        match={"prefect.resource.id": resource_id}, posture="Reactive", threshold=1,
    )
    deployment_id = config_benchmark_flow.deploy(
        name=name, work_pool_name=pool, schedule=Cron(cron, timezone=timezone), triggers=[trigger],
        parameters={"config_path": path},
        # one run per config at a time: a trigger during a nightly run waits for it
        concurrency_limit=1,
        entrypoint_type=EntrypointType.MODULE_PATH,  # the installed package, no code upload
        tags=["repeval"], print_next_steps=False, ignore_warnings=True,
    )
    return Deployed(str(deployment_id), full_name, api, path, resource_id)


def _check_pool(client, pool: str, api: str) -> None:
    from prefect.exceptions import ObjectNotFound

    try:
        client.read_work_pool(pool)
    except ObjectNotFound:
        pools = sorted(p.name for p in client.read_work_pools())
        raise RepevalError(f"work pool {pool!r} does not exist on {api}; pools there: "
                           f"{', '.join(pools) or 'none'}. Create it with "
                           f"`prefect work-pool create {pool} --type process`") from None


def _check_name_free(client, full_name: str, path: str) -> None:
    """Deploying under a name another config uses would silently repoint that deployment."""
    from prefect.exceptions import ObjectNotFound

    try:
        existing = client.read_deployment_by_name(full_name)
    except ObjectNotFound:
        return
    other = (existing.parameters or {}).get("config_path")
    if other and other != path:
        raise RepevalError(f"deployment {full_name!r} already runs {other}; pick another --name for {path}")
