"""SIGKILL of a real extraction process at seeded random moments, then resume.

Each victim is a forkserver child (torch, timm and repeval already imported) extracting
into its own store; a seeded RNG picks when to kill it, anywhere from the labels write to
the completion records. The resume, a fresh child too, runs with a one-minute lease TTL
and ``wait=False``: it can only proceed because it sees that the lease holder's process
is gone, not by waiting the TTL out. Every resume must feed the model exactly the missing
chunks and leave arrays bitwise equal to an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from storage_schema import FeatureStore, features_group_key
from tests.helpers.children import (
    CHUNK_BATCHES, KEY, SPLIT, context, finish_extraction, missing_chunks, start_extraction, stored_arrays,
)

KILLS = 20
SEED = 6
LONG_TTL = 60.0  # a resume that waited for the TTL would show up as "busy"


def _resume(ctx, url: str) -> dict:
    """Resume in a fresh child; ``wait=False``: a lease it cannot take makes it report "busy"."""
    kind, *payload = finish_extraction(*start_extraction(ctx, url, LONG_TTL, wait=False))
    assert kind == "report", payload
    return payload[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run in a child like the victims; its duration bounds the kill moments."""
    url = str(tmp_path_factory.mktemp("ref") / "store")
    proc, receive = start_extraction(context(), url, LONG_TTL)
    t0 = time.monotonic()
    assert finish_extraction(proc, receive)[0] == "report"
    return url, time.monotonic() - t0, stored_arrays(url)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_is_bitwise_equal(tmp_path, reference):
    ref_url, duration, expected = reference
    window = duration  # kill moments are drawn in [0, window)
    ctx = context()
    n_chunks = FeatureStore(ref_url, read_only=True).status(KEY).n_chunks
    rng = np.random.default_rng(SEED)
    outcomes, done_at_kill, attempts = [], [], 0
    while len(outcomes) < KILLS and attempts < 2 * KILLS:
        attempts += 1
        url = str(tmp_path / f"run{attempts}")
        delay = float(rng.uniform(0, window))
        proc, _ = start_extraction(ctx, url, LONG_TTL)
        time.sleep(delay)
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # finished before its moment came: not a kill
            proc.join()
            window = delay  # runs are faster now than the reference was (a shared machine): draw below
            continue
        proc.join()
        if proc.exitcode == 0:  # finished just before the signal
            window = delay
            continue
        assert proc.exitcode == -signal.SIGKILL
        store = FeatureStore(url)
        st = store.status(KEY)
        done_at_kill.append(len(st.done_chunks) if st else 0)
        missing = missing_chunks(store, n_chunks)
        report = _resume(ctx, url)
        problems = []
        if report["status"] == "busy":
            problems.append("the dead holder's lease was not taken over")
        elif report["forward_batches"] != CHUNK_BATCHES * len(missing):
            problems.append(f"{report['forward_batches']} batches for {len(missing)} missing chunks")
        else:
            resumed = stored_arrays(url)
            problems += [f"{layer} differs" for layer in expected
                         if resumed[layer].tobytes() != expected[layer].tobytes()]
            lease = store.lease(features_group_key("r18", "textures", SPLIT)).current()
            # A kill after the last completion record leaves nothing to resume ("cached", no
            # lease taken): the dead holder's unreleased lease is then taken over by the next writer.
            if report["status"] != "cached" and (lease is None or not lease.released):
                problems.append("lease not released")
        outcomes.append((delay, problems))
    survived = sum(not p for _, p in outcomes)
    strays = sum(1 for _ in tmp_path.rglob("*.partial"))
    print(f"\nSIGKILL during extraction: {survived}/{len(outcomes)} kills survived (resume finished, "
          f"bitwise equal, only missing chunks recomputed); {attempts - len(outcomes)} run(s) finished "
          f"before their moment; chunks done at the kill: {sorted(done_at_kill)} of {n_chunks}; "
          f"reference run {duration:.2f} s; {strays} interrupted temp file(s) left, ignored by readers")
    assert len(outcomes) == KILLS, f"only {len(outcomes)} of {attempts} runs were still running at their moment"
    assert survived == KILLS, [o for o in outcomes if o[1]]
