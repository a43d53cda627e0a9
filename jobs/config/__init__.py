"""The run config, one module per concept; the names below are importable from here
(``from jobs.config import load_config, BenchmarkConfig``)."""

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
