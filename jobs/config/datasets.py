"""The datasets of a run: ``datasets:`` entries (the adapters' own parameters are checked
against their signatures by ``jobs.run.plan``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.config.typed import check_name

__all__ = ["DatasetConfig"]


@dataclass
class DatasetConfig:
    """One ``datasets:`` entry: a name, the adapter that reads it and its parameters, and
    which splits train, test and (optionally) validate; the train and test splits default to
    the adapter's own (VOC 2012 and ADE20K score ``val``, the CD-FSL sets pool ``all``).

    Parameters
    ----------
    name : str
        The dataset's name in the store and the report.
    adapter : str
        A registered adapter (``repeval datasets``).
    params : dict
        The adapter's parameters.
    train_split, test_split, val_split : str or None
        The splits used (None: the adapter's; no validation split).
    """

    name: str
    adapter: str
    params: dict[str, Any] = field(default_factory=dict)
    train_split: str | None = None
    test_split: str | None = None
    val_split: str | None = None

    def __post_init__(self) -> None:
        if self.train_split is None or self.test_split is None:
            roles = _split_roles(self.adapter)
            self.train_split = roles[0] if self.train_split is None else self.train_split
            self.test_split = roles[1] if self.test_split is None else self.test_split

    def check(self, path: str) -> None:
        """Refuse names and split names that cannot be store keys (an empty split included).

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
        check_name(self.name, f"{path}.name")
        for what in ("train_split", "test_split", "val_split"):  # '' would silently drop the split
            if what != "val_split" or self.val_split is not None:
                check_name(getattr(self, what), f"{path}.{what}")

    def splits(self) -> list[str]:
        """The splits a run reads, each once, in the order train, validation, test.

        Returns
        -------
        list of str
        """
        # once each: a pooled split can be both train and test (few-shot episodes)
        return list(dict.fromkeys(s for s in (self.train_split, self.val_split, self.test_split) if s))


def _split_roles(adapter: str) -> tuple[str, str]:
    # deferred: the adapters' class attributes only (no file read), imported when a config names datasets
    from pipeline.datasets import adapter_class
    from pipeline.errors import UnknownNameError

    try:
        cls = adapter_class(adapter)
    except UnknownNameError:  # reported with the config's other mistakes
        return "train", "test"
    return cls.train_split, cls.test_split
