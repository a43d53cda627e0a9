"""docker/compose.yaml parsed and checked against what repeval and its libraries read.

No Docker engine runs on the test machines, so the arrangement is checked statically:
services, ports, volumes and environment variables must agree with the config the runner
mounts, with the Dockerfiles, and with the settings Prefect, botocore and repeval read.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from jobs.config import load_config
from jobs.evaluation.cell_memory import MEMORY_RESOURCE, parse_bytes

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
SERVICES = {"postgres", "prefect-server", "minio", "minio-init", "dask-scheduler", "dask-worker-gpu",
            "dask-worker-cpu", "runner"}
RUNS_REPEVAL_CODE = {"dask-worker-gpu", "dask-worker-cpu", "runner"}  # import repeval, touch the store
SECRETS = {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD"}
# Variables botocore (under s3fs) reads for credentials, endpoint and region.
BOTOCORE_VARS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def config():
    return load_config(DOCKER / "benchmark.yaml")


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    return dict(e.split("=", 1) for e in env) if isinstance(env, list) else {k: str(v) for k, v in env.items()}


def _argv(service: dict) -> list[str]:
    cmd = service.get("command", [])
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _container_ports(service: dict) -> set[int]:
    return {int(str(p).split(":")[-1]) for p in service.get("ports", [])}


def test_every_service_is_there_and_repeval_ones_build_from_this_pyproject(services):
    assert set(services) == SERVICES
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        if "build" in svc:
            build = svc["build"]
            assert (DOCKER / build["context"]).resolve() == REPO, f"{name} must build from the repo root"
            assert (REPO / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']} is missing"
    pinned = [d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
              if d.startswith(("torch==", "torchvision=="))]
    assert len(pinned) == 2
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        text = (DOCKER / dockerfile).read_text()
        assert "COPY pyproject.toml" in text and 'pip install --no-cache-dir ".[s3]"' in text, dockerfile
        for pin in pinned:  # the image's torch pair is the one pyproject pins
            assert pin in text, f"{dockerfile} does not install {pin}"
    for name in RUNS_REPEVAL_CODE:
        assert "build" in services[name], f"{name} runs repeval code: it must use a repeval image"


def test_ports_published_once_and_match_what_the_commands_listen_on(services):
    host_ports = [str(p).split(":")[0] for svc in services.values() for p in svc.get("ports", [])]
    assert len(host_ports) == len(set(host_ports)), f"a host port is published twice: {host_ports}"
    server = _argv(services["prefect-server"])
    assert int(_flag(server, "--port")) in _container_ports(services["prefect-server"])
    scheduler = _argv(services["dask-scheduler"])
    assert int(_flag(scheduler, "--port")) in _container_ports(services["dask-scheduler"])
    assert 9000 in _container_ports(services["minio"])  # MinIO's S3 API port


def test_urls_point_at_services_and_their_ports(services, config):
    def host_port(url: str) -> tuple[str, int]:
        u = urlparse(url)
        return u.hostname, u.port

    scheduler_port = int(_flag(_argv(services["dask-scheduler"]), "--port"))
    assert host_port(config.dask.address) == ("dask-scheduler", scheduler_port)
    for name in ("dask-worker-gpu", "dask-worker-cpu"):
        assert config.dask.address in _argv(services[name]), f"{name} joins another scheduler"
    server_port = int(_flag(_argv(services["prefect-server"]), "--port"))
    for name in RUNS_REPEVAL_CODE:
        env = _env(services[name])
        assert host_port(env["PREFECT_API_URL"]) == ("prefect-server", server_port), name
        assert urlparse(env["PREFECT_API_URL"]).path == "/api"
        assert host_port(env["AWS_ENDPOINT_URL_S3"]) == ("minio", 9000), name


def test_the_store_bucket_is_the_one_minio_init_makes(services, config):
    assert config.store.startswith("s3://")
    bucket = urlparse(config.store).netloc
    script = " ".join(_argv(services["minio-init"]))
    assert re.search(rf"mc mb (--ignore-existing )?store/{re.escape(bucket)}\b", script), script
    assert "minio-init" in services["runner"]["depends_on"]


def test_prefect_server_uses_the_postgres_service(services):
    pg = _env(services["postgres"])
    url = urlparse(_env(services["prefect-server"])["PREFECT_SERVER_DATABASE_CONNECTION_URL"])
    assert url.scheme == "postgresql+asyncpg" and url.hostname == "postgres" and url.port == 5432
    assert url.username == pg["POSTGRES_USER"] and url.path.lstrip("/") == pg["POSTGRES_DB"]
    assert url.password == "${POSTGRES_PASSWORD}"  # the same secret, substituted by compose
    assert services["prefect-server"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_gpu_worker_declares_the_resource_extraction_asks_for(services, config):
    argv = _argv(services["dask-worker-gpu"])
    assert _flag(argv, "--resources").split(",")[0] == "GPU=1"
    benchmark = (REPO / "flows" / "benchmark.py").read_text()
    assert 'resources={"GPU": 1}' in benchmark  # what extraction tasks are annotated with
    assert config.dask.gpu == "always"
    devices = services["dask-worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["count"] == 1
    assert "GPU" not in _flag(_argv(services["dask-worker-cpu"]), "--resources")


@pytest.mark.parametrize("name", ["dask-worker-gpu", "dask-worker-cpu"])
def test_every_worker_declares_the_memory_evaluation_tasks_ask_for(services, name):
    """Without a MEMORY resource every run warns that cells run unrestricted; declared as
    repeval's own local workers do it: 75 % of the worker's memory limit."""
    argv = _argv(services[name])
    resources = dict(r.split("=") for r in _flag(argv, "--resources").split(","))
    limit = parse_bytes(_flag(argv, "--memory-limit"))
    assert float(resources[MEMORY_RESOURCE]) == pytest.approx(0.75 * limit, rel=0.01)


def test_volumes_are_declared_and_hold_the_paths_the_config_names(compose, services, config):
    declared = set(compose["volumes"])
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith((".", "/")):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which is not in docker/"
            else:
                assert source in declared, f"{name} mounts undeclared volume {source!r}"
    runner_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["runner"]["volumes"]}
    config_path = _argv(services["runner"])[1]
    assert runner_mounts[config_path] == "./benchmark.yaml"
    # Tasks run on the workers: checkpoints and the report folder must be there too.
    needed = [scan.path for scan in config.checkpoints] + [str(Path(config.report.path).parent)]
    for name in RUNS_REPEVAL_CODE:
        mounts = [v.split(":")[1] for v in services[name]["volumes"]]
        for path in needed:
            assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts), (name, path)


def test_environment_names_are_read_by_repeval_or_its_libraries(services):
    import huggingface_hub.constants
    import prefect.settings

    source = "\n".join(p.read_text() for pkg in ("pipeline", "storage_schema", "jobs", "flows")
                       for p in (REPO / pkg).rglob("*.py"))
    hf_constants = Path(huggingface_hub.constants.__file__).read_text()
    for name in RUNS_REPEVAL_CODE | {"prefect-server"}:
        for var in _env(services[name]):
            if var.startswith("PREFECT_"):
                assert hasattr(prefect.settings, var), f"{name}: {var} is not a Prefect setting"
            elif var.startswith("AWS_"):
                assert var in BOTOCORE_VARS, f"{name}: {var} is not read by botocore/s3fs"
            elif var.startswith("REPEVAL_"):
                assert f'"{var}"' in source, f"{name}: repeval never reads {var}"
            elif var == "HF_HUB_OFFLINE":
                assert var in hf_constants
            else:
                pytest.fail(f"{name}: unexpected variable {var}")


def test_secrets_come_from_the_environment_file_only(services):
    example = dict(line.split("=", 1) for line in (DOCKER / "env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    text = (DOCKER / "compose.yaml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert required and required <= set(example), f"env.example lacks {required - set(example)}"
    for name, svc in services.items():
        for var, value in _env(svc).items():
            if var in SECRETS:
                assert value.startswith("${"), f"{name}: {var} is written into compose.yaml"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "docker/.env" in ignored and ".venv" in ignored  # secrets and the venv stay out of images
