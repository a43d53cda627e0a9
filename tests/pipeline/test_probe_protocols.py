"""The registered ``mlp`` and ``attentive`` protocols: each is its estimator run directly
on the same (preprocessed, concatenated) arrays, and the MLP's gain over the linear probe
is the logistic protocol's score on the same features."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.protocols.registry import EvalData, get_protocol, resolve_settings

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")]

MLP = {"hidden_units": 16, "max_epochs": 12, "patience": 4, "weight_decays": [0.0, 0.1], "learning_rate": 0.01,
       "linear_Cs": [0.1, 1.0, 10.0], "device": "cpu"}
ATTENTIVE = {"num_heads": 2, "max_epochs": 10, "patience": 3, "learning_rates": [0.003, 0.03],
             "weight_decays": [0.0, 0.1], "device": "cpu"}


def _blobs(n: int, seed: int, d: int = 12, K: int = 3, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    centres = np.random.default_rng(99).normal(size=(K, d)) * 1.5
    rng = np.random.default_rng(seed)
    y = np.arange(n) % K
    return (centres[y] + rng.normal(size=(n, d))).astype(dtype), y


def _tokens(n: int, seed: int, T: int = 5, d: int = 8, K: int = 3) -> tuple[np.ndarray, np.ndarray]:
    centres = np.random.default_rng(7).normal(size=(K, d)) * 2
    rng = np.random.default_rng(seed)
    y = np.arange(n) % K
    X = rng.normal(size=(n, T, d))
    X[:, 1] += centres[y]
    return X.astype(np.float16), y


def _l2(X: np.ndarray) -> np.ndarray:
    from pipeline.protocols.transforms.transformers import L2Normalize

    return L2Normalize().fit(X).transform(X.astype(np.float32))


@pytest.mark.parametrize("with_val", [False, True])
def test_mlp_protocol_is_the_probe_on_the_preprocessed_features(with_val):
    from pipeline.protocols.nets.mlp import MLPProbe

    X, y = _blobs(240, 0)
    X_te, y_te = _blobs(90, 1)
    X_val, y_val = _blobs(60, 2) if with_val else (None, None)
    data = EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=3, X_train=X, X_val=X_val, y_val=y_val)
    result = get_protocol("mlp")(data, MLP)

    # the direct computation: each row scaled to unit norm, splits concatenated
    X_all = np.concatenate([X, X_val]) if with_val else X
    y_all = np.concatenate([y, y_val]) if with_val else y
    val_mask = np.arange(len(y_all)) >= len(y) if with_val else None
    settings = {k: v for k, v in MLP.items() if k not in ("linear_Cs", "device")}
    probe = MLPProbe(**{k.replace("seed", "random_state"): v for k, v in settings.items()}, device="cpu")
    probe.fit(_l2(X_all), y_all, val_mask=val_mask)
    expected = float(np.mean(probe.predict(_l2(X_te)) == y_te))
    assert result.metrics["score"] == pytest.approx(expected, abs=1e-12)
    assert result.diagnostics["weight_decay"] == probe.weight_decay_
    assert result.diagnostics["n_epochs"] == probe.n_epochs_
    assert result.diagnostics["val_accuracy"] == pytest.approx(list(probe.val_accuracy_), abs=1e-12)
    assert result.diagnostics["validation"] == ("dataset split" if with_val else "stratified 0.2 of train")

    # the gain over the logistic protocol on the same features, transform, split and seed
    linear = get_protocol("logistic")(data, {"transform": "l2", "Cs": MLP["linear_Cs"], "device": "cpu"})
    assert result.metrics["linear_score"] == linear.metrics["score"]
    assert result.metrics["gain_over_linear"] == pytest.approx(result.metrics["score"] - linear.metrics["score"])
    assert result.diagnostics["linear"]["C"] == linear.diagnostics["C"]
    assert result.metrics["score"] > 0.8 and result.metrics["linear_score"] > 0.8
    # the evidence a comparison pairs: the very predictions scored
    np.testing.assert_array_equal(result.evidence.values, probe.predict(_l2(X_te)))
    assert result.evidence.kind == "predictions" and result.evidence.values.dtype == np.int16


def test_mlp_on_float16_features_is_the_float32_run_of_the_same_values():
    X, y = _blobs(150, 0, dtype=np.float16)
    X_te, y_te = _blobs(60, 1, dtype=np.float16)
    half = EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=3, X_train=X)
    single = EvalData(y_train=y, X_test=X_te.astype(np.float32), y_test=y_te, n_classes=3,
                      X_train=X.astype(np.float32))
    a, b = get_protocol("mlp")(half, MLP), get_protocol("mlp")(single, MLP)
    assert a.metrics == b.metrics
    assert a.diagnostics["val_loss"] == b.diagnostics["val_loss"]


def test_attentive_protocol_is_the_probe_on_the_concatenated_tokens():
    from pipeline.protocols.nets.attentive import AttentiveProbe

    X, y = _tokens(180, 0)
    X_val, y_val = _tokens(60, 1)
    X_te, y_te = _tokens(90, 2)
    data = EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=3, X_train=X, X_val=X_val, y_val=y_val)
    result = get_protocol("attentive")(data, ATTENTIVE)
    probe = AttentiveProbe(**{k: v for k, v in ATTENTIVE.items() if k != "device"}, device="cpu")
    probe.fit(np.concatenate([X, X_val]), np.concatenate([y, y_val]), val_mask=np.arange(240) >= 180)
    assert result.metrics["score"] == pytest.approx(float(np.mean(probe.predict(X_te) == y_te)), abs=1e-12)
    assert (result.diagnostics["learning_rate"], result.diagnostics["weight_decay"]) == (
        probe.learning_rate_, probe.weight_decay_)
    assert result.diagnostics["n_tokens"] == 5 and result.metrics["score"] > 0.9
    np.testing.assert_array_equal(result.evidence.values, probe.predict(X_te))


@pytest.mark.parametrize("name, settings, message", [
    ("mlp", {"weight_decays": []}, "weight_decays=.* must be a list of 1 to 64 finite numbers >= 0"),
    ("mlp", {"weight_decays": [0.1, -1.0]}, "weight_decays"),
    ("mlp", {"weight_decays": "default"}, "weight_decays='default' must be a list"),
    ("mlp", {"linear_Cs": [0.0]}, r"linear_Cs=\[0.0\] must be a list of 1 to 64 finite numbers > 0"),
    ("mlp", {"hidden_units": 0}, "hidden_units: 0 is out of range"),
    ("mlp", {"max_epochs": 10**6}, "max_epochs: 1000000 is out of range"),
    ("attentive", {"learning_rates": [0.0]}, "learning_rates"),
    ("attentive", {"learning_rates": [1e-3] * 10, "weight_decays": [0.1] * 10}, "100 grid points; at most 64"),
    ("attentive", {"device": "gpu"}, "device='gpu' is not a device"),
])
def test_bad_settings_are_refused_at_load(name, settings, message):
    with pytest.raises(ConfigError, match=message):
        resolve_settings(name, settings)
