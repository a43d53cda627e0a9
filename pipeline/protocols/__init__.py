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
from pipeline.protocols import builtin  # noqa: F401
from pipeline.protocols.dense import protocols as _dense  # noqa: F401
from pipeline.protocols.nets import protocols as _nets  # noqa: F401
from pipeline.protocols.registry import EvalData, Protocol, ProtocolResult, get_protocol, list_protocols, resolve_settings

_LAZY = {
    "apply_temperature": "audits.calibration", "calibration_report": "audits.calibration",
    "expected_calibration_error": "audits.calibration", "fit_temperature": "audits.calibration",
    "FewShotResult": "episodic.fewshot", "fewshot_episodes": "episodic.fewshot",
    "EXPECTED_INVARIANCE": "audits.invariance", "MAPS": "audits.invariance", "invariance_audit": "audits.invariance",
    "KNNClassifier": "neighbours.knn", "knn_class_weights": "neighbours.knn", "topk_blocks": "neighbours.knn",
    "DEFAULT_CS": "linear.logistic", "LogisticProbe": "linear.logistic",
    "LowShotResult": "episodic.lowshot", "lowshot_curve": "episodic.lowshot", "relative_to_baseline": "episodic.lowshot",
    "DEFAULT_ALPHAS": "linear.ridge", "RidgeProbe": "linear.ridge",
    "L2Normalize": "transforms", "Standardize": "transforms", "Whiten": "transforms",
    "make_transform": "transforms", "FeatureRows": "blocks",
}

__all__ = sorted([*_LAZY, "EvalData", "Protocol", "ProtocolResult", "get_protocol", "list_protocols",
                  "resolve_settings"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"pipeline.protocols.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pipeline.protocols' has no attribute {name!r}")
