"""The built-in probes trained by minibatches: ``mlp`` (pooled features) and ``attentive``
(token features), registered with their defaults, ranges and memory."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.cell import CellShape
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.inputs.parameters import GRID_MAX, OPTIMIZER_MAX, check_setting_grid
from pipeline.protocols.evidence import class_evidence
from pipeline.protocols.linear.protocols import logistic_terms
from pipeline.protocols.memory import (
    ADAMW_COPIES, BLOCK, F4, RUNTIME, features, indices, labels, matrix, parameters, peak, work,
)
from pipeline.protocols.metrics import accuracy_metrics
from pipeline.protocols.registry import (
    SEED, Bound, EvalData, ProtocolResult, get_protocol, register_protocol, resolve_settings,
)
from pipeline.protocols.transforms import TRANSFORM_NAMES, apply_transform

__all__ = ["attentive_memory", "mlp_memory"]

_EVAL_ELEMENTS = BLOCK // F4  # elements of one evaluation pass on the CPU (as in stacked_training)
_SIZES = {"batch_size": Bound(1, 1 << 20), "max_epochs": Bound(1, 10_000), "patience": Bound(1, 10_000),
          "val_fraction": Bound(0, 1, low_open=True, high_open=True), "seed": SEED}


def _check_mlp(s: Mapping[str, Any]) -> None:
    check_setting_grid(s["weight_decays"], "weight_decays", positive=False, high=OPTIMIZER_MAX)
    if s["linear_Cs"] != "default":
        check_setting_grid(s["linear_Cs"], "linear_Cs", positive=True)


def _check_attentive(s: Mapping[str, Any]) -> None:
    check_setting_grid(s["learning_rates"], "learning_rates", positive=True, high=OPTIMIZER_MAX)
    check_setting_grid(s["weight_decays"], "weight_decays", positive=False, high=OPTIMIZER_MAX)
    if len(s["learning_rates"]) * len(s["weight_decays"]) > GRID_MAX:
        raise ConfigError(f"learning_rates x weight_decays makes {len(s['learning_rates']) * len(s['weight_decays'])} "
                          f"grid points; at most {GRID_MAX}")


def _train_val(data: EvalData) -> tuple[list[np.ndarray], np.ndarray, np.ndarray | None]:
    """(train and validation arrays, their labels, the validation rows' mask or None)."""
    parts, labels = [data.train()], [np.asarray(data.y_train)]
    if data.X_val is None:
        return parts, labels[0], None
    parts.append(data.X_val)
    labels.append(np.asarray(data.y_val))
    mask = np.zeros(len(labels[0]) + len(labels[1]), dtype=bool)
    mask[len(labels[0]):] = True
    return parts, np.concatenate(labels), mask


def _without_nan(curves: np.ndarray) -> list[list[float | None]]:
    """Validation curves for the record: NaN (after a member stopped) becomes null."""
    return [[None if not math.isfinite(v) else float(v) for v in row] for row in np.asarray(curves)]


def _validation(data: EvalData, s: Mapping[str, Any]) -> str:
    return "dataset split" if data.X_val is not None else f"stratified {s['val_fraction']:g} of train"


# -- memory ------------------------------------------------------------------------------------
def _grid_training(c: CellShape, s: Mapping[str, Any], G: int, n_params: int, batch_elements: int,
                   row_activations: int) -> int:
    """A stacked grid of G small networks trained by AdamW: parameters and optimiser state,
    one minibatch's activations and gradients, one evaluation pass (rows sized as in
    stacked_training: its input and activations near ``_EVAL_ELEMENTS``), the row orders."""
    rows = c.n_train + c.n_val
    val_rows = c.n_val if c.n_val else int(math.ceil(float(s.get("val_fraction", 0.2)) * rows)) + 1
    per_row = max(c.n_tokens * c.dim, row_activations)
    eval_rows = min(val_rows, max(1, _EVAL_ELEMENTS // max(1, per_row)))
    return peak(parameters=parameters(G * n_params, ADAMW_COPIES),
                minibatch=work(batch_elements, copies=4),  # activations, their gradients, the gathered rows
                evaluation=matrix(eval_rows, c.n_tokens * c.dim + row_activations, copies=2, itemsize=F4),
                row_orders=indices(rows, arrays=4))


def mlp_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The MLP probe and the logistic probe it is compared with, one after the other, on the
    same features (never copied: batches are gathered and mapped one at a time)."""
    G, h, B = len(s.get("weight_decays") or [0]), int(s.get("hidden_units", 1000)), int(s.get("batch_size", 256))
    d, K = c.dim, c.n_classes
    batch = B * d + G * B * (2 * h + 2 * K)  # the input batch, hidden units and logits with gradients
    mlp = _grid_training(c, s, G, d * h + h + h * K + K, batch, G * (h + K))
    test = matrix(min(c.n_test, max(256, BLOCK // max(1, h * 4))), d + h + K, copies=2, itemsize=F4)  # prediction
    return peak(features=features(c, streams=False), labels=labels(c),
                # the logistic baseline, then the MLP: the larger of the two at a time
                training=max(logistic_terms(c, {"Cs": "default"}), mlp + test), runtime=RUNTIME)


def attentive_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The attentive probe on token features (n, T, d), every grid point trained at once."""
    G = len(s.get("learning_rates") or [0]) * len(s.get("weight_decays") or [0])
    H, B, T, d, K = int(s.get("num_heads", 8)), int(s.get("batch_size", 128)), c.n_tokens, c.dim, c.n_classes
    n_params = 4 * d * d + d * K + 8 * d + K
    batch = 2 * B * T * d + G * B * H * (2 * T + 2 * d) + G * B * (4 * d + 2 * K)
    train = _grid_training(c, s, G, n_params, batch, G * (H * (T + 2 * d) + 4 * d))
    test_rows = min(c.n_test, max(1, 2**22 // max(1, T * d)))
    return peak(features=features(c, streams=False), labels=labels(c), training=train,
                prediction=matrix(test_rows, T * d + H * (T + d) + K, copies=2, itemsize=F4), runtime=RUNTIME)


@register_protocol(
    "mlp", version=3,  # 2: linear_score from logistic 2; 3: from logistic 3
    defaults={"transform": "l2", "hidden_units": 1000, "weight_decays": [0.0, 1e-4, 1e-3, 1e-2, 1e-1],
              "learning_rate": 1e-3, "batch_size": 256, "max_epochs": 100, "patience": 10, "val_fraction": 0.2,
              "seed": 0, "linear_Cs": "default"},
    choices={"transform": TRANSFORM_NAMES},
    bounds={"hidden_units": Bound(1, 65_536), "learning_rate": Bound(0, OPTIMIZER_MAX, low_open=True), **_SIZES},
    check=_check_mlp, runs_on_device=True, memory=mlp_memory,
    metrics=("score", "top1", "mean_per_class", "linear_score", "gain_over_linear"), unbounded=("gain_over_linear",),
    description="one-hidden-layer ReLU probe, weight decay and epochs on validation; gain over logistic "
                "(Kolesnikov 2019)",
    cheap_settings={"hidden_units": 8, "learning_rate": 0.05, "max_epochs": 8,
                    "patience": 3, "weight_decays": [0.0, 0.01], "linear_Cs": [1.0]}, slow=True,
)
def _mlp(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch and scikit-learn load when a cell runs, not when the registry is read
    from pipeline.protocols.nets.mlp import MLPProbe
    from pipeline.protocols.nets.stacked_training import RowBatches

    device = resolve_device(s["device"])
    shared = {k: s[k] for k in ("transform", "val_fraction", "seed", "device")}
    linear_settings = resolve_settings("logistic", {**shared, "Cs": s["linear_Cs"]})
    linear = get_protocol("logistic").run(data, linear_settings)
    parts, y, val_mask = _train_val(data)
    test, = apply_transform(s["transform"], FeatureRows.of(parts[0]), FeatureRows.of(data.X_test), device=device)
    row_map = test.row_map  # fitted on train only; the training batches map their rows with it
    probe = MLPProbe(hidden_units=s["hidden_units"], weight_decays=s["weight_decays"],
                     learning_rate=s["learning_rate"], batch_size=s["batch_size"], max_epochs=s["max_epochs"],
                     patience=s["patience"], val_fraction=s["val_fraction"], random_state=s["seed"],
                     device=device).fit_batches(RowBatches(parts, row_map), y, val_mask)
    predicted = probe.predict_rows(test)
    metrics = accuracy_metrics(data.y_test, predicted, data.mean_per_class)
    metrics["linear_score"] = float(linear.metrics["score"])
    metrics["gain_over_linear"] = float(metrics["score"]) - metrics["linear_score"]
    within_budget = probe.n_epochs_ < s["max_epochs"]
    diagnostics = {
        "weight_decay": probe.weight_decay_, "n_epochs": probe.n_epochs_, "stopped_early": probe.stopped_early_,
        "weight_decays": [float(w) for w in probe.weight_decays_],
        "val_accuracy": [float(v) for v in probe.val_accuracy_], "val_loss": [float(v) for v in probe.val_loss_],
        "best_epochs": [int(e) for e in probe.best_epochs_], "val_curves": _without_nan(probe.val_curves_),
        "solver": probe.solver_, "validation": _validation(data, s), "n_val": probe.n_val_, "device": str(device),
        "mlp_converged": bool(within_budget),
        "linear": {"C": linear.diagnostics.get("C"), "converged": bool(linear.diagnostics.get("converged", True)),
                   "n_val": linear.diagnostics.get("n_val"),
                   "settings": dict(linear_settings)},
        "converged": bool(within_budget and linear.diagnostics.get("converged", True)),
    }
    return ProtocolResult(metrics, diagnostics, evidence=class_evidence(data, predicted))


@register_protocol(
    "attentive", version=1,
    defaults={"num_heads": 8, "learning_rates": [1e-4, 1e-3, 1e-2], "weight_decays": [1e-3, 1e-2, 1e-1],
              "batch_size": 128, "max_epochs": 50, "patience": 5, "val_fraction": 0.2, "seed": 0},
    bounds={"num_heads": Bound(1, 4096), **_SIZES},
    check=_check_attentive, runs_on_device=True, memory=attentive_memory, tokens=True,
    metrics=("score", "top1", "mean_per_class"),
    description="one learned query cross-attends to the token features, layer norm, linear classifier",
    cheap_settings={"num_heads": 1, "max_epochs": 8, "patience": 3, "learning_rates": [0.05], "weight_decays": [0.0]},
    slow=True,
)
def _attentive(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch and scikit-learn load when a cell runs, not when the registry is read
    from pipeline.protocols.nets.attentive import AttentiveProbe
    from pipeline.protocols.nets.stacked_training import RowBatches

    device = resolve_device(s["device"])
    parts, y, val_mask = _train_val(data)
    probe = AttentiveProbe(num_heads=s["num_heads"], learning_rates=s["learning_rates"],
                           weight_decays=s["weight_decays"], batch_size=s["batch_size"], max_epochs=s["max_epochs"],
                           patience=s["patience"], val_fraction=s["val_fraction"], random_state=s["seed"],
                           device=device).fit_batches(RowBatches(parts), y, val_mask)
    predicted = probe.predict(data.X_test)
    metrics = accuracy_metrics(data.y_test, predicted, data.mean_per_class)
    within_budget = probe.n_epochs_ < s["max_epochs"]
    diagnostics = {
        "learning_rate": probe.learning_rate_, "weight_decay": probe.weight_decay_, "n_epochs": probe.n_epochs_,
        "stopped_early": probe.stopped_early_, "grid": [[float(a), float(b)] for a, b in probe.grid_],
        "val_accuracy": [float(v) for v in probe.val_accuracy_], "val_loss": [float(v) for v in probe.val_loss_],
        "best_epochs": [int(e) for e in probe.best_epochs_], "val_curves": _without_nan(probe.val_curves_),
        "solver": probe.solver_, "validation": _validation(data, s), "n_val": probe.n_val_, "device": str(device),
        "n_tokens": int(np.shape(data.X_test)[1]), "converged": bool(within_budget),
    }
    return ProtocolResult(metrics, diagnostics, evidence=class_evidence(data, predicted))
