"""The run config, one module per concept; the names below are importable from here
(``from jobs.config import load_config, BenchmarkConfig``).

- ``encoders``: ``encoders:`` entries and ``checkpoints:`` folders, and the weights an
  encoder names, checked before any work;
- ``datasets``: ``datasets:`` entries;
- ``protocols``: ``protocols:`` entries and their checks, read from the one protocol
  registry (settings, the layers and local files of the protocols that read an encoder's
  weights);
- ``report``: the reference scores, the correlation settings, the report;
- ``run``: how a run executes (``extract:``, ``dask:``);
- ``early``: the early pass of a run (``early:``);
- ``benchmark``: the whole config and its cross-checks; ``load``: YAML read under a
  budget to a checked config, relative paths resolved;
- ``typed`` (dicts to dataclasses, field paths in errors), ``mistakes`` (every mistake at
  once, input bounds), ``suites``, ``checkpoint_folders`` (the scan), ``checkpoint_files``
  (a folder's aliases and the checks of its files).

Reading a config imports neither torch nor timm.
"""

from jobs.config.benchmark import BenchmarkConfig
from jobs.config.datasets import DatasetConfig
from jobs.config.early import EarlyConfig
from jobs.config.encoders import ENCODER_SOURCES, CheckpointScan, EncoderConfig, layer_shorthands
from jobs.config.load import load_config, resolve_paths
from jobs.config.protocols import ProtocolConfig
from jobs.config.report import CorrelationConfig, CorrelationSetting, ReferenceConfig, ReportConfig, TrackerConfig
from jobs.config.run import DECODERS, DTYPES, PRECISIONS, DaskSettings, ExtractConfig

__all__ = ["DECODERS", "DTYPES", "ENCODER_SOURCES", "PRECISIONS", "BenchmarkConfig", "CheckpointScan",
           "CorrelationConfig", "CorrelationSetting", "DaskSettings", "DatasetConfig", "EarlyConfig", "EncoderConfig",
           "ExtractConfig", "ProtocolConfig", "ReferenceConfig", "ReportConfig", "TrackerConfig", "layer_shorthands", "load_config",
           "resolve_paths"]
