"""What a run reports: the reference scores, the correlation settings against them, the
HTML report (whether a metric exists is checked by ``jobs.analysis.correlate``) and the
experiment trackers each newly evaluated checkpoint's scores go to (``jobs.trackers``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobs.dense_plan import dense_correlation_defaults
from pipeline.errors import ConfigError

__all__ = ["TRACKER_KINDS", "CorrelationConfig", "CorrelationSetting", "ReferenceConfig", "ReportConfig",
           "TrackerConfig"]

TRACKER_KINDS = ("tensorboard", "mlflow")


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
class TrackerConfig:
    """One experiment tracker of ``report.trackers``: each newly evaluated checkpoint's
    primary scores, keyed by its training step, go to TensorBoard event files (``dir``) or
    an MLflow tracking store (``tracking_uri``, ``experiment``). Relative paths are taken
    from the config file's folder; left out, they are ``tensorboard/`` and ``mlruns/``
    beside the report (``jobs.config.load.resolve_paths``)."""

    kind: str
    dir: str | None = None  # tensorboard: event files under <dir>/<series>/
    tracking_uri: str | None = None  # mlflow: any tracking URI (file:, sqlite:, http(s):, databricks)
    experiment: str = "repeval"  # mlflow: the experiment the series' runs belong to

    def check(self, path: str) -> None:
        """Refuse an unknown kind (naming the valid ones) and a field of the other kind."""
        if self.kind not in TRACKER_KINDS:
            raise ConfigError(f"{path}.kind: {self.kind!r} is not a tracker; choose one of {', '.join(TRACKER_KINDS)}")
        if self.kind != "tensorboard" and self.dir is not None:
            raise ConfigError(f"{path}.dir: only a tensorboard tracker has a dir; an {self.kind} one takes "
                              "tracking_uri")
        if self.kind != "mlflow" and self.tracking_uri is not None:
            raise ConfigError(f"{path}.tracking_uri: only an mlflow tracker has a tracking_uri; a {self.kind} "
                              "one takes dir")
        for name in ("dir", "tracking_uri"):
            if getattr(self, name) is not None and not getattr(self, name).strip():
                raise ConfigError(f"{path}.{name}: must not be empty (leave it out for the default)")
        if not self.experiment.strip():
            raise ConfigError(f"{path}.experiment: must not be empty")


@dataclass
class ReportConfig:
    """The ``report:`` section: where the HTML report is written, the low-shot baseline,
    and the experiment trackers the new scores are logged to."""

    path: str = "repeval-report/report.html"
    baseline: str | None = None  # encoder that low-shot curves are drawn relative to
    trackers: list[TrackerConfig] = field(default_factory=list)
