"""Readout protocols: scikit-learn-compatible estimators and pure functions, by name."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
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



def _import_entry_modules() -> None:
    """Import each family module that registers an entry itself: found by the decorator in
    its source, so a new readout needs no import line anywhere (reading the files costs ~1 ms)."""
    for path in sorted(Path(__file__).parent.glob("*/*.py")):
        name = f"{__name__}.{path.parent.name}.{path.stem}"
        if path.stem not in ("__init__", "protocols") and name not in sys.modules \
                and b"@register_protocol(" in path.read_bytes():
            importlib.import_module(name)


_import_entry_modules()

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
