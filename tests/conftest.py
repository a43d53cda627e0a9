"""Session-wide isolation: offline hub, a private PREFECT_HOME, no analytics, and a
working folder without .env/prefect.toml so local settings files cannot leak in."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_PREFECT_HOME = tempfile.mkdtemp(prefix="repeval-prefect-home-")
# every session (and every xdist worker) makes its own: remove it, or /tmp fills run by run
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.pop("PREFECT_API_URL", None)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest workers on a two-core machine: one math thread each (and in
    # the processes they start), or the spinning thread pools slow every test many times over
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import pytest  # noqa: E402


@pytest.fixture
def store_url(tmp_path):
    """A fresh local store location (the S3 variant lives with the scale-out tests)."""
    return str(tmp_path / "store")


@pytest.fixture(scope="session")
def prefect_harness(request):
    """One temporary Prefect API (SQLite) for every flow test of the session (tests/flows,
    tests/load): started once, however many folders use it; under pytest-xdist, one for
    all the workers (tests/helpers/shared_api.py)."""
    shared = getattr(request.config, "workerinput", {}).get(_SHARED_API)
    if shared is not None:
        from tests.helpers.shared_api import use

        with use(*shared):
            yield
        return
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


_SHARED_API = "repeval_shared_prefect_api"  # the workers' input: (url, folder) of the controller's API


def pytest_configure(config):
    """The controlling process of pytest-xdist starts the workers' shared Prefect API."""
    if getattr(config, "workerinput", None) is None and getattr(config.option, "numprocesses", None):
        from tests.helpers.shared_api import SharedAPI

        config.repeval_shared_api = SharedAPI()
        config.repeval_shared_api.start()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist's hook: each worker is told the shared API's URL."""
    api = getattr(node.config, "repeval_shared_api", None)
    if api is not None:
        node.workerinput[_SHARED_API] = (api.url, api.folder)


def pytest_unconfigure(config):
    api = getattr(config, "repeval_shared_api", None)
    if api is not None:
        api.stop()


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test``), the files that hold slow tests go first.

    ``--dist loadfile`` hands each worker whole files, one after another as it runs out, in
    collection order (``--no-loadscope-reorder``: xdist's own order is by number of tests,
    which sends one-test files such as the demo's to the end). A long file handed out last
    keeps one worker busy while the other has nothing left; handed out first, the many short
    files fill in around it. One process (``make test-order``, a file run alone) keeps
    pytest's order.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_files)  # stable: same order otherwise
