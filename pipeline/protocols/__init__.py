"""Readout protocols: scikit-learn-compatible estimators and pure functions, by name.

Estimators keep scikit-learn's conventions (parameters only in ``__init__``, ``fit``
returns self, fitted state ends in ``_``) and pass ``sklearn.utils.estimator_checks``
where the checks apply. ``registry`` maps protocol names to runners over stored
features (or an encoder's weights); each family (linear, neighbours, episodic, nets, audits,
dense, finetune, diagnostics) registers its protocols in its own ``protocols`` module, and
importing this package imports the families.

Importing the package is cheap: the registry and the protocols' metadata need neither
torch nor scikit-learn. The estimators and functions below are imported from
their modules when first used (``from pipeline.protocols import LogisticProbe`` works).
"""

from __future__ import annotations

import importlib
from typing import Any

# each family registers its protocols where they are defined (its ``protocols`` module)
from pipeline.protocols.audits import protocols as _audits  # noqa: F401
from pipeline.protocols.dense import protocols as _dense  # noqa: F401
from pipeline.protocols.diagnostics import protocols as _diagnostics  # noqa: F401
from pipeline.protocols.episodic import protocols as _episodic  # noqa: F401
from pipeline.protocols.finetune import protocols as _finetune  # noqa: F401
from pipeline.protocols.linear import protocols as _linear  # noqa: F401
from pipeline.protocols.neighbours import protocols as _neighbours  # noqa: F401
from pipeline.protocols.nets import protocols as _nets  # noqa: F401
from pipeline.protocols.registry import (
    EvalData, ImageData, Protocol, ProtocolResult, get_protocol, list_protocols, resolve_settings,
)

_LAZY = {
    "apply_temperature": "audits.calibration", "calibration_report": "audits.calibration",
    "expected_calibration_error": "audits.calibration", "fit_temperature": "audits.calibration",
    "FewShotResult": "episodic.fewshot", "fewshot_episodes": "episodic.fewshot",
    "EXPECTED_INVARIANCE": "audits.invariance", "MAPS": "audits.invariance", "invariance_audit": "audits.invariance",
    "KNNClassifier": "neighbours.knn", "knn_class_weights": "neighbours.knn", "topk_blocks": "neighbours.knn",
    "DEFAULT_CS": "linear.logistic", "LogisticProbe": "linear.logistic",
    "LowShotResult": "episodic.lowshot", "lowshot_curve": "episodic.lowshot", "relative_to_baseline": "episodic.lowshot",
    "DEFAULT_ALPHAS": "linear.ridge", "RidgeProbe": "linear.ridge",
    "L2Normalize": "transforms.transformers", "Standardize": "transforms.transformers",
    "Whiten": "transforms.transformers", "make_transform": "transforms.transformers", "FeatureRows": "blocks",
}

__all__ = sorted([*_LAZY, "EvalData", "ImageData", "Protocol", "ProtocolResult", "get_protocol", "list_protocols",
                  "resolve_settings"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"pipeline.protocols.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'pipeline.protocols' has no attribute {name!r}")
