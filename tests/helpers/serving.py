"""Waiting on a ``repeval serve`` subprocess in the serve tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, check: Callable[[], Any], served: dict, timeout: float = 300, poll: float = 1.0) -> Any:
    """``check()``'s first truthy value, polled until ``timeout``; fails at once, with serve's
    log, when the serve process ``served["proc"]`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        assert served["proc"].poll() is None, f"serve exited {served['proc'].returncode}:\n{served['log']()}"
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}; serve log:\n{served['log']()[-6000:]}")
