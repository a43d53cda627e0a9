"""What a run reports: the reference scores, the correlation settings against them, and
the HTML report (whether a metric exists is checked by ``jobs.analysis.correlate``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobs.dense_plan import dense_correlation_defaults
from pipeline.errors import ConfigError

__all__ = ["CorrelationConfig", "CorrelationSetting", "ReferenceConfig", "ReportConfig"]


@dataclass
class ReferenceConfig:
    """Reference score per encoder (fractions in [0, 1]), given or measured."""

    scores: dict[str, float] = field(default_factory=dict)
    csv: str | None = None  # columns: model, score
    dataset: str | None = None  # measured: this dataset ...
    protocol: str | None = None  # ... under this protocol setting
    metric: str | None = None  # None: that protocol's primary metric
    name: str = "reference"


@dataclass
class CorrelationSetting:
    """One correlation: a protocol setting's metric on some datasets (averaged when several)
    against the reference score, over the encoders."""

    name: str
    protocol: str  # a ProtocolConfig name
    datasets: list[str]
    metric: str | None = None  # None: the protocol's primary metric (score; few-shot: mean)
    layer: str = "pre_logits"
    bounded: bool = True  # a metric in [0, 1] (accuracy, ECE): logit-transformed
    lower_is_better: bool = False  # e.g. ECE: negated before correlating

    @staticmethod
    def prepare_plain(data: dict, path: str) -> dict:
        """Fill in a dense metric's defaults (angular errors: raw and negated) before typing."""
        return dense_correlation_defaults(data, path)


@dataclass
class CorrelationConfig:
    """The ``correlation:`` section: its settings and the bootstrap of their intervals."""

    settings: list[CorrelationSetting] = field(default_factory=list)
    bootstrap: int = 1000
    seed: int = 0

    def check(self, path: str) -> None:
        """Refuse a negative bootstrap count or seed (else the run fails only at its very end)."""
        if self.bootstrap < 0 or self.seed < 0:
            raise ConfigError(f"{path}: bootstrap and seed must be >= 0, got {self.bootstrap} and {self.seed}")


@dataclass
class ReportConfig:
    """The ``report:`` section: where the HTML report is written, and the low-shot baseline."""

    path: str = "repeval-report/report.html"
    baseline: str | None = None  # encoder that low-shot curves are drawn relative to
