"""The valid range of a numeric protocol setting, checked before any work."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SEED", "Bound", "above", "at_least"]


@dataclass(frozen=True)
class Bound:
    """The valid range of a numeric setting, checked by resolve_settings before any work."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the range."""
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def __str__(self) -> str:
        low = f"{'>' if self.low_open else '>='} {self.low:g}" if self.low is not None else ""
        high = f"{'<' if self.high_open else '<='} {self.high:g}" if self.high is not None else ""
        return " and ".join(b for b in (low, high) if b)


def at_least(low: float) -> Bound:
    """The range value >= low."""
    return Bound(low)


def above(low: float) -> Bound:
    """The range value > low."""
    return Bound(low, low_open=True)


SEED = Bound(0, 2**32 - 1)  # numpy's RandomState takes no other seed
