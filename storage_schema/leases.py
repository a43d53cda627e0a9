"""Write leases: one writer per array group, for a lab sharing one store.

A lease on key K is a series of generation files ``_repeval/leases/K/<gen>.json``. The
holder is the owner of the highest generation. Acquiring means creating generation
``max + 1`` with an exclusive create, so of several racing processes exactly one wins,
also when they race to take over an expired lease. The holder refreshes a heartbeat in
its own file from a background thread; a lease whose heartbeat is older than its ``ttl``
belongs to a dead (or hung) process and may be taken over. A holder that finds a newer
generation has lost the lease and must stop writing (``LeaseLostError``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from pipeline.errors import LeaseHeldError, LeaseLostError
from storage_schema.backend import SIDE, Backend

log = logging.getLogger(__name__)

DEFAULT_TTL = 60.0


@dataclass(frozen=True)
class LeaseInfo:
    generation: int
    owner: str
    heartbeat: float
    ttl: float
    released: bool

    def expired(self, now: float | None = None) -> bool:
        return self.released or (now or time.time()) - self.heartbeat > self.ttl


def _owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """Context manager holding the write lease of one key."""

    def __init__(self, backend: Backend, key: str, ttl: float = DEFAULT_TTL, heartbeat: float | None = None):
        self.backend = backend
        self.key = key
        self.ttl = float(ttl)
        self.interval = heartbeat if heartbeat is not None else max(self.ttl / 4, 0.05)
        self.owner = _owner_id()
        self.generation: int | None = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading ------------------------------------------------------------------------
    def _dir(self) -> str:
        return f"{SIDE}/leases/{self.key}"

    def _generations(self) -> list[int]:
        return sorted(int(n[:-5]) for n in self.backend.list(self._dir()) if n.endswith(".json") and n[:-5].isdigit())

    def current(self) -> LeaseInfo | None:
        """The newest lease on this key, or None."""
        for gen in reversed(self._generations()):
            raw = self.backend.read(f"{self._dir()}/{gen}.json")
            if raw is None:  # removed between list and read
                continue
            d = json.loads(raw)
            return LeaseInfo(gen, d["owner"], d["heartbeat"], d["ttl"], d.get("released", False))
        return None

    # -- acquiring ----------------------------------------------------------------------
    def _record(self, released: bool = False) -> bytes:
        return json.dumps(
            {"owner": self.owner, "heartbeat": time.time(), "ttl": self.ttl, "released": released}
        ).encode()

    def try_acquire(self) -> bool:
        """One attempt: True if we now hold the lease, False if a live holder has it."""
        cur = self.current()
        if cur is not None and not cur.expired():
            return False
        gen = 0 if cur is None else cur.generation + 1
        if not self.backend.create_exclusive(f"{self._dir()}/{gen}.json", self._record()):
            return False  # someone else won this generation
        if cur is not None and not cur.released:
            log.warning("took over expired lease on %s from %s", self.key, cur.owner)
        self.generation = gen
        for old in self._generations():  # older generations are history now
            if old < gen:
                self.backend.delete(f"{self._dir()}/{old}.json")
        self._start_heartbeat()
        return True

    def acquire(self, wait: bool = True, timeout: float | None = None, poll: float = 0.2) -> bool:
        """Acquire the lease; with ``wait`` poll until free or expired (or ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.try_acquire():
                return True
            if not wait:
                return False
            if deadline is not None and time.monotonic() > deadline:
                cur = self.current()
                raise LeaseHeldError(
                    f"lease on {self.key!r} still held by {cur.owner if cur else '?'} after {timeout} s"
                )
            time.sleep(poll)

    # -- holding ------------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.key}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            if not self._still_ours():
                self._lost.set()
                return
            self.backend.write_atomic(f"{self._dir()}/{self.generation}.json", self._record())

    def _still_ours(self) -> bool:
        cur = self.current()
        return cur is not None and cur.generation == self.generation and cur.owner == self.owner

    def check(self) -> None:
        """Raise LeaseLostError if another process took the lease over; call before each write."""
        if self.generation is None:
            raise LeaseLostError(f"lease on {self.key!r} is not held")
        if self._lost.is_set() or not self._still_ours():
            self._lost.set()
            raise LeaseLostError(
                f"lease on {self.key!r} (generation {self.generation}) was taken over; stopping writes"
            )

    def release(self) -> None:
        if self.generation is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._still_ours():
            self.backend.write_atomic(f"{self._dir()}/{self.generation}.json", self._record(released=True))
        self.generation = None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
