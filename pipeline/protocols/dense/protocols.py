"""The dense protocols, ``segmentation`` and ``normals``, registered with their defaults,
ranges and memory; they read a dense dataset's spatial maps and per-pixel targets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.protocols.dense.codebook import FORMULATIONS
from pipeline.protocols.dense.memory import normals_memory, segmentation_memory
from pipeline.protocols.dense.metrics import NORMAL_METRICS, SEGMENTATION_METRICS
from pipeline.protocols.inputs.parameters import OPTIMIZER_MAX, check_setting_grid
from pipeline.protocols.registry import SEED, Bound, ProtocolResult, above, register_protocol

__all__ = ["DENSE_SCHEDULE", "NORMALS_SCHEDULE"]

#: Settings of the training schedule both dense protocols share, with their defaults.
DENSE_SCHEDULE = {"epochs": 20, "batch_size": 8, "momentum": 0.9, "weight_decay": 1e-4, "power": 0.9,
                  "save_every": 200, "seed": 0}
#: The normals protocol's schedule: the seed's (Ericsson et al. 2021, A.5; Goyal et al.'s
#: code): 150 epochs, batch 4, SGD momentum 0.9, poly decay, learning rate 0.02.
NORMALS_SCHEDULE = {**DENSE_SCHEDULE, "epochs": 150, "batch_size": 4}
_BOUNDS = {"epochs": Bound(1, 10_000), "batch_size": Bound(1, 4096), "momentum": Bound(0, 1, high_open=True),
           "weight_decay": Bound(0, OPTIMIZER_MAX), "power": Bound(0), "save_every": Bound(1, 10**9), "seed": SEED}


def _check_segmentation(s: Mapping[str, Any]) -> None:
    check_setting_grid(s["learning_rates"], "learning_rates", positive=True, high=OPTIMIZER_MAX)


@register_protocol(
    "segmentation", version=1,
    defaults={"learning_rates": [1e-3, 1e-2, 1e-1], **DENSE_SCHEDULE, "val_fraction": 0.1},
    bounds={**_BOUNDS, "val_fraction": Bound(0, 1, low_open=True, high_open=True)},
    check=_check_segmentation, runs_on_device=True, memory=segmentation_memory, dense="segmentation",
    metrics=("score", *SEGMENTATION_METRICS), primary_metric="miou",
    description="linear (1x1) head on spatial maps, bilinear upsampling, learning rate by validation mIoU; "
                "mIoU and pixel accuracy (DINOv2's linear protocol)",
    cheap_settings={"learning_rates": [0.1, 1.0], "epochs": 4, "batch_size": 4, "device": "cpu"},
)
def _segmentation(data: Any, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch loads when a cell runs, not when the registry is read
    from pipeline.protocols.dense.runners import run_segmentation

    return run_segmentation(data, s)


@register_protocol(
    "normals", version=2,  # 2: the seed's pspnet head, classification over clustered normals, 150 epochs, batch 4
    defaults={"head": "pspnet", "formulation": "classification", "clusters": 40, "hidden_units": 512,
              "learning_rate": 0.02, **NORMALS_SCHEDULE},
    choices={"head": ("pspnet", "conv", "linear"), "formulation": FORMULATIONS},  # heads.HEADS, without torch
    bounds={**_BOUNDS, "hidden_units": Bound(1, 65_536), "clusters": Bound(2, 254),
            "learning_rate": Bound(0, OPTIMIZER_MAX, low_open=True)},
    runs_on_device=True, memory=normals_memory, dense="normals",
    metrics=("score", *NORMAL_METRICS), primary_metric="within_11_25",
    unbounded=tuple(m for m, kind in NORMAL_METRICS.items() if kind == "lower"),
    description="head on spatial maps (the seed's PSPNet pyramid pooling by default) predicting unit normals "
                "(by default as the seed: classification over 40 k-means normals), bilinear upsampling; mean and "
                "median angular error, % within 11.25/22.5/30 degrees (Ericsson et al. 2021, Table 5)",
    cheap_settings={"head": "linear", "learning_rate": 0.5, "epochs": 4, "batch_size": 4, "device": "cpu"},
)
def _normals(data: Any, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch loads when a cell runs, not when the registry is read
    from pipeline.protocols.dense.runners import run_normals

    return run_normals(data, s)
