"""MLPProbe: accuracy against the logistic probe, non-linear gain, determinism, selection."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.linear.logistic import LogisticProbe
from pipeline.protocols.nets.mlp import DEFAULT_MLP_WEIGHT_DECAYS, MLPProbe
from pipeline.protocols.nets.stacked_training import train_fixed, train_grid

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(hidden_units=32, learning_rate=1e-2, batch_size=32, max_epochs=40, patience=5, device="cpu")


def _separable(n, seed, d=10, k=4):
    """Gaussian classes around well-separated centres (margin far above the noise)."""
    centres = np.random.default_rng(99).standard_normal((k, d)) * 6.0
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    return centres[y] + 0.5 * rng.standard_normal((n, d)), y


def _xor(n, seed, noise_dims=6):
    """The class is the XOR of two signs: no linear model beats chance."""
    rng = np.random.default_rng(seed)
    Z = rng.uniform(-1, 1, (n, 2))
    y = ((Z[:, 0] > 0) ^ (Z[:, 1] > 0)).astype(int)
    return np.hstack([Z, 0.1 * rng.standard_normal((n, noise_dims))]), y


def _params(probe):
    return probe.coefs_ + probe.intercepts_


def test_matches_logistic_on_linearly_separable_data():
    X, y = _separable(400, 0)
    X_te, y_te = _separable(400, 1)
    linear = (LogisticProbe(Cs="default").fit(X, y).predict(X_te) == y_te).mean()
    mlp = (MLPProbe(**SMALL).fit(X, y).predict(X_te) == y_te).mean()
    assert linear == 1.0
    assert mlp == linear


def test_beats_linear_probe_on_xor():
    X, y = _xor(600, 0)
    X_te, y_te = _xor(400, 1)
    linear = (LogisticProbe(Cs="default").fit(X, y).predict(X_te) == y_te).mean()
    mlp = (MLPProbe(**SMALL).fit(X, y).predict(X_te) == y_te).mean()
    assert linear < 0.65
    assert mlp > 0.9
    assert mlp - linear > 0.3


def test_bitwise_repeatable_on_cpu_and_seed_dependent():
    X, y = _xor(300, 0)
    a, b = MLPProbe(**SMALL).fit(X, y), MLPProbe(**SMALL).fit(X, y)
    for p, q in zip(_params(a), _params(b)):
        assert p.dtype == np.float32
        np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(a.val_curves_, b.val_curves_)
    c = MLPProbe(**{**SMALL, "random_state": 1}).fit(X, y)
    assert not np.array_equal(a.coefs_[0], c.coefs_[0])


def test_selection_and_early_stopping_are_recorded():
    X, y = _xor(400, 0)
    wds = (0.0, 1e-2, 1.0)
    probe = MLPProbe(**{**SMALL, "weight_decays": wds, "max_epochs": 60, "patience": 3}).fit(X, y)
    np.testing.assert_array_equal(probe.weight_decays_, wds)
    G, E = probe.val_curves_.shape
    assert G == 3 and 1 <= E <= 60
    for g in range(G):
        curve = probe.val_curves_[g]
        seen = curve[~np.isnan(curve)]
        assert seen.size == np.flatnonzero(~np.isnan(curve)).max() + 1  # NaN only after the stop
        assert probe.val_accuracy_[g] == seen.max()
        assert curve[probe.best_epochs_[g] - 1] == probe.val_accuracy_[g]
    best = int(np.argmax(probe.weight_decays_ == probe.weight_decay_))
    assert probe.val_accuracy_[best] == probe.val_accuracy_.max()
    assert probe.n_epochs_ == probe.best_epochs_[best]
    assert probe.stopped_early_  # patience 3 runs out well before 60 epochs here
    assert probe.solver_ == "adamw" and probe.device_ == "cpu"


def test_refit_is_train_plus_validation_for_the_selected_epochs():
    X, y = _xor(300, 0)
    val_mask = np.zeros(300, bool)
    val_mask[::4] = True
    probe = MLPProbe(**SMALL).fit(X, y, val_mask=val_mask)
    d, K = X.shape[1], 2
    from pipeline.protocols.nets.mlp import StackedMLP

    def make(G, generator):
        return StackedMLP(G, d, SMALL["hidden_units"], K, generator, torch.device("cpu"))

    Xt, yt = torch.from_numpy(X), torch.from_numpy(y.astype(np.int64))
    lrs = np.full(len(DEFAULT_MLP_WEIGHT_DECAYS), SMALL["learning_rate"])
    record = train_grid(make, Xt, yt, np.flatnonzero(~val_mask), np.flatnonzero(val_mask), lrs,
                        np.array(DEFAULT_MLP_WEIGHT_DECAYS), SMALL["batch_size"], SMALL["max_epochs"],
                        SMALL["patience"], 0, torch.device("cpu"))
    np.testing.assert_array_equal(record.val_accuracy, probe.val_curves_)
    refit = train_fixed(make, Xt, yt, np.arange(300), SMALL["learning_rate"], probe.weight_decay_,
                        SMALL["batch_size"], probe.n_epochs_, 0, torch.device("cpu"))
    np.testing.assert_array_equal(refit.params["W1"].detach()[0].numpy(), probe.coefs_[0])


def test_any_hashable_labels():
    X, y = _separable(200, 0, k=3)
    names = np.array(["cat", "dog", "eel"])[y]
    probe = MLPProbe(**SMALL).fit(X, names)
    assert list(probe.classes_) == ["cat", "dog", "eel"]
    assert set(probe.predict(X)) <= {"cat", "dog", "eel"}
    np.testing.assert_allclose(probe.predict_proba(X).sum(axis=1), 1.0)
    assert probe.decision_function(X).shape == (200, 3)


def test_warns_when_still_improving_at_the_epoch_budget():
    X, y = _separable(200, 0)
    with pytest.warns(ConvergenceWarning, match="max_epochs=2"):
        probe = MLPProbe(**{**SMALL, "max_epochs": 2, "learning_rate": 1e-4}).fit(X, y)
    assert probe.n_epochs_ == 2 and not probe.stopped_early_


@pytest.mark.parametrize("params, match", [
    ({"weight_decays": (0.1, -1.0)}, "weight_decays"),
    ({"weight_decays": ()}, "weight_decays"),
    ({"hidden_units": 0}, "hidden_units"),
    ({"learning_rate": float("nan")}, "learning_rate"),
    ({"val_fraction": 1.0}, "val_fraction"),
    ({"random_state": -1}, "random_state"),
    ({"device": "tpu"}, "tpu"),
])
def test_bad_settings_fail_before_work(params, match):
    X, y = _separable(40, 0)
    with pytest.raises(ConfigError, match=match):
        MLPProbe(**{**SMALL, **params}).fit(X, y)


def test_bad_data_is_refused():
    X, y = _separable(40, 0)
    X_nan = X.copy()
    X_nan[3, 2] = np.nan
    with pytest.raises(DataValidationError, match="NaN"):
        MLPProbe(**SMALL).fit(X_nan, y)
    with pytest.raises(DataValidationError, match="at least 2 classes"):
        MLPProbe(**SMALL).fit(X, np.zeros(40))
    with pytest.raises(DataValidationError, match="continuous"):
        MLPProbe(**SMALL).fit(X, np.linspace(0, 1, 40))
    with pytest.raises(DataValidationError, match="val_mask"):
        MLPProbe(**SMALL).fit(X, y, val_mask=np.ones(40, bool))
    probe = MLPProbe(**SMALL).fit(X, y)
    with pytest.raises(DataValidationError, match="10 features"):
        probe.predict(X[:, :5])


def test_cuda_request_without_cuda_is_a_config_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    X, y = _separable(40, 0)
    with pytest.raises(ConfigError, match="CUDA"):
        MLPProbe(**{**SMALL, "device": "cuda:0"}).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert MLPProbe(**{**SMALL, "device": "auto"}).fit(X, y).device_ == "cpu"
