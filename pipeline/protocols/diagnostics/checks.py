"""Validation shared by the diagnostics' settings classes."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.errors import ConfigError

__all__ = ["check_integers"]


def check_integers(kind: str, settings: object, lows: Mapping[str, int]) -> None:
    """Each named field of ``settings`` must be an int (not a bool) of at least its low bound."""
    for name, low in lows.items():
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{kind} setting {name} must be an integer >= {low}, got {value!r}")
