"""`repeval serve`'s serving loop: Prefect's runner for the two schedules, stopped by a
signal in seconds, cleanly, whichever of the Prefect server and serve dies first."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from flows.reclaim import RECLAIM_INTERVAL, reclaim, reclaim_periodically
from flows.runtime import local_server_exit
from flows.schedules import DEFAULT_CRON, scan_checkpoints_flow, watch_protocols_flow

if TYPE_CHECKING:
    from prefect.runner import Runner

STOP_GRACE = 10.0  # seconds the runner gets to stop its runs after a signal


class ServerLost(Exception):
    """The runner stopped because the Prefect server it reports to is gone."""


def _quiet() -> None:
    """From here on nothing prints but repeval's own last line: the server may be gone,
    and every Prefect client still running would log (or raise) its failed requests."""
    logging.disable(logging.CRITICAL)
    threading.excepthook = lambda args: None
    sys.unraisablehook = lambda unraisable: None


def end_children() -> None:
    """SIGKILL to what is left of this process's children: a flow run's process the runner
    could not stop in its grace (its server gone); a SIGTERM would have it retry that server
    and print its tracebacks. Their runs stay RUNNING in Prefect's database, and the next
    serve reclaims them at once (their processes are gone: ``flows.reclaim``)."""
    import psutil  # a dependency of dask.distributed

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=5)


def _unreachable(timeout: float = 5.0) -> bool:
    import httpx
    from prefect.settings import PREFECT_API_URL

    try:
        return httpx.get(f"{PREFECT_API_URL.value()}/health", timeout=timeout).status_code != 200
    except httpx.HTTPError:
        return True


def _wait_watching_the_server(done: threading.Event, received: list[int]) -> bool:
    """Wait for ``done`` half a second at a time (the signal handler runs between waits),
    watching the local server serve started: ServerLost as soon as it exits, or True where a
    signal came first (it went with the signal); False once ``done``."""
    while not done.wait(0.5):
        died = local_server_exit()
        if died is not None:
            _quiet()  # Prefect's clients meet the gone server; serve's own line says it
            if received:
                return True
            raise ServerLost(f"the local Prefect server exited with status {died}")
    return False


def _while_the_server_lives(work: Callable[[], Runner], received: list[int]) -> Runner | None:
    """``work()``'s result, run in a thread of its own (in a copy of this context) while this
    thread watches the local server: ServerLost as soon as that server exits, where Prefect's
    client would retry it for a minute (its backoff) before failing; None when a signal came
    and the server is gone with it."""
    result: list[Runner] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # noqa: BLE001  raised in the calling thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=contextvars.copy_context().run, args=(target,), name="repeval-serve-setup",
                     daemon=True).start()
    if _wait_watching_the_server(done, received):
        return None
    if errors:
        raise errors[0]
    return result[0]


def serve_schedules(config_path: str, cron: str | None = DEFAULT_CRON, interval: float | None = None,
                    watch_interval: float = 60.0, say: Callable[[str], None] = print,
                    early: bool | None = None) -> int:
    """Serve both deployments until a signal; the signal's number (0: the runner ended by itself)."""
    # Runs in the main thread, with PREFECT_API_URL set (the serve's own server, or the user's).
    # Raises ServerLost when that server went away under the runner. ``early``: the scan's
    # runs start with the early pass (default: the config's ``early.enabled``).
    received: list[int] = []
    ended = threading.Event()

    def on_signal(signum, frame) -> None:
        if not received:
            received.append(signum)
            _quiet()
        ended.set()

    # From the start: a signal while setting up must not raise KeyboardInterrupt inside
    # Prefect's client calls, which can swallow it (serve then scanned on, ignoring Ctrl-C).
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _serve(config_path, cron, interval, watch_interval, say, received, ended, early)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _serve(config_path: str, cron: str | None, interval: float | None, watch_interval: float,
           say: Callable[[str], None], received: list[int], ended: threading.Event, early: bool | None = None) -> int:
    """serve_schedules' body, with its signal handlers in place (they fill ``received`` and set ``ended``)."""
    from prefect.runner import Runner

    def set_up() -> Runner:
        try:
            reclaim(config_path, say)  # a killed serve's runs hold the slot the next scan needs
        except Exception as exc:  # noqa: BLE001  said, and tried again every RECLAIM_INTERVAL s
            if _unreachable():
                raise
            say(f"looking for runs a killed serve left behind failed ({type(exc).__name__}: {exc}); "
                f"trying again every {RECLAIM_INTERVAL:g} s")
        # concurrency_limit=1: a slow run is never overlapped by the next scheduled one
        scan = scan_checkpoints_flow.to_deployment(
            name="nightly-scan", parameters={"config_path": config_path, "early": early}, concurrency_limit=1,
            **({"interval": interval} if interval else {"cron": cron}),
        )
        watch = watch_protocols_flow.to_deployment(
            name="protocol-watch", parameters={"config_path": config_path}, interval=watch_interval,
            concurrency_limit=1,
        )
        runner = Runner(pause_on_shutdown=True)
        runner.add_deployment(scan)
        runner.add_deployment(watch)
        return runner

    try:
        runner = _while_the_server_lives(set_up, received)
    except ServerLost:
        raise
    except Exception as exc:
        if received:  # stopping anyway (SIGTERM to the group stops the server too): said as the signal
            return received[0]
        if _unreachable():
            _quiet()
            raise ServerLost(f"{type(exc).__name__}: {exc}") from None
        raise

    if received:  # a signal while setting up: nothing runs yet, nothing to stop
        return received[0]
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(runner.start())
        except BaseException as exc:  # noqa: BLE001  said by the main thread (unless stopping anyway)
            errors.append(exc)
        finally:
            ended.set()

    stop_reclaiming = threading.Event()
    try:
        # the runner's thread talks to the caller's API: it runs in a copy of this context
        thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), name="repeval-runner",
                                  daemon=True)
        thread.start()
        reclaim_periodically(config_path, say, stop_reclaiming)
        _wait_watching_the_server(ended, received)  # a signal sets ``ended`` too
        stop_reclaiming.set()
        if received and runner.started and not runner.stopping:
            runner.stopping = True
            try:
                runner.execute_in_background(runner.astop)
            except Exception:  # noqa: BLE001  its loop already gone: nothing left to stop
                pass
        deadline = time.monotonic() + STOP_GRACE  # what it has not stopped by then dies with the process
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.5)
            if received and _unreachable(timeout=0.5):  # the server went first: nothing left to record
                break
    finally:
        stop_reclaiming.set()
    if errors and not received:
        _quiet()  # what is still running of Prefect's clients meets the same gone server
        if _unreachable():
            raise ServerLost(f"{type(errors[0]).__name__}: {errors[0]}") from None
        raise errors[0]
    return received[0] if received else 0
