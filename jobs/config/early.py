"""The ``early:`` section: an early pass that judges a new encoder from a part of each dataset
before its exact figures exist (``docs/early.md``)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError

__all__ = ["EARLY_ROWS", "EarlyConfig"]

#: How the early rows are chosen: a seeded stratified sample, or (with a history) anchor
#: rows chosen from how earlier encoders did on each test image.
EARLY_ROWS = ("stratified", "anchors")


@dataclass(frozen=True)
class EarlyConfig:
    """The early pass of a run (off unless ``enabled`` or ``repeval run --early``).

    A new encoder's features are first extracted on ``fraction`` of each split's rows
    (stratified by class, at least ``min_per_class`` per class), the config's protocols
    fitted on them and each full figure estimated with an interval at ``level``; then the
    rest of the rows are extracted in the same run (the early rows are not extracted
    twice) and the exact figures replace the estimates. With ``min_history`` earlier
    encoders evaluated on a cell, the estimate is calibrated on them (jackknife+);
    without, it is a sampling estimate of the readout fitted on the early rows.

    Parameters
    ----------
    enabled : bool
        Run the early pass.
    fraction : float
        The share of each split's rows extracted first.
    min_per_class : int
        Early rows of each class, at least.
    rows : str
        How they are chosen (``stratified``, or ``anchors`` from earlier encoders' results).
    level : float
        The nominal coverage of the intervals.
    min_history : int
        Earlier encoders a calibrated estimate needs.
    seed : int
        The seed of the row choice.
    """

    enabled: bool = False
    fraction: float = 0.1  # of each split's rows (train, validation, test)
    min_per_class: int = 2
    rows: str = "stratified"
    level: float = 0.9  # nominal coverage of the intervals
    min_history: int = 10  # earlier encoders a calibrated estimate needs
    seed: int = 0

    def check(self, path: str) -> None:
        """Refuse a fraction outside (0, 0.5], a level outside [0.5, 1), an unknown way of
        choosing rows, or a history too small for the level's intervals.

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
        # deferred: scipy loads with the estimates, not with the config
        from pipeline.analysis.early.estimate import min_history

        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) or \
                not 0 < self.fraction <= 0.5:
            raise ConfigError(f"{path}.fraction: {self.fraction!r} is not a fraction in (0, 0.5] "
                              "(an early pass reads a small part of each split)")
        if isinstance(self.level, bool) or not isinstance(self.level, (int, float)) or not 0.5 <= self.level < 1:
            raise ConfigError(f"{path}.level: {self.level!r} is not a coverage in [0.5, 1), e.g. 0.9")
        if self.rows not in EARLY_ROWS:
            raise ConfigError(f"{path}.rows: {self.rows!r} is not one of {', '.join(EARLY_ROWS)}")
        if self.min_per_class < 1:
            raise ConfigError(f"{path}.min_per_class: {self.min_per_class} must be >= 1")
        need = min_history(self.level)
        if self.min_history < need:
            raise ConfigError(f"{path}.min_history: {self.min_history} is too few for intervals at level "
                              f"{self.level:g} (jackknife+ needs {need} earlier encoders)")
