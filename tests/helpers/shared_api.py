"""One temporary Prefect API for every pytest-xdist worker of a session (tests/conftest.py).

Started by the controlling process (``start``) in a thread of its own while the workers
collect, on a port chosen first, so that each worker is told its URL at once and waits
for it only when a test asks for it (``use``). One API instead of one per worker saves a
server's start-up (its database migrated from nothing: seconds of CPU) and its idle loops.
Each test reads its own runs by id, so sharing one API is what `make test-order` checks.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator


def database_url(folder: str) -> str:
    """The SQLite database of the API whose folder is ``folder``."""
    return f"sqlite+aiosqlite:///{folder}/prefect-test.db"


class SharedAPI:
    """Prefect's temporary API server (as ``prefect_test_harness`` starts it) on a SQLite
    database in a folder of its own, started in a background thread."""

    def __init__(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.folder = tempfile.mkdtemp(prefix="repeval-prefect-api-")
        self.server = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="repeval-shared-api", daemon=True)

    def start(self) -> None:
        """Start the server without waiting for it."""
        self._thread.start()

    def _start(self) -> None:
        from prefect.server.api.server import SubprocessASGIServer
        from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

        try:
            # the server's environment: its database in this folder
            with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: database_url(self.folder)}):
                self.server = SubprocessASGIServer(port=self.port)
                self.server.start(timeout=120)
            if self.server.port != self.port:  # its port was taken meanwhile: the workers were told another
                raise RuntimeError(f"the shared Prefect API started on port {self.server.port}, not {self.port}")
        except BaseException as exc:  # noqa: BLE001  said to the workers waiting for it (use)
            self.error = exc
            with open(f"{self.folder}/error.txt", "w") as f:
                f.write(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Stop the server (after the workers have ended) and remove its database."""
        self._thread.join(timeout=150)
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def use(url: str, folder: str, timeout: float = 150) -> Iterator[None]:
    """This process's flows report to the API at ``url`` for the block, once it answers
    (``folder``: the SharedAPI's, where a failed start is said); the run logs and events
    still queued are sent before the block ends."""
    import httpx
    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError), open(f"{folder}/error.txt") as f:
            raise RuntimeError(f"the session's shared Prefect API did not start: {f.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the session's shared Prefect API at {url} did not answer in {timeout:g} s")
        time.sleep(0.2)
    # the database's URL too, as prefect_test_harness sets it: a test may read the database's file
    updates = {PREFECT_API_URL: url, PREFECT_SERVER_DATABASE_CONNECTION_URL: database_url(folder)}
    with temporary_settings(updates=updates):
        # as prefect_test_harness: contexts copied before this block (threads) see the API too
        with _temporary_global_settings_context(get_settings_context()):
            try:
                yield
            finally:
                APILogWorker.drain_all(timeout=60)
                EventsWorker.drain_all(timeout=60)
