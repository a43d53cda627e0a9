"""LogisticProbe: sklearn's objective and optimum, convergence reporting, C selection."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedShuffleSplit

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.linear.logistic import DEFAULT_CS, LogisticProbe
from tests.helpers.protocols import log_loss_choice, seed_walk_choice


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _data(n=400, d=12, k=4, seed=0, spread=0.8):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, d)) * spread
    y = np.arange(n) % k
    rng.shuffle(y)
    return centres[y] + rng.standard_normal((n, d)), y


def _gradient(X, y, coef, intercept, C):
    """Gradient of mean CE + ||W||^2 / (2 C n), written out in numpy (float64)."""
    n = X.shape[0]
    Z = X @ coef.T + intercept
    P = np.exp(Z - Z.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    P[np.arange(n), y] -= 1.0
    return np.hstack([P.T @ X / n + coef / (C * n), P.sum(axis=0)[:, None] / n])


def test_default_cs_grid():
    assert DEFAULT_CS.shape == (45,)
    lam = np.sort(1.0 / DEFAULT_CS)
    np.testing.assert_allclose(lam[[0, -1]], [1e-6, 1e5])
    np.testing.assert_allclose(np.diff(np.log10(lam)), 11 / 44)


@pytest.mark.parametrize("C", [0.01, 1.0, 100.0])
def test_matches_sklearn_multinomial(C):
    X, y = _data()
    ours = LogisticProbe(C=C, tol=1e-10).fit(X, y)
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=10_000).fit(X, y)
    assert ours.converged_
    # our optimum is at least as tight as asked, checked independently in float64
    assert np.abs(_gradient(X, y, ours.coef_, ours.intercept_, C)).max() <= 1e-10
    # sklearn stops on its ftol (relative decrease 64 eps) near 1e-7: compare at that level
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=5e-6 * max(1.0, np.abs(ref.coef_).max()))
    np.testing.assert_allclose(
        ours.intercept_ - ours.intercept_.mean(), ref.intercept_ - ref.intercept_.mean(), atol=5e-5
    )
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-6)


def test_default_tolerance_is_sklearns_criterion():
    X, y = _data(seed=3)
    ours = LogisticProbe(C=0.5).fit(X, y)  # tol = 1e-4, as sklearn
    assert ours.converged_
    assert np.abs(_gradient(X, y, ours.coef_, ours.intercept_, 0.5)).max() <= 1e-4
    ref = LogisticRegression(C=0.5).fit(X, y)
    assert (ours.predict(X) == ref.predict(X)).mean() >= 0.99


def test_binary_is_sklearn_binomial_at_twice_c():
    X, y = _data(k=2)
    ours = LogisticProbe(C=0.3, tol=1e-10).fit(X, y)
    ref = LogisticRegression(C=0.6, tol=1e-10, max_iter=10_000).fit(X, y)
    dec = ours.decision_function(X)
    assert dec.shape == (X.shape[0],)
    np.testing.assert_allclose(dec, ref.decision_function(X), atol=1e-5)
    np.testing.assert_allclose(ours.predict_proba(X)[:, 1], 1 / (1 + np.exp(-dec)), rtol=1e-12)
    np.testing.assert_array_equal(ours.predict(X), (dec > 0).astype(int))


def test_float32_input_reaches_float64_tolerance():
    X, y = _data(seed=4)
    ours = LogisticProbe(C=1.0, tol=1e-8).fit(X.astype(np.float32), y)
    assert ours.converged_ and ours.coef_.dtype == np.float64
    X32 = X.astype(np.float32).astype(np.float64)
    assert np.abs(_gradient(X32, y, ours.coef_, ours.intercept_, 1.0)).max() <= 1e-8


def test_iteration_limit_is_reported_not_hidden():
    X, y = _data(seed=1)
    X = X * 10.0 ** np.linspace(-2, 3, X.shape[1])  # badly scaled features
    with pytest.warns(ConvergenceWarning, match=r"stopped before max\|grad\| <= tol.*max_iter"):
        probe = LogisticProbe(C=1.0, max_iter=3).fit(X, y)
    assert probe.converged_ is False
    assert probe.n_iter_[0] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        assert LogisticProbe(C=1.0).fit(*_data(seed=1)).converged_ is True


def test_grid_selects_on_validation_split_then_refits_on_all_train():
    X, y = _data(n=300, d=10, k=3, seed=2, spread=0.5)
    Cs = np.logspace(-4, 2, 7)
    probe = LogisticProbe(Cs=Cs, val_fraction=0.25, random_state=7, tol=1e-8).fit(X, y)
    np.testing.assert_allclose(probe.Cs_, Cs)
    assert probe.val_scores_.shape == (7,) and probe.grid_n_iter_.shape == (7,)
    # the strongest penalty within one standard error of the best, among the exact fits
    assert probe.selection_moves_ == []
    assert probe.C_ == Cs[log_loss_choice(probe.refined_, probe.val_log_loss_, probe.n_val_)]
    assert probe.C_ in probe.selection_set_ and probe.refined_[list(Cs).index(probe.C_)]
    # each validation score is that of a cold fit on the train part, scored on the val part:
    # exactly where the fit was taken to its optimum (its log-loss too), within a row or so on the path
    tr, va = next(StratifiedShuffleSplit(1, test_size=0.25, random_state=7).split(X, y))
    for j, (C, score, exact) in enumerate(zip(Cs, probe.val_scores_, probe.refined_)):
        cold = LogisticProbe(C=C, tol=1e-10).fit(X[tr], y[tr])
        assert score == pytest.approx((cold.predict(X[va]) == y[va]).mean(), abs=0 if exact else 1.5 / len(va))
        if exact:
            losses = -np.log(cold.predict_proba(X[va])[np.arange(len(va)), y[va]])
            assert probe.val_log_loss_[j] == pytest.approx(losses.mean(), rel=1e-6)
            assert probe.val_log_loss_se_[j] == pytest.approx(losses.std(ddof=1) / np.sqrt(len(va)), rel=1e-4)
    # the final model is the C_ fit on all of the train data
    refit = LogisticProbe(C=probe.C_, tol=1e-10).fit(X, y)
    np.testing.assert_allclose(probe.coef_, refit.coef_, atol=1e-5)
    assert probe.converged_


def test_grid_validation_depends_on_seed_only():
    X, y = _data(n=200, d=6, k=3, seed=5, spread=0.4)
    a = LogisticProbe(Cs=[0.01, 1.0], random_state=1).fit(X, y)
    b = LogisticProbe(Cs=[0.01, 1.0], random_state=1).fit(X, y)
    np.testing.assert_array_equal(a.val_scores_, b.val_scores_)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_default_grid_runs_and_a_plateau_gives_its_strongest_penalty():
    X, y = _data(n=200, d=5, k=3, seed=6, spread=2.0)  # easy: accuracy plateaus
    probe = LogisticProbe(Cs="default").fit(X, y)
    assert probe.val_scores_.shape == (45,)
    chosen = log_loss_choice(probe.refined_, probe.val_log_loss_, probe.n_val_)
    assert probe.C_ == probe.Cs_[chosen] and probe.converged_
    best = probe.val_scores_[probe.refined_].max()
    assert probe.val_scores_[chosen] >= best - np.sqrt(best * (1 - best) / probe.n_val_) - 1e-12
    assert np.all(np.isin(probe.selection_set_, probe.Cs_[probe.refined_])) and probe.selection_set_.size >= 3


def test_the_seed_selection_is_ericssons_walk():
    X, y = _data(n=200, d=5, k=3, seed=6, spread=2.0)
    probe = LogisticProbe(Cs="default", selection="seed").fit(X, y)
    chosen = seed_walk_choice(probe.val_scores_)
    assert probe.C_ == probe.Cs_[chosen] and probe.val_scores_[chosen] == probe.val_scores_.max()
    # on the plateau the walk from the weakest penalty keeps its first value: the weakest tied
    assert chosen == np.flatnonzero(probe.val_scores_ == probe.val_scores_.max())[-1]
    assert not probe.refined_.any() and probe.selection_alternatives_ == []
    with pytest.raises(ConfigError, match="selection must be one of stable, seed"):
        LogisticProbe(Cs=[1.0, 2.0], selection="argmax").fit(X, y)


def test_labels_are_mapped():
    X, y = _data(k=3)
    probe = LogisticProbe().fit(X, y * 7 - 2)
    np.testing.assert_array_equal(probe.classes_, [-2, 5, 12])
    assert set(np.unique(probe.predict(X))) <= {-2, 5, 12}


def test_bad_input_errors():
    X, y = _data(n=60)
    X_bad = X.copy()
    X_bad[10, 3] = np.inf
    with pytest.raises(DataValidationError, match=r"0 NaN and 1 inf .*\(10, 3\)"):
        LogisticProbe().fit(X_bad, y)
    with pytest.raises(ValueError, match="59 labels, but X has 60 samples"):
        LogisticProbe().fit(X, y[1:])
    with pytest.raises(ValueError, match="1 class"):
        LogisticProbe().fit(X, np.ones(60))
    with pytest.raises(ValueError, match="Unknown label type"):
        LogisticProbe().fit(X, np.linspace(0, 1, 60))
    probe = LogisticProbe().fit(X, y)
    with pytest.raises(ValueError, match="X has 11 features, but LogisticProbe is expecting 12 features"):
        probe.predict_proba(X[:, :11])
    y_rare = y.copy()
    y_rare[0] = 9  # a class with one sample cannot be stratified
    rare = r"stratified 0.2 validation split .*\(smallest class: 1 samples\)"
    with pytest.raises(DataValidationError, match=rare):
        LogisticProbe(Cs=[1.0, 10.0]).fit(X, y_rare)
    with pytest.raises(ConfigError, match="Cs must be"):
        LogisticProbe(Cs=[1.0, -1.0]).fit(X, y)
    with pytest.raises(ConfigError, match="not a torch device"):
        LogisticProbe(device="tpu:9").fit(X, y)


def test_explicit_cpu_device():
    X, y = _data(n=80)
    a = LogisticProbe(device="cpu", tol=1e-8).fit(X, y)
    b = LogisticProbe(device=torch.device("cpu"), tol=1e-8).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    X, y = _data()
    cpu = LogisticProbe(Cs=[0.1, 1.0], tol=1e-8).fit(X, y)
    gpu = LogisticProbe(Cs=[0.1, 1.0], tol=1e-8, device="cuda").fit(X, y)
    assert gpu.C_ == cpu.C_
    np.testing.assert_allclose(gpu.coef_, cpu.coef_, atol=1e-6)


def test_dataset_validation_split_selects_c_then_refits_on_both():
    X, y = _data(n=400, seed=3)
    mask = np.zeros(len(y), bool)
    mask[::4] = True  # a fixed, dataset-defined validation split
    Cs = [1e-3, 1e-2, 1e-1, 1.0, 10.0]
    probe = LogisticProbe(Cs=Cs, tol=1e-8).fit(X, y, val_mask=mask)
    # the same selection by hand: fit each C on the train rows, score on the val rows
    scores = [np.mean(LogisticProbe(C=C, tol=1e-8).fit(X[~mask], y[~mask]).predict(X[mask]) == y[mask])
              for C in Cs]
    np.testing.assert_allclose(probe.val_scores_[probe.refined_], np.array(scores)[probe.refined_])
    best = log_loss_choice(probe.refined_, probe.val_log_loss_, int(mask.sum()))
    assert probe.C_ == Cs[best]
    refit = LogisticProbe(C=Cs[best], tol=1e-8).fit(X, y)
    np.testing.assert_allclose(probe.coef_, refit.coef_, atol=1e-5)


def test_bad_validation_mask_is_refused():
    X, y = _data(n=40)
    with pytest.raises(ValueError, match="boolean array of shape"):
        LogisticProbe(Cs=[1.0]).fit(X, y, val_mask=np.zeros(39, bool))
    with pytest.raises(ValueError, match="both splits need rows"):
        LogisticProbe(Cs=[1.0]).fit(X, y, val_mask=np.zeros(40, bool))


def test_string_labels_are_kept_as_given():
    X, y = _data(k=3)
    names = np.array(["ant", "bee", "cow"])[y]
    probe = LogisticProbe(C=0.5, tol=1e-8).fit(X, names)
    np.testing.assert_array_equal(probe.classes_, ["ant", "bee", "cow"])
    by_index = LogisticProbe(C=0.5, tol=1e-8).fit(X, y)
    np.testing.assert_array_equal(probe.predict(X), np.array(["ant", "bee", "cow"])[by_index.predict(X)])
    np.testing.assert_allclose(probe.coef_, by_index.coef_, rtol=1e-12)


def test_float16_features_are_used_without_a_float32_copy():
    X, y = _data(seed=7)
    X16 = X.astype(np.float16)
    half = LogisticProbe(C=1.0, tol=1e-8).fit(X16, y)
    ref = LogisticProbe(C=1.0, tol=1e-8).fit(X16.astype(np.float64), y)
    np.testing.assert_allclose(half.coef_, ref.coef_, atol=1e-7)
    assert np.abs(_gradient(X16.astype(np.float64), y, half.coef_, half.intercept_, 1.0)).max() <= 1e-8


def test_split_is_exposed_and_is_the_stratified_draw():
    X, y = _data(n=300, k=3, seed=8)
    probe = LogisticProbe(Cs=[0.1, 1.0], val_fraction=0.25, random_state=3).fit(X, y)
    tr, va = next(StratifiedShuffleSplit(1, test_size=0.25, random_state=3).split(X, y))
    np.testing.assert_array_equal(probe.train_index_, np.sort(tr))
    np.testing.assert_array_equal(probe.val_index_, np.sort(va))
    assert LogisticProbe(C=1.0).fit(X, y).val_index_ is None


def test_multilabel_is_one_binary_logistic_regression_per_class():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 5))
    Y = (X[:, :3] @ rng.standard_normal((3, 3)) + 0.7 * rng.standard_normal((300, 3)) > 0).astype(np.uint8)
    probe = LogisticProbe(C=0.3, tol=1e-10).fit(X, Y)
    assert probe.multilabel_ and probe.converged_
    for k in range(3):
        ref = LogisticRegression(C=0.3, tol=1e-10, max_iter=10_000).fit(X, Y[:, k])
        np.testing.assert_allclose(probe.coef_[k], ref.coef_[0], atol=1e-6)
        np.testing.assert_allclose(probe.intercept_[k], ref.intercept_[0], atol=1e-6)
        np.testing.assert_allclose(probe.predict_proba(X)[:, k], ref.predict_proba(X)[:, 1], atol=1e-7)
    assert probe.predict(X).shape == (300, 3)
    grid = LogisticProbe(Cs=[0.01, 1.0], random_state=0).fit(X, Y)  # selected by validation mAP
    assert grid.val_scores_.shape == (2,) and 0.5 < grid.val_scores_.max() <= 1.0


def test_fit_rows_on_a_subset_equals_fit_on_its_copy():
    from pipeline.protocols.blocks import FeatureRows

    X, y = _data(n=200, seed=9)
    keep = np.sort(np.random.default_rng(0).choice(200, 120, replace=False))
    rows = FeatureRows.of(X).select(keep)
    a = LogisticProbe(C=2.0, tol=1e-9).fit_rows(rows, y[keep])
    b = LogisticProbe(C=2.0, tol=1e-9).fit(X[keep], y[keep])
    np.testing.assert_allclose(a.coef_, b.coef_, atol=1e-9)
    np.testing.assert_array_equal(a.predict_rows(FeatureRows.of(X)), b.predict(X))


def test_device_auto_resolves_and_is_recorded():
    X, y = _data(n=80)
    probe = LogisticProbe(device="auto").fit(X, y)
    assert probe.device_ == ("cuda:0" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="only CPU and CUDA devices"):
        LogisticProbe(device="meta").fit(X, y)


def _ulps_away(X: np.ndarray, ulps: int, seed: int) -> np.ndarray:
    """``X`` (float32) with every nonzero value moved by -ulps..ulps float32 steps."""
    bits = X.astype(np.float32).view(np.int32).copy()
    bits += np.random.default_rng(seed).integers(-ulps, ulps + 1, size=bits.shape, dtype=np.int32) * (bits != 0)
    return bits.view(np.float32)


def test_a_refit_taken_to_its_optimum_ends_the_same_from_features_a_few_ulps_away():
    # separable rows and a weak chosen penalty: the flat loss where the refit's end point
    # follows the path (another machine's kernels round the features otherwise)
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(4, 256))

    def rows(per_class: int, noise: float) -> np.ndarray:
        X = np.abs(centres[np.repeat(np.arange(4), per_class)] + noise * rng.normal(size=(4 * per_class, 256)))
        return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)

    X, y, X_test, y_test = rows(40, 0.6), np.repeat(np.arange(4), 40), rows(50, 1.6), np.repeat(np.arange(4), 50)
    fits = [LogisticProbe(C=1000.0, refine_rtol=1e-9).fit(features, y)  # a weak penalty
            for features in (X, _ulps_away(X, 4, 0), _ulps_away(X, 4, 1))]
    predicted = fits[0].predict(X_test)
    assert 0.5 < (predicted == y_test).mean() < 1.0  # test rows near the boundaries too
    for other in fits[1:]:
        np.testing.assert_array_equal(other.predict(X_test), predicted)
        np.testing.assert_allclose(other.coef_, fits[0].coef_, rtol=0, atol=1e-4 * np.abs(fits[0].coef_).max())
    # ... and it is the optimum: scikit-learn at a far tighter tolerance of its own agrees
    ref = LogisticRegression(C=fits[0].C_, tol=1e-12, max_iter=100_000).fit(X.astype(np.float64), y)
    np.testing.assert_allclose(fits[0].coef_, ref.coef_, rtol=0, atol=1e-3 * np.abs(ref.coef_).max())


def test_the_registry_default_refine_rtol_is_the_solvers():
    from pipeline.protocols.linear.logistic_checks import F_RTOL
    from pipeline.protocols.linear.protocols import REFINE_RTOL

    assert REFINE_RTOL == F_RTOL == LogisticProbe().refine_rtol
    with pytest.raises(ConfigError, match="refine_rtol"):
        LogisticProbe(refine_rtol=0.0).fit(np.eye(4, dtype=np.float32), [0, 1, 0, 1])


def test_the_default_selection_chooses_the_same_c_from_features_a_few_ulps_away():
    # the validation curve of warm-started fits stopped at tol follows the path on a flat
    # loss; the stable selection decides on fits taken to their optimum, by their continuous
    # log-loss, and measures how far it is from moving
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(4, 256))
    y = np.repeat(np.arange(4), 40)
    X = np.abs(centres[y] + 1.0 * rng.normal(size=(160, 256))).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    X_test = np.abs(centres[np.repeat(np.arange(4), 50)] + 1.0 * rng.normal(size=(200, 256))).astype(np.float32)
    X_test /= np.linalg.norm(X_test, axis=1, keepdims=True)
    copies = (X, _ulps_away(X, 4, 0), _ulps_away(X, 4, 1))
    # (with the seed's rule, here, the three copies chose different C values)
    fits = [LogisticProbe(Cs="default").fit(features, y) for features in copies]
    assert len({fit.C_ for fit in fits}) == 1
    predicted = fits[0].predict(X_test)
    for other in fits[1:]:
        both = other.refined_ & fits[0].refined_
        assert both[list(fits[0].Cs_).index(fits[0].C_)]
        np.testing.assert_array_equal(other.val_scores_[both], fits[0].val_scores_[both])
        np.testing.assert_allclose(other.val_log_loss_[both], fits[0].val_log_loss_[both], rtol=1e-3)
        assert np.sum(other.predict(X_test) != predicted) <= 1
        assert other.selection_alternatives_ == fits[0].selection_alternatives_ == []
        assert other.selection_fragile_ is None and other.selection_margin_ > 1000
    with pytest.raises(ConfigError, match="refine_grid"):
        LogisticProbe(refine_grid="yes").fit(X, y)


def test_stable_choice_is_the_strongest_penalty_within_a_row_of_the_lowest_log_loss():
    from pipeline.protocols.linear.logistic_selection import stable_choice

    n_val = 100  # one row to a coin flip: ln 2 / 100 = 0.00693
    log_loss = np.array([[0.60, 0.01], [0.310, 0.02], [0.306, 0.02], [0.300, 0.02], [0.33, 0.02], [0.50, 0.02]])
    exact = np.ones(6, dtype=bool)
    chosen, members, lowest = stable_choice(log_loss, exact, n_val)
    assert (chosen, members.tolist(), lowest) == (2, [2, 3], 3)
    # values not fitted to their optimum are neither chosen nor the lowest
    chosen, members, lowest = stable_choice(log_loss, np.array([1, 1, 0, 0, 1, 1], dtype=bool), n_val)
    assert (chosen, members.tolist(), lowest) == (1, [1], 1)
    # separable rows: the log-loss falls towards 0 with C; the strongest value within a row of it
    flat = np.array([[1e-1, 0], [5e-3, 0], [2e-3, 0], [1e-3, 0]])
    assert stable_choice(flat, np.ones(4, dtype=bool), n_val)[0] == 1


def test_separable_rows_stop_the_exact_fits_once_the_choice_is_settled():
    # the validation log-loss falls towards 0 with C; once the chosen value is within a row's
    # worth of 0, no weaker fit can move it (the lowest is >= 0): those fits are not made
    X, y = _data(n=300, d=5, k=3, seed=6, spread=3.0)
    probe = LogisticProbe(Cs="default").fit(X, y)
    chosen = list(probe.Cs_).index(probe.C_)
    assert probe.val_log_loss_[chosen] <= np.log(2) / probe.n_val_ < probe.val_log_loss_[chosen - 1]
    assert not probe.refined_[-5:].any() and probe.selection_fragile_ is None


def test_feature_response_is_the_change_a_refit_shows():
    # the first-order change of the validation log-loss under a relative change of every
    # feature (through the train rows' optimum and the validation rows directly), against
    # refits on the perturbed features, by central differences
    from pipeline.protocols.blocks import FeatureRows
    from pipeline.protocols.linear.lbfgs import Preconditioner
    from pipeline.protocols.linear.linear_loss import LinearLoss, gram_matrix
    from pipeline.protocols.linear.logistic_sensitivity import adjoint, feature_response

    X, y = _data(n=240, d=6, k=3, seed=11, spread=0.8)
    va = np.flatnonzero(np.arange(240) % 4 == 0)
    tr = np.setdiff1d(np.arange(240), va)
    C, device = 0.5, torch.device("cpu")
    U = np.random.default_rng(3).uniform(-1, 1, X.shape)

    def val_loss(features):
        fit = LogisticProbe(C=C, tol=1e-12, refine_rtol=1e-15).fit(features[tr], y[tr])
        z = features[va] @ fit.coef_.T + fit.intercept_
        top = z.max(axis=1)
        return float(np.mean(np.log(np.exp(z - top[:, None]).sum(axis=1)) + top - z[np.arange(len(va)), y[va]]))

    base = LogisticProbe(C=C, tol=1e-12, refine_rtol=1e-15).fit(X[tr], y[tr])
    theta = torch.from_numpy(np.hstack([base.coef_, base.intercept_[:, None]]))
    train, val = FeatureRows.of(X[tr]), FeatureRows.of(X[va])
    _, _, curvature = LinearLoss(train, torch.from_numpy(y[tr]), 3, device).evaluate(theta, fast=False)
    lam = adjoint(train, y[tr], val, y[va], theta, 1.0 / (C * len(tr)), curvature,
                  Preconditioner(gram_matrix(train, device)), device)
    predicted = 0.0
    for part, start, ax in feature_response(train, y[tr], val, y[va], {0: (theta, lam)}, device):
        rows = (tr if part == "train" else va)[start:start + len(ax[0])]
        predicted += float(np.sum(ax[0].numpy() * U[rows]))
    eps = 1e-6
    measured = (val_loss(X * (1 + eps * U)) - val_loss(X * (1 - eps * U))) / (2 * eps)
    assert abs(predicted) > 1e-3  # a change to measure
    assert predicted == pytest.approx(measured, rel=1e-3)


def test_a_fragile_choice_is_said(monkeypatch):
    import pipeline.protocols.linear.logistic_selection as selection

    X, y = _data(n=300, d=8, k=3, seed=2, spread=0.5)
    probe = LogisticProbe(Cs="default").fit(X, y)
    assert probe.selection_fragile_ is None and probe.selection_margin_ >= selection.FRAGILE_ULPS
    assert np.isfinite(probe.selection_margin_) and np.isfinite(probe.selection_coherent_margin_)
    # the same fits, judged against a noise floor above their margin, say so, and where C could go
    monkeypatch.setattr(selection, "FRAGILE_ULPS", 10 * probe.selection_margin_)
    fragile = LogisticProbe(Cs="default").fit(X, y)
    assert fragile.C_ == probe.C_ and fragile.selection_fragile_.startswith(f"{probe.selection_margin_:.3g} float32")
    (other, rows), = fragile.selection_alternatives_
    assert other != probe.C_ and other in fragile.Cs_[fragile.refined_] and 0 <= rows <= fragile.n_val_


def test_features_validation_cannot_read_choose_by_accuracy_and_say_so():
    # features independent of the labels: no C's validation log-loss is below the class
    # prior's by a row's worth, so the log-loss rule's strongest member would be a nearly
    # uniform fit. The choice falls to validation accuracy (the best count among the exact
    # fits, the lowest log-loss on ties) and the cell is fragile: rounding can move it
    from pipeline.protocols.linear.logistic_selection import resolution

    rng = np.random.default_rng(5)
    X = np.abs(rng.normal(size=(200, 32))).astype(np.float32)
    y = np.repeat(np.arange(4), 50)
    probe = LogisticProbe(Cs="default").fit(X, y)
    exact = np.flatnonzero(probe.refined_)
    # balanced classes: the prior's log-loss is ln 4
    assert probe.val_log_loss_[exact].min() > np.log(4) - resolution(probe.n_val_)
    assert "validation cannot inform C" in probe.selection_fragile_
    chosen = list(probe.Cs_).index(probe.C_)
    best = probe.val_scores_[exact].max()
    tied = exact[probe.val_scores_[exact] == best]
    assert chosen == tied[np.argmin(probe.val_log_loss_[tied])]


def test_the_class_prior_log_loss_is_the_train_frequencies_on_validation():
    from pipeline.protocols.linear.logistic_selection import prior_log_loss

    train, val = np.array([0, 0, 0, 1]), np.array([0, 1, 1])
    assert prior_log_loss(train, val) == pytest.approx(-(np.log(0.75) + 2 * np.log(0.25)) / 3)
    assert prior_log_loss(train, np.array([2])) == np.inf
