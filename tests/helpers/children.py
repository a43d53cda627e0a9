"""Processes the fault tests kill: extractions started by a forkserver that has already
imported torch, timm and repeval, so each child is writing the store within a fraction
of a second instead of the seconds a fresh interpreter takes to import torch."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
from tqdm.auto import tqdm

from jobs.extraction.extract import ExtractConfig, extract
from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec, load_encoder
from pipeline.plain import to_plain
from storage_schema import FeatureStore

# tqdm takes its class lock even for a disabled bar, and by default that lock is a
# multiprocessing one (a named semaphore shared by every child of the forkserver): a child
# killed while holding it would block every later child. A thread lock instead: each forked
# child has its own copy, and a killed one leaves nothing behind.
tqdm.set_lock(threading.RLock())

PRELOAD = ["numpy", "torch", "timm", "zarr", "pipeline.encoders.encoder", "pipeline.datasets", "jobs.extraction.extract",
           "storage_schema", "tests.helpers.children"]
# 128 train images: 16 chunks of one batch of 8.
SPEC = EncoderSpec(name="r18", arch="resnet18", layers=("pre_logits", "block3"), input_size=32)
LAYERS = SPEC.layers
SPLIT = "train"
KEY = "features/r18/textures/train/pre_logits"
CHUNK_BATCHES = 1


def textures():
    return make_dataset("textures", n_per_class={"train": 32, "test": 8})


def extract_config(**overrides) -> ExtractConfig:
    return ExtractConfig(**{"batch_size": 8, "chunk_batches": CHUNK_BATCHES, "progress": False, **overrides})


def context():
    """The forkserver context; the server imports PRELOAD once, then forks a child per start."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def extract_child(url: str, lease_ttl: float, conn, wait: bool = True, rlimit_fsize: int | None = None) -> None:
    """Extract SPEC on textures/train into ``url``, reporting on the pipe ``conn``: "started"
    just before the first write, then ("report", ExtractionReport dict) or ("error", type
    name, message) of a RepevalError. ``rlimit_fsize``: a real per-file size limit in bytes;
    writes past it fail with EFBIG.
    """
    import resource
    import signal

    import torch

    from pipeline.errors import RepevalError

    torch.set_num_threads(1)
    store, encoder, dataset = FeatureStore(url), load_encoder(SPEC, device="cpu"), textures()
    if rlimit_fsize is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death by signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (rlimit_fsize, rlimit_fsize))
    conn.send(("started",))
    try:
        report = extract(store, encoder, dataset, SPLIT, extract_config(lease_ttl=lease_ttl, wait=wait))
    except RepevalError as exc:
        conn.send(("error", type(exc).__name__, str(exc)))
    else:
        conn.send(("report", to_plain(report)))


def start_extraction(ctx, url: str, lease_ttl: float, wait: bool = True, rlimit_fsize: int | None = None):
    """Start an extract_child and wait until it is about to write; (process, pipe end)."""
    receive, send = ctx.Pipe(duplex=False)  # a pipe, not a queue: killing a writer breaks nothing shared
    proc = ctx.Process(target=extract_child, args=(url, lease_ttl, send, wait, rlimit_fsize))
    proc.start()
    send.close()
    assert receive.poll(120) and receive.recv() == ("started",), "the extraction child did not start"
    return proc, receive


def finish_extraction(proc, receive) -> tuple:
    """The child's ("report", dict) or ("error", type name, message), once it exited."""
    assert receive.poll(180), "the extraction child did not finish"
    outcome = receive.recv()
    proc.join(60)
    return outcome


def stored_arrays(url: str) -> dict[str, np.ndarray]:
    store = FeatureStore(url, read_only=True)
    return {layer: store.features("r18", "textures", SPLIT, layer).read() for layer in LAYERS}


def missing_chunks(store: FeatureStore, n_chunks: int) -> set[int]:
    """Chunks some layer has not recorded as done (all of them where no array exists yet)."""
    missing = set()
    for layer in LAYERS:
        st = store.status(KEY.replace("pre_logits", layer))
        missing |= set(range(n_chunks)) - set(st.done_chunks if st else ())
    return missing
