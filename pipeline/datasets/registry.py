"""Registry of dataset adapters, after timm's ``register_model`` / ``create_model``."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from pipeline.errors import ConfigError, unknown_name

_ADAPTERS: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register_dataset(name: str) -> Callable[[T], T]:
    """Class decorator adding an adapter under ``name``; a duplicate name warns and replaces.

    Parameters
    ----------
    name : str
        The adapter's name in configs.

    Returns
    -------
    callable
        The decorator (it returns the class, with ``adapter`` set).
    """

    def decorate(cls: T) -> T:
        if name in _ADAPTERS:
            warnings.warn(
                f"Overwriting dataset adapter {name!r} already in registry", UserWarning, stacklevel=2
            )
        cls.adapter = name
        _ADAPTERS[name] = cls
        return cls

    return decorate


def list_datasets() -> list[str]:
    """Names of the registered dataset adapters, sorted.

    Returns
    -------
    list of str
    """
    return sorted(_ADAPTERS)


def adapter_class(adapter: str) -> type:
    """The class registered as ``adapter`` (its metadata without building it: no file is read).

    Parameters
    ----------
    adapter : str
        A registered adapter name; UnknownNameError lists the valid ones.

    Returns
    -------
    type
    """
    if adapter not in _ADAPTERS:
        raise unknown_name("dataset adapter", adapter, _ADAPTERS)
    return _ADAPTERS[adapter]


def make_dataset(adapter: str, name: str | None = None, **params: Any) -> Any:
    """Build the adapter registered as ``adapter``.

    Parameters
    ----------
    adapter : str
        A registered adapter name.
    name : str, optional
        The dataset's name in the store (default: the adapter's own choice).
    **params
        The adapter's constructor parameters; an unknown one is a ConfigError listing
        the valid ones.

    Returns
    -------
    DatasetAdapter
    """
    cls = adapter_class(adapter)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "name")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(
            f"Dataset adapter {adapter!r} got unknown parameter(s) {unknown}; valid: {', '.join(accepted)}"
        )
    return cls(name=name, **params)
