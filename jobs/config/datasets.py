"""The datasets of a run: ``datasets:`` entries (the adapters' own parameters are checked
against their signatures by ``jobs.plan``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.config.typed import check_name

__all__ = ["DatasetConfig"]


@dataclass
class DatasetConfig:
    """One ``datasets:`` entry: a name, the adapter that reads it and its parameters, and
    which splits train, test and (optionally) validate."""

    name: str
    adapter: str
    params: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    test_split: str = "test"
    val_split: str | None = None

    def check(self, path: str) -> None:
        """Refuse names and split names that cannot be store keys (an empty split included)."""
        check_name(self.name, f"{path}.name")
        for what in ("train_split", "test_split", "val_split"):  # '' would silently drop the split
            if what != "val_split" or self.val_split is not None:
                check_name(getattr(self, what), f"{path}.{what}")

    def splits(self) -> list[str]:
        """The splits a run reads, each once, in the order train, validation, test."""
        # once each: a pooled split can be both train and test (few-shot episodes)
        return list(dict.fromkeys(s for s in (self.train_split, self.val_split, self.test_split) if s))
