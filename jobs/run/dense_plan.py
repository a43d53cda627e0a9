"""Which protocols a dense dataset pairs with, checked when a config is planned."""

from __future__ import annotations

from typing import Any

from pipeline.errors import ConfigError, RepevalError
from pipeline.protocols.dense.metrics import NORMAL_METRICS
from pipeline.protocols.registry import get_protocol

__all__ = ["check_dense_pairs", "dataset_task", "dense_correlation_defaults", "pairs_with_dataset"]


def dataset_task(dataset: Any) -> str | None:
    """The dense task of a config's dataset entry (None: not dense, or an unknown adapter)."""
    # deferred: the dataset adapters and PIL load when the datasets are checked, not when a config is read
    from pipeline.datasets import adapter_class

    try:
        return adapter_class(dataset.adapter).dense_task
    except RepevalError:  # an unknown adapter is reported with its dataset entry
        return None


def pairs_with_dataset(protocol: Any, dataset: Any) -> bool:
    """Whether a registered protocol reads a config's dataset: dense protocols their task's
    datasets, the others every dataset that is not dense."""
    return dataset_task(dataset) == protocol.dense


def check_dense_pairs(cfg: Any) -> None:
    """Refuse protocol entries that name a dataset they cannot read, dense protocols with no
    dataset of their task, and protocols that read the encoder's weights (and a dataset's
    images) that would run on a dense dataset."""
    tasks = {d.name: dataset_task(d) for d in cfg.datasets}
    for i, p in enumerate(cfg.protocols):
        mine = [d.name for d in cfg.datasets if p.datasets is None or d.name in p.datasets]
        entry = get_protocol(p.protocol)
        if not entry.reads_features:
            dense = [name for name in mine if tasks[name]]
            if dense:
                raise ConfigError(f"config.protocols[{i}] ({p.name}): dataset {dense[0]!r} has per-pixel targets, "
                                  f"which encoder protocol {p.protocol!r} cannot read; restrict it with its datasets "
                                  "list")
            continue
        want = entry.dense
        if p.datasets is not None:
            wrong = [name for name in p.datasets if name in tasks and tasks[name] != want]
            if wrong:
                has = f"{tasks[wrong[0]]} targets" if tasks[wrong[0]] else "no per-pixel targets"
                reads = f"reads {want} targets" if want else "reads no per-pixel targets"
                raise ConfigError(f"config.protocols[{i}].datasets: {wrong[0]!r} has {has}, but protocol "
                                  f"{p.protocol!r} ({p.name}) {reads}")
        if want and not any(tasks[name] == want for name in mine):
            raise ConfigError(f"config.protocols[{i}] ({p.name}): protocol {p.protocol!r} needs a dataset with {want} "
                              "targets (" + ("ade20k, voc2012_segmentation" if want == "segmentation" else
                                             "nyuv2_normals") + "), and the config has none")


def dense_correlation_defaults(data: dict, path: str) -> dict:
    """A correlation setting over a dense angular error (``mean_angle_error``,
    ``median_angle_error``) reads it as the seed does: negated, not logit-transformed
    (``bounded: false``, ``lower_is_better: true`` unless given); saying otherwise is refused.
    Fractions (mIoU, pixel accuracy, the within-angle shares) keep the logit default."""
    if NORMAL_METRICS.get(data.get("metric")) != "lower":
        return data
    for name, wanted in (("bounded", False), ("lower_is_better", True)):
        if name in data and data[name] is not wanted:
            raise ConfigError(f"{path}.{name}: {data['metric']!r} is an angle in degrees where lower is better: it is "
                              f"negated, not logit-transformed; set {name}: {str(wanted).lower()} (or leave it out)")
    return {**data, "bounded": False, "lower_is_better": True}
