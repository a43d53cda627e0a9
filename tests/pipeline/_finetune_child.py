"""Fine-tuning runs in child processes for the kill test: started by a forkserver that has
already imported torch, timm and repeval, so a child trains within a fraction of a second."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec
from pipeline.protocols.finetune import RANDOM_RESIZED_CROP_FLIP, FinetuneSettings, GridPoint, run_grid_point

PRELOAD = ["numpy", "torch", "timm", "pipeline.protocols.finetune", "tests.pipeline._finetune_child"]
SPEC = EncoderSpec(name="tiny", arch="test_resnet", input_size=32)
# Saves after steps 3, 6 and 8; random crops and flips, so the augmentation must resume too.
SETTINGS = FinetuneSettings(steps=8, batch_size=8, save_every=3, num_workers=0, lrs=(0.05,), weight_decays=(1e-3,))
POINT = GridPoint(0.05, 1e-3, RANDOM_RESIZED_CROP_FLIP)


def context():
    """The forkserver context; the server imports PRELOAD once, then forks a child per start."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def train_child(scratch: str, kill_after: int | None, conn) -> None:
    """Run the grid point in ``scratch``; SIGKILL itself right after step ``kill_after``
    (None: run to the end), else send the result without its timing on ``conn``."""
    import torch

    torch.set_num_threads(1)

    def progress(done: int, steps: int) -> None:
        if done == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    dataset = make_dataset("textures", n_per_class={"train": 10, "test": 5})
    result = run_grid_point(SPEC, dataset, SETTINGS, POINT, scratch, "cpu", progress=progress)
    result.pop("timing")
    conn.send(result)
    conn.close()


def run_child(ctx, scratch: str, kill_after: int | None) -> tuple[int, dict | None]:
    """(exit code, result or None) of one child."""
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=train_child, args=(scratch, kill_after, send))
    proc.start()
    send.close()
    result = None
    if receive.poll(120):
        try:
            result = receive.recv()
        except EOFError:  # the child died without sending
            result = None
    proc.join(60)
    return proc.exitcode, result
