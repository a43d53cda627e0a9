"""Shared pieces of the job tests: tiny encoders and datasets, and CLI subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
