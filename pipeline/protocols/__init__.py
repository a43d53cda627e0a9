"""Readout protocols: scikit-learn-compatible estimators and pure functions, by name.

Estimators keep scikit-learn's conventions (parameters only in ``__init__``, ``fit``
returns self, fitted state ends in ``_``) and pass ``sklearn.utils.estimator_checks``
where the checks apply. ``registry`` maps protocol names to runners over stored
features; the built-in protocols are registered when this package is imported.

Importing the package is cheap: the registry and the built-in protocols' metadata need
neither torch nor scikit-learn. The estimators and functions below are imported from
their modules when first used (``from pipeline.protocols import LogisticProbe`` works).
"""

from __future__ import annotations

import importlib
from typing import Any

# register the built-in protocols
from pipeline.protocols import builtin, builtin_dense, builtin_nets  # noqa: F401
from pipeline.protocols.registry import EvalData, Protocol, ProtocolResult, get_protocol, list_protocols, resolve_settings

_LAZY = {
    "apply_temperature": "calibration", "calibration_report": "calibration",
    "expected_calibration_error": "calibration", "fit_temperature": "calibration",
    "FewShotResult": "fewshot", "fewshot_episodes": "fewshot",
    "EXPECTED_INVARIANCE": "invariance", "MAPS": "invariance", "invariance_audit": "invariance",
    "KNNClassifier": "knn", "knn_class_weights": "knn", "topk_blocks": "knn",
    "DEFAULT_CS": "logistic", "LogisticProbe": "logistic",
    "LowShotResult": "lowshot", "lowshot_curve": "lowshot", "relative_to_baseline": "lowshot",
    "DEFAULT_ALPHAS": "ridge", "RidgeProbe": "ridge",
    "L2Normalize": "transforms", "Standardize": "transforms", "Whiten": "transforms",
    "make_transform": "transforms", "FeatureRows": "blocks",
}

__all__ = sorted([*_LAZY, "EvalData", "Protocol", "ProtocolResult", "get_protocol", "list_protocols",
                  "resolve_settings"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"pipeline.protocols.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pipeline.protocols' has no attribute {name!r}")
