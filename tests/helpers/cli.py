"""Shared pieces of the job tests: tiny encoders and datasets, and CLI subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A small, fast, real timm model and a small synthetic dataset: 256 train images in
# 16 chunks of 2 batches of 8.
ENCODER_ARGS = ["--arch", "resnet18", "--name", "r18", "--input-size", "32", "--layers", "pre_logits", "block3"]
DATASET_ARGS = ["--dataset", "textures", "--param", 'n_per_class={"train": 64, "test": 16}']
# A short lease TTL: a killed writer's lease is taken over after 2 s instead of 60.
BATCH_ARGS = ["--batch-size", "8", "--chunk-batches", "2", "--lease-ttl", "2"]


def cli_command(store: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "extract", "--store", store, *ENCODER_ARGS, *DATASET_ARGS,
            *BATCH_ARGS, "--split", "train", "--json", "--quiet", *extra]


def cli_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return env


def run_cli(store: str, *extra: str) -> dict:
    out = subprocess.run(cli_command(store, *extra), capture_output=True, text=True, env=cli_env(),
                         cwd=REPO, timeout=300)
    if out.returncode != 0:
        raise AssertionError(f"extract failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def one_math_thread() -> Iterator[None]:
    """torch's CPU math on one thread in this process for the block, as in the CLI
    subprocesses (OMP_NUM_THREADS=1): a computation is bitwise reproducible for one thread
    count only."""
    import torch  # here: the CLI helpers above serve tests that never load torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def extract_here(store: str) -> None:
    """What ``cli_command(store)`` extracts, done in this process on one math thread: the
    same bytes as the CLI subprocess, without its interpreter and imports."""
    from jobs.extraction.extract import ExtractConfig, extract
    from pipeline.datasets import make_dataset
    from pipeline.encoders import EncoderSpec, load_encoder
    from storage_schema import FeatureStore

    with one_math_thread():  # ENCODER_ARGS, DATASET_ARGS and BATCH_ARGS, as the command takes them
        extract(FeatureStore(store),
                load_encoder(EncoderSpec(name="r18", arch="resnet18", layers=("pre_logits", "block3"), input_size=32)),
                make_dataset("textures", n_per_class={"train": 64, "test": 16}), "train",
                ExtractConfig(batch_size=8, chunk_batches=2, lease_ttl=2, progress=False))
