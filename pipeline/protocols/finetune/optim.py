"""SGD with Nesterov momentum, the weight-decay rule and the cosine learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from pipeline.protocols.finetune.settings import FinetuneSettings, GridPoint

__all__ = ["cosine_lr", "make_optimizer", "make_scheduler", "optimizer_weight_decay"]


def optimizer_weight_decay(point: GridPoint) -> float:
    """The ``weight_decay`` handed to SGD: the grid's decay divided by the base learning rate.

    Parameters
    ----------
    point : the grid point (``lr`` and ``weight_decay``).

    Returns
    -------
    float
        ``point.weight_decay / point.lr``.
    """
    return point.weight_decay / point.lr


def cosine_lr(lr: float, step: int, steps: int) -> float:
    """Closed form of the learning rate at 0-based ``step`` of ``steps``.

    Parameters
    ----------
    lr : base learning rate.
    step : 0-based optimizer step.
    steps : length of the schedule.

    Returns
    -------
    float
        ``lr * (1 + cos(pi * step / steps)) / 2``.
    """
    return lr * 0.5 * (1.0 + math.cos(math.pi * step / steps))


def make_optimizer(params: Iterable[torch.nn.Parameter], point: GridPoint,
                   settings: FinetuneSettings) -> torch.optim.SGD:
    """SGD with Nesterov momentum ``settings.momentum`` at the point's learning rate and
    decay rule (see the module doc).

    Parameters
    ----------
    params : the parameters to train.
    point : learning rate and weight decay.
    settings : supplies the momentum.

    Returns
    -------
    torch.optim.SGD
    """
    momentum = float(settings.momentum)
    return torch.optim.SGD(params, lr=point.lr, momentum=momentum, nesterov=momentum > 0.0,
                           weight_decay=optimizer_weight_decay(point))


def make_scheduler(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.CosineAnnealingLR:
    """Cosine decay to zero over ``steps`` steps, stepped once after every optimizer step.

    Parameters
    ----------
    optimizer : the optimizer whose learning rate is scheduled.
    steps : length of the schedule.

    Returns
    -------
    torch.optim.lr_scheduler.CosineAnnealingLR
    """
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=0.0)
