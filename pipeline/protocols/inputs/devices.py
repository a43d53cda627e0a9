"""The ``device`` setting of the probes and encoder protocols: which torch device a cell
runs on."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.errors import ConfigError

__all__ = ["DEVICE_CHOICES", "DEVICE_DEFAULT", "available_cores", "check_device_name", "device_setting",
           "resolve_device"]

#: What the ``device`` setting accepts (``cuda:<i>`` with any index).
DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:<i>")
#: The ``device`` setting of the protocols that run in torch, with its default.
DEVICE_DEFAULT = {"device": "auto"}
_DEVICE_NAME = re.compile(r"(auto|cpu|cuda(:\d+)?)")


def check_device_name(value: Any, name: str = "device") -> str:
    """Refuse a device setting that can never be valid (checked at config load, no torch)."""
    if not isinstance(value, str) or not _DEVICE_NAME.fullmatch(value):
        raise ConfigError(f"{name}={value!r} is not a device; valid: {', '.join(DEVICE_CHOICES)}")
    return value


def device_setting(defaults: Mapping[str, Any], check: Callable[[Mapping[str, Any]], None] | None,
                   name: str) -> tuple[dict[str, Any], Callable[[Mapping[str, Any]], None]]:
    """The defaults and the check of a registry entry that ``runs_on_device``."""
    # The registry adds the ``device`` setting (``auto``) to the entry's defaults and checks
    # its name (without torch) before the entry's own rules across settings, so no entry
    # declares or checks it itself.
    if "device" in defaults:
        raise ConfigError(f"protocol {name!r} declares its own 'device' setting; runs_on_device=True adds it "
                          "(drop it from its defaults)")

    def checked(settings: Mapping[str, Any]) -> None:
        check_device_name(settings["device"])
        if check is not None:
            check(settings)

    return {**defaults, **DEVICE_DEFAULT}, checked


def resolve_device(device: Any = "auto") -> Any:
    """The torch device a ``device`` setting names: the one resolution every probe and
    encoder protocol uses."""
    import torch  # deferred: settings are checked (check_device_name) where torch is absent

    choices = ", ".join(DEVICE_CHOICES)
    if device is None or (isinstance(device, str) and device == "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device={device!r} is not a device; valid choices: {choices}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device: {exc}; valid choices: {choices}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} asked for CUDA, but torch.cuda.is_available() is False; "
                              "use device='auto' or 'cpu'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    elif resolved.type != "cpu":
        raise ConfigError(f"device={device!r}: only CPU and CUDA devices are supported; valid choices: {choices}")
    return resolved


def available_cores() -> int:
    """CPU cores this process may run on (its affinity where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
