"""Low-shot sweep: accuracy with N train images per class (ImageNet-CoG)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ConfigError, DataValidationError, UnknownNameError
from pipeline.protocols.episodic.lowshot import (
    LowShotResult,
    sample_per_class,
    lowshot_curve,
    relative_to_baseline,
)
from pipeline.protocols.linear.ridge import DEFAULT_ALPHAS, RidgeProbe
from pipeline.protocols.transforms.transformers import L2Normalize


def _data(seed: int = 0, sizes: tuple[int, ...] = (40, 25, 30)) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    d = 8
    centres = rng.normal(0, 1.0, (len(sizes), d)) + 1.0
    y_tr = np.concatenate([np.full(s, c) for c, s in enumerate(sizes)])
    rng.shuffle(y_tr)
    y_te = rng.integers(0, len(sizes), 90)
    X_tr = centres[y_tr] + rng.normal(0, 1.0, (y_tr.size, d))
    X_te = centres[y_te] + rng.normal(0, 1.0, (y_te.size, d))
    return X_tr.astype(np.float32), y_tr, X_te.astype(np.float32), y_te


def _manual_accuracy(X_tr, y_tr, X_te, y_te) -> float:
    tf = L2Normalize().fit(X_tr)
    probe = RidgeProbe(alphas=DEFAULT_ALPHAS, fit_intercept=True).fit(tf.transform(X_tr), y_tr)
    return float(np.mean(probe.predict(tf.transform(X_te)) == y_te))


def test_curve_statistics_and_shapes() -> None:
    X_tr, y_tr, X_te, y_te = _data()
    res = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1, 2, 8, "all"), n_seeds=3, seed=5)
    assert isinstance(res, LowShotResult)
    assert res.shots == (1, 2, 8, "all")
    assert res.skipped == {}
    for s in (1, 2, 8):
        assert len(res.per_seed[s]) == 3
        assert res.mean[s] == pytest.approx(np.mean(res.per_seed[s]))
        assert res.std[s] == pytest.approx(np.std(res.per_seed[s], ddof=0))
        assert all(0.0 <= a <= 1.0 for a in res.per_seed[s])
    assert len(res.runs) == 3 * 3 + 1
    assert [r.n_train for r in res.runs if r.shots == 8] == [24, 24, 24]
    assert all("alpha" in r.diagnostics for r in res.runs)  # selected lambda recorded
    assert res.n_classes == 3 and res.n_test == 90
    records = res.to_records()
    assert [r["shots"] for r in records] == [1, 2, 8, "all"]
    # more data helps on these clusters
    assert res.mean["all"] >= res.mean[1]


def test_each_run_is_the_protocol_on_its_sample() -> None:
    X_tr, y_tr, X_te, y_te = _data(1)
    res = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(4,), n_seeds=2, seed=9)
    classes = np.unique(y_tr)
    for rep in range(2):
        idx = sample_per_class(y_tr, classes, 4, np.random.default_rng([9, 4, rep]))
        want = _manual_accuracy(X_tr[idx], y_tr[idx], X_te, y_te)
        assert res.per_seed[4][rep] == pytest.approx(want, abs=1e-12)


def test_all_uses_every_train_image() -> None:
    X_tr, y_tr, X_te, y_te = _data(2)
    res = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=("all",), n_seeds=4)
    (run,) = res.runs
    assert run.n_train == y_tr.size
    assert res.per_seed["all"] == (run.accuracy,)
    assert res.std["all"] == 0.0
    assert res.mean["all"] == pytest.approx(_manual_accuracy(X_tr, y_tr, X_te, y_te), abs=1e-12)


def test_sampler_takes_exactly_n_per_class() -> None:
    _, y_tr, _, _ = _data()
    classes = np.unique(y_tr)
    rng = np.random.default_rng(0)
    for n in (1, 7, 25):
        idx = sample_per_class(y_tr, classes, n, rng)
        assert np.unique(idx).size == idx.size == n * classes.size
        np.testing.assert_array_equal(np.bincount(y_tr[idx]), [n] * classes.size)
    # a class with exactly n images gives all of them
    idx = sample_per_class(y_tr, classes, 25, rng)
    assert set(np.flatnonzero(y_tr == 1)) <= set(idx.tolist())


def test_impossible_shots_raise_or_are_skipped() -> None:
    X_tr, y_tr, X_te, y_te = _data(sizes=(40, 3, 30))
    with pytest.raises(DataValidationError) as info:
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1, 4, 16), n_seeds=1)
    msg = str(info.value)
    assert "4 shots per class" in msg and "1 of 3 classes have fewer: [1]" in msg
    assert "At most 3 shots" in msg and "on_insufficient='skip'" in msg
    res = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1, 4, 16, "all"), n_seeds=2, on_insufficient="skip")
    assert res.shots == (1, "all")
    assert set(res.skipped) == {4, 16}
    assert "class 1 with 3 images" in res.skipped[16]
    with pytest.raises(DataValidationError, match="no N in shots"):
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(8,), on_insufficient="skip")


def test_determinism_and_independence_of_other_shots() -> None:
    X_tr, y_tr, X_te, y_te = _data(3)
    a = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1, 2), n_seeds=4, seed=1)
    b = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1, 2), n_seeds=4, seed=1)
    c = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1, 2), n_seeds=4, seed=2)
    only2 = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(2,), n_seeds=4, seed=1)
    assert a.per_seed == b.per_seed
    assert a.per_seed != c.per_seed
    assert only2.per_seed[2] == a.per_seed[2]


def test_relative_to_baseline() -> None:
    X_tr, y_tr, X_te, y_te = _data(4)
    model = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(2, "all"), n_seeds=2)
    noise = np.random.default_rng(0).normal(size=X_tr.shape)  # an uninformative "model"
    base = lowshot_curve(noise, y_tr, X_te, y_te, shots=(1, 2, "all"), n_seeds=2)
    rel = relative_to_baseline(model, base)
    assert set(rel) == {2, "all"}
    for s in rel:
        assert rel[s] == pytest.approx(model.mean[s] - base.mean[s])
    with pytest.raises(DataValidationError, match=r"no result for shots \[1\]"):
        relative_to_baseline(base, model)
    other = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(2, "all"), n_seeds=2, transform="none")
    with pytest.raises(DataValidationError, match="different protocols"):
        relative_to_baseline(model, other)


def test_bad_arguments() -> None:
    X_tr, y_tr, X_te, y_te = _data()
    with pytest.raises(UnknownNameError, match="ridge"):
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1,), probe="ridg")
    with pytest.raises(ConfigError, match=r"\['lambda'\].*alphas"):
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1,), probe_params={"lambda": 1.0})
    with pytest.raises(UnknownNameError, match="transform"):
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1,), transform="pca")
    for shots in [(0,), (1.5,), ("most",), (), (2, 2)]:
        with pytest.raises(DataValidationError, match="shots"):
            lowshot_curve(X_tr, y_tr, X_te, y_te, shots=shots)
    with pytest.raises(DataValidationError, match="n_seeds"):
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1,), n_seeds=0)
    with pytest.raises(DataValidationError, match="on_insufficient"):
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1,), on_insufficient="fewer")
    with pytest.raises(DataValidationError, match="y_test"):
        lowshot_curve(X_tr, y_tr, X_te, y_te[:-1], shots=(1,))


def test_probe_params_override_defaults() -> None:
    X_tr, y_tr, X_te, y_te = _data(5)
    res = lowshot_curve(
        X_tr, y_tr, X_te, y_te, shots=(4,), n_seeds=1, probe_params={"alphas": None, "alpha": 0.5}
    )
    assert res.runs[0].diagnostics["alpha"] == 0.5


def test_logistic_probe_option() -> None:
    X_tr, y_tr, X_te, y_te = _data(6)
    res = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1, 4), n_seeds=2, probe="logistic",
                        probe_params={"C": 10.0})
    assert res.probe == "logistic"
    for run in res.runs:
        assert run.diagnostics["C"] == 10.0
        assert run.diagnostics["converged"] is True
    assert all(0.0 <= m <= 1.0 for m in res.mean.values())


def test_transform_params_reach_the_transform() -> None:
    X_tr, y_tr, X_te, y_te = _data(7)
    # 1 shot x 3 classes < 8 features: exact whitening is impossible, a ridge makes it work
    with pytest.raises(DataValidationError, match="rank deficient"):
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1,), n_seeds=1, transform="whiten")
    res = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1,), n_seeds=1, transform="whiten",
                        transform_params={"eps": 1e-3})
    assert res.transform_params == {"eps": 1e-3}
    with pytest.raises(ConfigError, match="transform_params"):
        lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1,), transform="l2", transform_params={"eps": 1.0})


def test_streamed_train_features_give_the_same_curve() -> None:
    from pipeline.protocols.blocks import FeatureRows

    X_tr, y_tr, X_te, y_te = _data(8)
    blocks = lambda: ((X_tr[i:i + 16], i) for i in range(0, len(X_tr), 16))  # noqa: E731
    rows = FeatureRows.of(blocks=blocks, n_rows=len(X_tr), n_features=X_tr.shape[1])
    streamed = lowshot_curve(rows, y_tr, X_te, y_te, shots=(1, 4, "all"), n_seeds=2)
    in_memory = lowshot_curve(X_tr, y_tr, X_te, y_te, shots=(1, 4, "all"), n_seeds=2)
    assert streamed.per_seed == in_memory.per_seed
