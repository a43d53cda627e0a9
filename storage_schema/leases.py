"""Write leases: one writer per array group, for a lab sharing one store."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any

from pipeline.errors import LeaseHeldError, LeaseLostError
from storage_schema import keys
from storage_schema.backend import Backend

log = logging.getLogger(__name__)

DEFAULT_TTL = 60.0


@dataclass(frozen=True)
class LeaseInfo:
    """One generation file of a lease, as read.

    Parameters
    ----------
    generation : int
        The generation number (the holder is the owner of the highest).
    owner : str
        ``host:pid:random`` of the holder.
    heartbeat : float
        Unix time of the last heartbeat.
    ttl : float
        Seconds without a heartbeat after which the lease may be taken over.
    released : bool
        Whether the holder released it.
    process : dict, optional
        Where the holder runs (host, boot id, pid namespace, pid, start time).
    """

    generation: int
    owner: str
    heartbeat: float
    ttl: float
    released: bool
    process: dict[str, Any] | None = None  # where the holder runs; None in older records

    def expired(self, now: float | None = None) -> bool:
        """Whether the lease is released or its heartbeat is older than its ttl.

        Parameters
        ----------
        now : float, optional
            Unix time to judge at; the current time by default.

        Returns
        -------
        bool
            True when another process may take it over.
        """
        return self.released or (now or time.time()) - self.heartbeat > self.ttl

    def holder_gone(self) -> bool:
        """Whether the holder is known dead: it ran on this machine, in this pid namespace,
        and its process no longer exists (or its pid now belongs to a younger process).

        Returns
        -------
        bool
            False whenever that cannot be known (another machine, no ``/proc``).
        """
        here = _machine()
        p = self.process
        if here is None or not p or p.get("started") is None or any(p.get(k) != v for k, v in here.items()):
            return False
        return _start_time(int(p["pid"])) != p.get("started")


def _owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@cache
def _machine() -> dict[str, str] | None:
    """Host name, boot id and pid namespace: equal for two processes exactly when their
    pids can be compared (Linux; None elsewhere)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return {"host": socket.gethostname(), "boot_id": boot_id, "pid_ns": pid_ns}


def _start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live process ``pid``; None if none or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _process_record() -> dict[str, Any] | None:
    machine = _machine()
    if machine is None:
        return None
    return {**machine, "pid": os.getpid(), "started": _start_time(os.getpid())}


class Lease:
    """Context manager holding the write lease of one key.

    Parameters
    ----------
    backend : Backend
        The store's byte-level access.
    key : str
        The leased key (an array group).
    ttl : float
        Seconds without a heartbeat after which the lease may be taken over.
    heartbeat : float, optional
        Seconds between heartbeats; a quarter of ``ttl`` by default.
    """

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
    def _generations(self) -> list[int]:
        names = self.backend.list(keys.lease_dir(self.key))
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

    def current(self) -> LeaseInfo | None:
        """The newest lease on this key.

        Returns
        -------
        LeaseInfo or None
            The newest generation, or None when there is none.
        """
        for gen in reversed(self._generations()):
            raw = self.backend.read(keys.lease_generation_key(self.key, gen))
            if raw is None:  # removed between list and read
                continue
            d = json.loads(raw)
            return LeaseInfo(gen, d["owner"], d["heartbeat"], d["ttl"], d.get("released", False), d.get("process"))
        return None

    # -- acquiring ----------------------------------------------------------------------
    def _record(self, released: bool = False) -> bytes:
        return json.dumps(
            {"owner": self.owner, "heartbeat": time.time(), "ttl": self.ttl, "released": released,
             "process": _process_record()}
        ).encode()

    def try_acquire(self) -> bool:
        """Try once to take the lease.

        Returns
        -------
        bool
            True when this process now holds it, False when a live holder has it.
        """
        cur = self.current()
        gone = cur is not None and not cur.expired() and cur.holder_gone()
        if cur is not None and not cur.expired() and not gone:
            return False
        gen = 0 if cur is None else cur.generation + 1
        if not self.backend.create_exclusive(keys.lease_generation_key(self.key, gen), self._record()):
            return False  # someone else won this generation
        if cur is not None and not cur.released:
            log.warning("took over %s lease on %s from %s", "dead holder's" if gone else "expired",
                        self.key, cur.owner)
        self.generation = gen
        for old in self._generations():  # older generations are history now
            if old < gen:
                self.backend.delete(keys.lease_generation_key(self.key, old))
        self._start_heartbeat()
        return True

    def acquire(self, wait: bool = True, timeout: float | None = None, poll: float = 0.2) -> bool:
        """Acquire the lease, waiting for it when ``wait``.

        Parameters
        ----------
        wait : bool
            Poll until the lease is free or expired; else try once.
        timeout : float, optional
            Seconds to wait at most; LeaseHeldError after that.
        poll : float
            Seconds between attempts.

        Returns
        -------
        bool
            True when acquired; False when not waiting and it is held.
        """
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
            try:
                self.backend.write_atomic(keys.lease_generation_key(self.key, self.generation), self._record())
            except OSError as exc:  # e.g. a full disk: keep trying; the ttl covers a long outage
                log.warning("lease %s: heartbeat not written: %s", self.key, exc)

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
        """Stop the heartbeat and mark the lease released (unless another process took it over)."""
        if self.generation is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._still_ours():
            path = keys.lease_generation_key(self.key, self.generation)
            try:
                self.backend.write_atomic(path, self._record(released=True))
            except OSError:  # no room for the new record (full disk): no record frees the lease too
                try:
                    self.backend.delete(path)
                except OSError as exc:
                    log.warning("lease %s not released (%s); it expires after %.0f s", self.key, exc, self.ttl)
        self.generation = None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
