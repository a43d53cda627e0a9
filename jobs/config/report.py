"""What a run reports: the reference scores, the correlation settings against them, the
HTML report (whether a metric exists is checked by ``jobs.analysis.correlate``) and the
experiment trackers each newly evaluated checkpoint's scores go to (``jobs.report.trackers``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobs.run.dense_plan import dense_correlation_defaults
from pipeline.errors import ConfigError

__all__ = ["TRACKER_KINDS", "CorrelationConfig", "CorrelationSetting", "ReferenceConfig", "ReportConfig",
           "TrackerConfig"]

TRACKER_KINDS = ("tensorboard", "mlflow")


@dataclass
class ReferenceConfig:
    """Reference score per encoder (fractions in [0, 1]), given or measured.

    Parameters
    ----------
    scores : dict
        Encoder name -> score.
    csv : str or None
        A CSV file of scores (columns ``model``, ``score``).
    dataset, protocol : str or None
        Measured: the scores of this dataset under this protocol setting.
    metric : str or None
        The measured metric (None: the protocol's primary metric).
    name : str
        What the report calls the reference.
    """

    scores: dict[str, float] = field(default_factory=dict)
    csv: str | None = None  # columns: model, score
    dataset: str | None = None  # measured: this dataset ...
    protocol: str | None = None  # ... under this protocol setting
    metric: str | None = None  # None: that protocol's primary metric
    name: str = "reference"


@dataclass
class CorrelationSetting:
    """One correlation: a protocol setting's metric on some datasets (averaged when several)
    against the reference score, over the encoders.

    Parameters
    ----------
    name : str
        The correlation's name in the report.
    protocol : str
        A protocol setting's name (``protocols:``).
    datasets : list of str
        The datasets averaged.
    metric : str or None
        None: the protocol's primary metric.
    layer : str
        The layer read.
    bounded : bool
        A metric in [0, 1], logit-transformed before averaging.
    lower_is_better : bool
        Negated before correlating (e.g. ECE).
    """

    name: str
    protocol: str  # a ProtocolConfig name
    datasets: list[str]
    metric: str | None = None  # None: the protocol's primary metric (score; few-shot: mean)
    layer: str = "pre_logits"
    bounded: bool = True  # a metric in [0, 1] (accuracy, ECE): logit-transformed
    lower_is_better: bool = False  # e.g. ECE: negated before correlating

    @staticmethod
    def prepare_plain(data: dict, path: str) -> dict:
        """Fill in a dense metric's defaults (angular errors: raw and negated) before typing.

        Parameters
        ----------
        data : dict
            The entry as read from YAML, before typing.
        path : str
            Where the entry sits in the config, for the messages.

        Returns
        -------
        dict
            ``data`` with the shorthands expanded.
        """
        return dense_correlation_defaults(data, path)


@dataclass
class CorrelationConfig:
    """The ``correlation:`` section: its settings and the bootstrap of their intervals.

    Parameters
    ----------
    settings : list of CorrelationSetting
        The correlations.
    bootstrap : int
        Bootstrap resamples of each interval (0: none).
    seed : int
        The bootstrap's seed.
    """

    settings: list[CorrelationSetting] = field(default_factory=list)
    bootstrap: int = 1000
    seed: int = 0

    def check(self, path: str) -> None:
        """Refuse a negative bootstrap count or seed (else the run fails only at its very end).

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
        if self.bootstrap < 0 or self.seed < 0:
            raise ConfigError(f"{path}: bootstrap and seed must be >= 0, got {self.bootstrap} and {self.seed}")


@dataclass
class TrackerConfig:
    """One experiment tracker of ``report.trackers``: each newly evaluated checkpoint's
    primary scores, keyed by its training step, go to TensorBoard event files (``dir``) or
    an MLflow tracking store (``tracking_uri``, ``experiment``). Relative paths are taken
    from the config file's folder; left out, they are ``tensorboard/`` and ``mlruns/``
    beside the report (``jobs.config.load.resolve_paths``).

    Parameters
    ----------
    kind : str
        ``tensorboard`` or ``mlflow``.
    dir : str or None
        TensorBoard: event files go under ``<dir>/<series>/``.
    tracking_uri : str or None
        MLflow: any tracking URI (``file:``, ``sqlite:``, ``http(s):``, ``databricks``).
    experiment : str
        MLflow: the experiment the series' runs belong to.
    """

    kind: str
    dir: str | None = None  # tensorboard: event files under <dir>/<series>/
    tracking_uri: str | None = None  # mlflow: any tracking URI (file:, sqlite:, http(s):, databricks)
    experiment: str = "repeval"  # mlflow: the experiment the series' runs belong to

    def check(self, path: str) -> None:
        """Refuse an unknown kind (naming the valid ones) and a field of the other kind.

        Parameters
        ----------
        path : str
            Where the entry sits in the config (``encoders[0]``), for the messages.
        """
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
    and the experiment trackers the new scores are logged to.

    Parameters
    ----------
    path : str
        The HTML file written.
    baseline : str or None
        The encoder low-shot curves are drawn relative to.
    trackers : list of TrackerConfig
        Where new scores are logged.
    """

    path: str = "repeval-report/report.html"
    baseline: str | None = None  # encoder that low-shot curves are drawn relative to
    trackers: list[TrackerConfig] = field(default_factory=list)
