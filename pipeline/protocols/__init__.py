"""Readout protocols (PROTOCOLS.md): sklearn-compatible estimators and pure functions.

Estimators keep sklearn's conventions (parameters only in ``__init__``, ``fit`` returns
self, fitted state ends in ``_``) and pass ``sklearn.utils.estimator_checks`` where the
checks apply. ``registry`` maps protocol names to runners over stored features.
"""

from pipeline.protocols.calibration import (
    apply_temperature, calibration_report, expected_calibration_error, fit_temperature,
)
from pipeline.protocols.fewshot import FewShotResult, fewshot_episodes
from pipeline.protocols.invariance import EXPECTED_INVARIANCE, MAPS, invariance_audit
from pipeline.protocols.knn import KNNClassifier, knn_class_weights, topk_blocks
from pipeline.protocols.logistic import DEFAULT_CS, LogisticProbe
from pipeline.protocols.lowshot import LowShotResult, lowshot_curve, relative_to_baseline
from pipeline.protocols.registry import EvalData, ProtocolResult, get_protocol, list_protocols, resolve_settings
from pipeline.protocols.ridge import DEFAULT_ALPHAS, RidgeProbe
from pipeline.protocols.transforms import L2Normalize, Standardize, Whiten, make_transform

__all__ = [
    "DEFAULT_ALPHAS", "DEFAULT_CS", "EXPECTED_INVARIANCE", "EvalData", "FewShotResult", "KNNClassifier",
    "L2Normalize", "LogisticProbe", "LowShotResult", "MAPS", "ProtocolResult", "RidgeProbe", "Standardize",
    "Whiten", "apply_temperature", "calibration_report", "expected_calibration_error", "fewshot_episodes",
    "fit_temperature", "get_protocol", "invariance_audit", "knn_class_weights", "list_protocols",
    "lowshot_curve", "make_transform", "relative_to_baseline", "resolve_settings", "topk_blocks",
]
