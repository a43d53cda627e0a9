"""Lease behaviour every store backend must show: the suite runs it on a local folder
(tests/storage_schema) and on S3 (tests/scaleout), each through its ``store_url`` fixture."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pipeline.errors import LeaseHeldError, LeaseLostError
from storage_schema import FeatureStore

KEY = "features/m/d/train"


class LeaseContract:
    """Subclass as ``Test...`` in a module whose ``store_url`` fixture gives the backend."""

    def test_live_lease_blocks_and_release_frees(self, store_url):
        store = FeatureStore(store_url)
        a, b = store.lease(KEY, ttl=30), store.lease(KEY, ttl=30)
        assert a.try_acquire()
        assert not b.try_acquire()
        with pytest.raises(LeaseHeldError, match=a.owner):
            b.acquire(timeout=0.3)
        a.release()
        assert b.try_acquire()
        assert b.current().owner == b.owner
        b.release()

    def test_dead_owner_lease_expires_and_is_taken_over(self, store_url):
        FeatureStore(store_url)
        holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import time
            from storage_schema import FeatureStore
            lease = FeatureStore({store_url!r}).lease({KEY!r}, ttl=1.0)
            lease.acquire()
            print("held", flush=True)
            time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
        try:
            assert holder.stdout.readline().strip() == "held"
            waiter = FeatureStore(store_url).lease(KEY, ttl=1.0)
            assert not waiter.try_acquire()  # alive and beating
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            t0 = time.monotonic()
            assert waiter.acquire(timeout=10)
            assert time.monotonic() - t0 < 10
            assert waiter.current().generation == 1
            waiter.release()
        finally:
            holder.kill()

    def test_holder_that_lost_its_lease_stops(self, store_url):
        store = FeatureStore(store_url)
        slow = store.lease(KEY, ttl=0.2, heartbeat=3600)  # never beats: looks dead after 0.2 s
        assert slow.try_acquire()
        slow.check()
        time.sleep(0.3)
        thief = store.lease(KEY, ttl=30)
        assert thief.try_acquire()
        with pytest.raises(LeaseLostError, match="taken over"):
            slow.check()
        slow.release()  # must not clobber the thief's record
        assert thief.current().owner == thief.owner and not thief.current().released
        thief.release()
