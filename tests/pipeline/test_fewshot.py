"""Episodic few-shot with nearest centroid (Ericsson 2021, CD-FSL)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.errors import DataValidationError
from pipeline.plain import to_plain
from pipeline.protocols.episodic import fewshot as fewshot_module
from pipeline.protocols.episodic.fewshot import FewShotResult, fewshot_episodes, sample_episodes


def _data(seed: int = 0, n_classes: int = 8, d: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters with unequal class sizes (class 7 too small for 20+15)."""
    rng = np.random.default_rng(seed)
    sizes = [60, 45, 40, 70, 36, 50, 38, 20][:n_classes]
    y = np.concatenate([np.full(s, c) for c, s in enumerate(sizes)])
    rng.shuffle(y)
    centres = rng.normal(0, 1.0, size=(n_classes, d))
    X = (centres[y] + rng.normal(0, 1.2, size=(y.size, d))).astype(np.float32)
    return X, y


def _reference_loop(X: np.ndarray, support: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Plain per-episode prototypical-network accuracy, the definition written out."""
    acc = []
    for sup, qry in zip(support, query):
        protos = np.stack([X[s].astype(np.float64).mean(axis=0) for s in sup])
        hits = 0
        total = 0
        for way, q_idx in enumerate(qry):
            for i in q_idx:
                dist = ((X[i].astype(np.float64) - protos) ** 2).sum(axis=1)
                hits += int(np.argmin(dist) == way)
                total += 1
        acc.append(hits / total)
    return np.array(acc)


def test_sampled_episodes_are_valid() -> None:
    X, y = _data()
    ep = sample_episodes(y, n_way=5, n_shot=20, n_query=15, n_episodes=200, seed=0)
    assert ep.support.shape == (200, 5, 20)
    assert ep.query.shape == (200, 5, 15)
    assert ep.classes.shape == (200, 5)
    assert ep.eligible.tolist() == [0, 1, 2, 3, 4, 5, 6]  # class 7 has 20 < 35 images
    for e in range(200):
        assert len(set(ep.classes[e].tolist())) == 5  # classes without replacement
        assert 7 not in ep.classes[e]
        all_idx = np.concatenate([ep.support[e].ravel(), ep.query[e].ravel()])
        assert np.unique(all_idx).size == all_idx.size  # support and query disjoint, no repeats
        for w in range(5):
            assert (y[ep.support[e, w]] == ep.classes[e, w]).all()
            assert (y[ep.query[e, w]] == ep.classes[e, w]).all()
    # every eligible class and many images get used: the draw is not stuck
    assert set(ep.classes.ravel().tolist()) == set(range(7))
    assert np.unique(ep.support).size > 0.9 * np.flatnonzero(y != 7).size


def test_sampling_is_roughly_uniform() -> None:
    _, y = _data()
    ep = sample_episodes(y, n_way=2, n_shot=1, n_query=1, n_episodes=4000, seed=1)
    freq = np.bincount(ep.classes.ravel(), minlength=8) / ep.classes.size
    np.testing.assert_allclose(freq, 1 / 8, atol=0.02)
    members = np.flatnonzero(y == 7)  # 20 images: each is support with p = 1/20
    sup = ep.support[:, :, 0][ep.classes == 7]
    counts = np.array([(sup == m).sum() for m in members])
    assert counts.min() > 0 and counts.max() < 3 * counts.mean()


def test_vectorised_equals_reference_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    X, y = _data(3)
    # tiny blocks so that several sampling and scoring blocks are exercised
    monkeypatch.setattr(fewshot_module, "MAX_FEATURE_ELEMENTS", 5 * 10 * 16 * 7)
    res = fewshot_episodes(X, y, n_way=5, n_shot=5, n_query=5, n_episodes=60, seed=11)
    ep = sample_episodes(y, 5, 5, 5, 60, 11)
    ref = _reference_loop(X, ep.support, ep.query)
    # the sampling block size bounds memory only: the same episodes in 3-episode blocks
    monkeypatch.setattr(fewshot_module, "MAX_KEY_ELEMENTS", 5 * 70 * 3)  # max class: 70 images
    small = sample_episodes(y, 5, 5, 5, 60, 11)
    np.testing.assert_array_equal(small.support, ep.support)
    np.testing.assert_array_equal(small.query, ep.query)
    np.testing.assert_array_equal(res.accuracies, ref)
    assert res.mean == pytest.approx(ref.mean(), abs=1e-15)


def test_result_statistics_and_ci_formula() -> None:
    X, y = _data(4)
    res = fewshot_episodes(X, y, n_way=5, n_shot=5, n_query=15, n_episodes=600, seed=0)
    assert isinstance(res, FewShotResult)
    assert res.accuracies.shape == (600,)
    assert res.mean == pytest.approx(res.accuracies.mean())
    assert res.std == pytest.approx(np.std(res.accuracies, ddof=0))
    assert res.ci95 == pytest.approx(1.96 * np.std(res.accuracies) / np.sqrt(600))
    # accuracies are multiples of 1 / (n_way * n_query)
    np.testing.assert_allclose(res.accuracies * 75, np.round(res.accuracies * 75), atol=1e-9)
    assert 0.2 < res.mean <= 1.0  # far above chance on separated clusters
    assert (res.n_way, res.n_shot, res.n_query, res.n_episodes) == (5, 5, 15, 600)
    assert res.eligible_classes == tuple(range(8))
    # its plain form (to_plain, which replaced a hand-written to_dict): every field, the
    # episode accuracies and the eligible classes as lists of Python numbers
    plain = to_plain(res)
    assert plain == {"mean": res.mean, "ci95": res.ci95, "std": res.std, "accuracies": res.accuracies.tolist(),
                     "n_way": 5, "n_shot": 5, "n_query": 15, "n_episodes": 600, "eligible_classes": list(range(8)),
                     "seed": 0}
    assert json.loads(json.dumps(plain)) == plain
    assert {type(v) for v in plain["accuracies"] + plain["eligible_classes"]} <= {float, int}
    with pytest.raises(ValueError):
        res.accuracies[0] = 0.0  # read-only


def test_determinism() -> None:
    X, y = _data(5)
    a = fewshot_episodes(X, y, n_shot=5, n_episodes=50, seed=7)
    b = fewshot_episodes(X, y, n_shot=5, n_episodes=50, seed=7)
    c = fewshot_episodes(X, y, n_shot=5, n_episodes=50, seed=8)
    np.testing.assert_array_equal(a.accuracies, b.accuracies)
    assert a.mean == b.mean
    assert not np.array_equal(a.accuracies, c.accuracies)
    e1 = sample_episodes(y, 5, 5, 15, 50, 7)
    e2 = sample_episodes(y, 5, 5, 15, 50, 8)
    assert not np.array_equal(e1.support, e2.support)


def test_perfectly_separated_gives_one() -> None:
    y = np.repeat(np.arange(6), 30)
    X = np.eye(6)[y] * 10.0
    res = fewshot_episodes(X, y, n_way=5, n_shot=3, n_query=10, n_episodes=20)
    assert res.mean == 1.0 and res.ci95 == 0.0


def test_too_few_qualifying_classes_names_them() -> None:
    X, y = _data()
    # 20 + 30 = 50 images needed: only classes 0 (60) and 3 (70) and 5 (50) qualify
    with pytest.raises(DataValidationError) as info:
        fewshot_episodes(X, y, n_way=5, n_shot=20, n_query=30)
    msg = str(info.value)
    assert "at least n_shot + n_query = 50 images" in msg
    assert "only 3 of 8 classes qualify: [0, 3, 5]" in msg
    assert "n_shot can be at most 10" in msg  # 5th largest class has 40 images


def test_other_bad_input() -> None:
    X, y = _data()
    with pytest.raises(DataValidationError, match="n_way=9 needs at least 9 classes, but y has only 8"):
        fewshot_episodes(X, y, n_way=9, n_shot=1, n_query=1)
    for kwargs, name in [
        ({"n_way": 1}, "n_way"),
        ({"n_shot": 0}, "n_shot"),
        ({"n_query": 0}, "n_query"),
        ({"n_episodes": 0}, "n_episodes"),
        ({"n_shot": 2.5}, "n_shot"),
        ({"seed": -1}, "seed"),
    ]:
        with pytest.raises(DataValidationError, match=name):
            fewshot_episodes(X, y, **kwargs)
    with pytest.raises(DataValidationError, match="labels"):
        fewshot_episodes(X, y[:-1])
    bad = X.copy()
    bad[3, 2] = np.nan
    with pytest.raises(DataValidationError, match="NaN"):
        fewshot_episodes(bad, y)


def test_streamed_pool_reads_only_the_rows_it_uses() -> None:
    from pipeline.protocols.blocks import FeatureRows

    X, y = _data(6)
    read = []

    def blocks():
        for i in range(0, 300, 40):
            read.append(i)
            yield X[i:i + 40], i

    rest = X[300:]
    rows = FeatureRows([(blocks, 300), rest], X.shape[1])
    streamed = fewshot_episodes(rows, y, n_shot=5, n_episodes=40, seed=3)
    in_memory = fewshot_episodes(X, y, n_shot=5, n_episodes=40, seed=3)
    np.testing.assert_array_equal(streamed.accuracies, in_memory.accuracies)
    assert read == list(range(0, 300, 40))  # one pass over the streamed part
