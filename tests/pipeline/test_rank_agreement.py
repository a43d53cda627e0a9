"""Rank agreement between settings: scipy's tau-b and rho, direct flip counts, radar ranks."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from scipy import stats

from pipeline.errors import DataValidationError
from pipeline.analysis.rank_agreement import (
    encoder_ranks, flip_count, kendall_tau_b_rows, pair_agreement, radar_data, rank_agreement, rank_table,
    spearman_rows,
)
from pipeline.plain import to_plain


def _direct_flips(a, b):
    flips = tied = 0
    for i, j in combinations(range(len(a)), 2):
        da, db = a[i] - a[j], b[i] - b[j]
        if da == 0 or db == 0:
            tied += 1
        elif (da > 0) != (db > 0):
            flips += 1
    return flips, tied


def test_rowwise_tau_b_and_rho_match_scipy_with_ties():
    rng = np.random.default_rng(0)
    A = rng.integers(0, 4, size=(40, 9)).astype(float)  # many ties, some constant rows
    B = rng.integers(0, 5, size=(40, 9)).astype(float)
    A[0] = 2.0
    taus, rhos = kendall_tau_b_rows(A, B), spearman_rows(A, B)
    assert np.isnan(taus[0]) and np.isnan(rhos[0])
    for r in range(1, 40):
        np.testing.assert_allclose(taus[r], stats.kendalltau(A[r], B[r]).statistic, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(rhos[r], stats.spearmanr(A[r], B[r]).statistic, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flips_match_a_direct_count(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 6, 12).astype(float), rng.integers(0, 6, 12).astype(float)
    assert flip_count(a, b) == _direct_flips(a, b)


def test_pair_agreement_against_scipy_and_bootstrap_properties():
    encoders = [f"enc{i}" for i in range(10)]
    rng = np.random.default_rng(3)
    linear = dict(zip(encoders, rng.uniform(0.5, 0.9, 10).round(2)))
    knn = {e: v + rng.normal(0, 0.05) for e, v in linear.items()}
    knn["enc3"] = knn["enc4"]  # a tie in one setting
    res = pair_agreement(linear, knn, n_bootstrap=500, seed=7)
    x, y = np.array(list(linear.values())), np.array([knn[e] for e in linear])
    assert res.kendall_tau == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-15)
    assert res.spearman_rho == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-15)
    assert (res.flips, res.tied_pairs) == _direct_flips(x, y)
    assert res.n == 10 and res.n_pairs == 45
    assert res.kendall_ci[0] <= res.kendall_tau <= res.kendall_ci[1]
    assert res.spearman_ci[0] <= res.spearman_rho <= res.spearman_ci[1]
    assert 0 < res.n_bootstrap_used <= 500
    # the interval is the percentile of tau-b over seeded encoder resamples
    idx = np.random.default_rng(7).integers(0, 10, size=(500, 10))
    taus = kendall_tau_b_rows(x[idx], y[idx])
    ok = np.isfinite(taus) & np.isfinite(spearman_rows(x[idx], y[idx]))
    np.testing.assert_allclose(res.kendall_ci, np.percentile(taus[ok], [2.5, 97.5]))
    assert pair_agreement(linear, knn, n_bootstrap=500, seed=7) == res


def test_lower_is_better_reverses_a_setting():
    acc = {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6}
    err = {e: 1 - v for e, v in acc.items()}
    same = pair_agreement(acc, err, n_bootstrap=0, lower_is_better=(False, True))
    assert same.kendall_tau == 1.0 and same.flips == 0
    opposite = pair_agreement(acc, err, n_bootstrap=0)
    assert opposite.kendall_tau == -1.0 and opposite.flips == 6 and opposite.kendall_ci is None


def test_rank_agreement_covers_every_dataset_and_pair_of_settings():
    scores = {}
    rng = np.random.default_rng(0)
    for enc in ("r50", "vit", "dino", "mae"):
        for ds in ("pets", "flowers"):
            for st in ("linear", "mlp", "knn"):
                scores[(enc, ds, st)] = float(rng.uniform())
    out = rank_agreement(scores, n_bootstrap=50)
    assert [(r.dataset, r.setting_a, r.setting_b) for r in out] == [
        (ds, a, b) for ds in ("pets", "flowers") for a, b in (("linear", "mlp"), ("linear", "knn"), ("mlp", "knn"))]
    first = out[0]
    x = [scores[(e, "pets", "linear")] for e in ("r50", "vit", "dino", "mae")]
    y = [scores[(e, "pets", "mlp")] for e in ("r50", "vit", "dino", "mae")]
    assert first.kendall_tau == pytest.approx(stats.kendalltau(x, y).statistic)
    assert to_plain(first)["n"] == 4
    ranks = rank_table(scores, lower_is_better={"knn"})
    assert sorted(ranks) == sorted((ds, st) for ds in ("pets", "flowers") for st in ("linear", "mlp", "knn"))
    pets_knn = {e: scores[(e, "pets", "knn")] for e in ("r50", "vit", "dino", "mae")}
    assert ranks[("pets", "knn")] == encoder_ranks(pets_knn, lower_is_better=True)
    assert sorted(ranks[("pets", "linear")].values()) == [1.0, 2.0, 3.0, 4.0]


def test_encoder_ranks_and_radar_data():
    assert encoder_ranks({"a": 0.5, "b": 0.9, "c": 0.5}) == {"a": 2.5, "b": 1.0, "c": 2.5}
    assert encoder_ranks({"a": 0.1, "b": 0.3}, lower_is_better=True) == {"a": 1.0, "b": 2.0}
    settings = {"linear": {"a": 0.7, "b": 0.8, "c": 0.6}, "fewshot": {"a": 0.5, "b": 0.4, "c": 0.3},
                "ece": {"a": 0.02, "b": 0.05, "c": 0.01}}
    reference = {"a": 0.76, "b": 0.81, "c": 0.70, "unused": 0.5}
    radar = radar_data(settings, reference, lower_is_better={"ece"})
    assert radar.axes == ("ImageNet", "linear", "fewshot", "ece")
    assert radar.encoders == ("a", "b", "c")
    np.testing.assert_array_equal(radar.ranks, [[2, 2, 1, 2], [1, 1, 2, 3], [3, 3, 3, 1]])
    assert radar.records()[0] == {"encoder": "a", "axis": "ImageNet", "rank": 2.0}
    assert radar_data(settings).axes == ("linear", "fewshot", "ece")


def test_bad_inputs_are_refused():
    with pytest.raises(DataValidationError, match="share 2 scored encoder"):
        pair_agreement({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2})
    with pytest.raises(DataValidationError, match="same score"):
        pair_agreement({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 1, "c": 1})
    with pytest.raises(DataValidationError, match="non-finite"):
        pair_agreement({"a": 1, "b": np.nan, "c": 3}, {"a": 1, "b": 2, "c": 3})
    with pytest.raises(DataValidationError, match="n_bootstrap"):
        pair_agreement({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2, "c": 3}, n_bootstrap=-1)
    with pytest.raises(DataValidationError, match=r"\(encoder, dataset, setting\)"):
        rank_agreement({("a", "b"): 1.0})
    with pytest.raises(DataValidationError, match="axis knn"):
        radar_data({"linear": {"a": 1, "b": 2}, "knn": {"a": 1}})
