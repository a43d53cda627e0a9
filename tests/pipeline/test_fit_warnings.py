"""Each fit warning, raised by the protocol that knows the fact, checked against the fact
computed directly: one class predicted, a chance score, a grid edge, a plateau, a
temperature at its bound, collapsed features, a class without positives."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.protocols.fit_warnings import (
    WARNING_CODES, chance_level, fit_warning, grid_warnings, prediction_warnings, record_warnings,
    unreliable_reasons, warning_codes,
)
from pipeline.protocols.registry import EvalData, get_protocol, list_protocols, resolve_settings

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")]


def _blobs(seed=0, shift=3.0, n_train=80, n_test=40, k=4, d=6):
    rng = np.random.default_rng(seed)
    y_train, y_test = np.arange(n_train) % k, np.arange(n_test) % k
    centers = np.random.default_rng(99).normal(size=(k, d)) * shift
    return EvalData(y_train=y_train, X_test=centers[y_test] + rng.normal(size=(n_test, d)), y_test=y_test,
                    n_classes=k, X_train=centers[y_train] + rng.normal(size=(n_train, d)))


def _run(name, data, **settings):
    return get_protocol(name)(data, resolve_settings(name, {**settings, **({"device": "cpu"} if "device" in
                                                                             get_protocol(name).defaults else {})}))


def _codes(result):
    return [w["code"] for w in result.warnings]


def test_one_class_and_chance_from_the_predictions():
    y = np.repeat(np.arange(4), 10)
    collapsed = np.zeros(40, int)
    codes = {w["code"] for w in prediction_warnings(y, collapsed, float(np.mean(collapsed == y)))}
    assert codes == {"one_class", "at_chance"}
    assert prediction_warnings(y, y, 1.0) == []
    # a class that is 95 % of the labels may be predicted for 95 % of the rows; it scores chance though
    skewed = np.r_[np.zeros(38, int), 1, 2]
    assert [w["code"] for w in prediction_warnings(skewed, np.zeros(40, int), 0.95)] == ["at_chance"]
    assert chance_level(skewed) == 0.95 and chance_level(y) == 0.25 and chance_level(skewed, True) == 1 / 3


def test_a_probe_that_predicts_one_class_is_flagged_as_such():
    data = _blobs()
    # a penalty this strong leaves only the intercepts: the class with one more row wins everywhere
    data = EvalData(y_train=np.r_[data.y_train, 3], X_test=data.X_test, y_test=data.y_test, n_classes=4,
                    X_train=np.r_[data.X_train, data.X_train[-1:]])
    result = _run("logistic", data, Cs=None, C=1e-8, transform="l2")
    pred = get_protocol("logistic").run(data, resolve_settings("logistic", {"Cs": None, "C": 1e-8})).evidence.values
    assert np.unique(pred).size == 1  # the fact, from the predictions themselves
    assert {"one_class", "at_chance"} <= set(_codes(result))
    assert unreliable_reasons({"warnings": result.warnings})


def test_knn_at_chance_without_signal():
    rng = np.random.default_rng(3)
    y_train, y_test = np.arange(200) % 4, np.arange(80) % 4
    data = EvalData(y_train=y_train, X_test=rng.normal(size=(80, 8)), y_test=y_test, n_classes=4,
                    X_train=rng.normal(size=(200, 8)))
    result = _run("knn", data, n_neighbors=20)
    assert ("at_chance" in _codes(result)) == (result.metrics["score"] <= 0.25)


def test_fewshot_at_chance_is_one_over_the_ways():
    seen = []
    for seed in range(8):  # features without signal: the episode accuracy falls on both sides of 1/5
        rng = np.random.default_rng(seed)
        y = np.arange(200) % 5
        data = EvalData(y_train=y, X_test=rng.normal(size=(200, 8)), y_test=y, n_classes=5,
                        X_train=rng.normal(size=(200, 8)))
        result = _run("fewshot", data, n_shot=5, n_episodes=20, pool="test")
        assert ("at_chance" in _codes(result)) == (result.metrics["mean"] <= 0.2)
        seen.append(result.metrics["mean"] <= 0.2)
    assert any(seen) and not all(seen)


def test_grid_edge_only_while_still_improving():
    grid = [1.0, 10.0, 100.0]
    assert [w["code"] for w in grid_warnings("C", grid, [0.5, 0.6, 0.7], 2)] == ["grid_edge"]
    assert grid_warnings("C", grid, [0.5, 0.7, 0.7], 2) == []  # a tie at the edge: the inner value is as good
    assert grid_warnings("C", grid, [0.5, 0.7, 0.6], 1) == []  # an inner pick: the grid brackets it
    assert [w["code"] for w in grid_warnings("alpha", grid, [1.0, 2.0, 3.0], 0, higher_is_better=False)] == [
        "grid_edge"]
    assert grid_warnings("alpha", grid, [1.0, 1.0 + 1e-9, 3.0], 0, higher_is_better=False, rtol=1e-6) == []
    codes = [w["code"] for w in grid_warnings("C", range(12), [0.9] * 12, 11)]
    assert codes == ["plateau"]


def test_grid_edge_says_what_to_widen():
    [w] = grid_warnings("C", [1e-2, 1e-1, 1.0], [0.5, 0.6, 0.7], 2, setting="Cs")
    assert w["code"] == "grid_edge" and "widen `Cs` above 1 (e.g. add 10)" in w["message"]
    [w] = grid_warnings("alpha", [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 0, higher_is_better=False, setting="alphas")
    assert "widen `alphas` below 1 (e.g. add 0.5)" in w["message"]  # geometric spacing: 1 / 2
    # a diverged neighbour (NaN) is beaten: a wider grid could still move the choice
    assert grid_warnings("learning rate", [1e-3, 1e-2, 1e-1], [0.2, 0.3, float("nan")], 1) == []  # inner pick
    [w] = grid_warnings("learning rate", [1e-3, 1e-2, 1e-1], [0.4, float("nan"), float("nan")], 0,
                        setting="learning_rates")
    assert w["code"] == "grid_edge" and "none (the fit diverged)" in w["message"] and "below 0.001" in w["message"]


def test_a_two_value_grid_is_a_caution_not_an_unreliable_score():
    # two values: the pick is an edge whatever the scores; one difference tells no trend
    [w] = grid_warnings("learning rate", [1e-2, 1e-1], [0.3, 0.4], 1, setting="learning_rates")
    assert w["code"] == "short_grid" and "widen `learning_rates` above 0.1 (e.g. add 1)" in w["message"]
    assert WARNING_CODES["short_grid"][0] == "caution" and not unreliable_reasons({"warnings": [w]})
    assert grid_warnings("learning rate", [1e-2, 1e-1], [0.4, 0.4], 0) == []  # tied: nothing to learn
    [w] = grid_warnings("C", [1.0, 10.0], [0.9, 0.8], 0, setting="Cs")
    assert w["code"] == "short_grid" and "below 1 (e.g. add 0.1)" in w["message"]


def test_ridge_alpha_at_the_end_of_its_grid():
    data = _blobs(shift=0.3)  # little signal: more shrinkage is always better on this grid
    result = _run("ridge", data, alphas=[0.01, 0.1, 1.0])
    press = result.diagnostics["press"]
    assert result.diagnostics["alpha"] == 1.0 and press[2] < press[1] * (1 - 1e-6)  # the fact: still falling
    assert "grid_edge" in _codes(result)
    wide = _run("ridge", data, alphas=[10.0 ** k for k in range(-4, 9)])
    assert "grid_edge" not in _codes(wide)


def test_logistic_plateau_and_temperature_at_its_bound():
    data = _blobs(shift=6.0)  # separable: every validation row right for most C
    result = _run("logistic", data, selection="seed")
    scores = np.array(result.diagnostics["val_scores"])
    assert np.sum(scores == scores.max()) >= 12 and "plateau" in _codes(result)
    assert result.diagnostics["temperature_at_bound"] and "temperature_edge" in _codes(result)
    assert not unreliable_reasons({"warnings": result.warnings})  # cautions: the score stands
    # the stable selection decides within the plateau by its rule (the log-loss) and says how wide it was
    stable = _run("logistic", data)
    assert "plateau" not in _codes(stable) and len(stable.diagnostics["selection_set"]) >= 12
    assert stable.diagnostics["selection"] == "stable" and stable.diagnostics["C"] in stable.diagnostics["selection_set"]


def test_collapsed_features_are_the_encoder_s_result_not_a_fit_s():
    data = _blobs()
    same = np.ones((40, 6))
    data = EvalData(y_train=data.y_train, X_test=same, y_test=data.y_test, n_classes=4,
                    X_train=np.ones((80, 6)))
    for name, settings in (("knn", {}), ("logistic", {"Cs": None}), ("fewshot", {"n_way": 4, "n_shot": 2, "n_query": 5,
                                                                               "n_episodes": 5, "pool": "test"})):
        result = _run(name, data, **settings)
        assert "collapsed_features" in _codes(result) and not {"one_class", "at_chance"} & set(_codes(result))


def test_a_class_without_a_present_test_image():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 5))
    Y = (X[:, :3] > 0).astype(np.int64)
    Y[60:, 2] = 0  # no test image holds class 2
    data = EvalData(y_train=Y[:60], X_test=X[60:], y_test=Y[60:], n_classes=3, X_train=X[:60])
    result = _run("ridge", data)
    assert "undefined_ap" in _codes(result) and result.metrics["ap11_per_class"][2] == pytest.approx(1 / 11)


def test_python_warnings_and_old_records_read_as_codes():
    rec = {"warnings": ["ConvergenceWarning: stopped at max_iter", "something odd",
                        {"code": "plateau", "message": "12 of 45"}], "converged": False}
    assert [w["code"] for w in record_warnings(rec)] == ["not_converged", "runtime", "plateau"]
    assert warning_codes({"converged": False}) == ["not_converged"]
    with pytest.raises(ValueError, match="unknown warning code 'nope'"):
        fit_warning("nope", "x")
    assert set(WARNING_CODES) >= {"grid_edge", "one_class", "at_chance", "temperature_edge", "plateau"}


@pytest.mark.parametrize("name", list_protocols())
def test_every_protocol_declares_metrics_and_a_primary_one(name):
    proto = get_protocol(name)
    assert proto.primary_metric in proto.metrics and set(proto.unbounded) <= set(proto.metrics)
