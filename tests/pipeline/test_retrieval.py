"""The ``retrieval`` readout against a brute-force numpy computation: the full ranking of every
train row by cosine similarity (np.lexsort: similarity descending, then train row), AP@R and
recall@k written from their definitions (Musgrave et al. 2020), the chance level by
enumerating every placement of the relevant items, and the per-query evidence."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipeline.protocols import EvalData, get_protocol
from pipeline.protocols.evidence import values_fingerprint
from pipeline.protocols.neighbours.retrieval import random_map_at_r

RETRIEVAL = get_protocol("retrieval")


def brute_force(X_train, y_train, X_test, y_test):
    """Per-query AP@R, recall@1, recall@5 from the full ranking (NaN where R = 0)."""
    unit = lambda X: X / np.linalg.norm(X, axis=1, keepdims=True)  # noqa: E731
    sims = unit(X_test.astype(np.float64)) @ unit(X_train.astype(np.float64)).T
    ap, r1, r5 = (np.full(len(y_test), np.nan) for _ in range(3))
    for q in range(len(y_test)):
        order = np.lexsort((np.arange(len(y_train)), -sims[q]))  # last key first: similarity, then row
        rel = y_train[order] == y_test[q]
        R = int(rel.sum())
        if R == 0:
            continue
        precision = np.cumsum(rel) / np.arange(1, len(rel) + 1)
        ap[q] = sum(precision[i] for i in range(R) if rel[i]) / R
        r1[q], r5[q] = float(rel[:1].any()), float(rel[:5].any())
    return ap, r1, r5


def clustered(n_train, n_test, d, sizes, seed, spread=1.0):
    """Class-clustered Gaussian features; class c holds ``sizes[c]`` train rows (unequal classes)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(sizes), d))
    y_train = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))[:n_train]
    y_test = rng.integers(0, len(sizes), n_test)
    noise = lambda n: spread * rng.normal(size=(n, d))  # noqa: E731
    return ((centres[y_train] + noise(len(y_train))).astype(np.float32), y_train,
            (centres[y_test] + noise(n_test)).astype(np.float32), y_test)


def tied(n_train, n_test, d, n_classes, seed):
    """Rows with exactly four ones: normalised entries are 0.5, every similarity a multiple of
    0.25 computed exactly in float32 whatever the order, so ties are exact and frequent."""
    rng = np.random.default_rng(seed)

    def rows(n):
        X = np.zeros((n, d), np.float32)
        for i in range(n):
            X[i, rng.choice(d, 4, replace=False)] = 1.0
        return X

    sizes = rng.integers(1, 40, n_classes)
    y = rng.permutation(np.repeat(np.arange(n_classes), sizes))[:n_train]
    return rows(len(y)), y, rows(n_test), rng.integers(0, n_classes, n_test)


def run(X_train, y_train, X_test, y_test, stream_rows=None, **settings):
    n_classes = int(max(y_train.max(), y_test.max())) + 1
    if stream_rows is None:
        data = EvalData(y_train=y_train, X_test=X_test, y_test=y_test, n_classes=n_classes, X_train=X_train)
    else:  # streamed from blocks of rows, out of order, as a store's chunks may come
        starts = list(range(0, len(X_train), stream_rows))[::-1]
        data = EvalData(y_train=y_train, X_test=X_test, y_test=y_test, n_classes=n_classes,
                        train_blocks=lambda: ((X_train[i:i + stream_rows], i) for i in starts))
    return RETRIEVAL(data, {"device": "cpu", **settings})


@pytest.mark.parametrize("stream_rows", [None, 97])
def test_map_at_r_and_recall_match_the_full_ranking_with_unequal_classes(stream_rows):
    X_tr, y_tr, X_te, y_te = clustered(1500, 200, 24, [400, 300, 250, 200, 150, 100, 60, 30, 8, 2], seed=1,
                                       spread=2.0)
    result = run(X_tr, y_tr, X_te, y_te, stream_rows)
    ap, r1, r5 = brute_force(X_tr, y_tr, X_te, y_te)
    assert result.metrics["map_at_r"] == pytest.approx(ap.mean(), abs=1e-12)
    assert result.metrics["recall_at_1"] == pytest.approx(r1.mean(), abs=1e-12)
    assert result.metrics["recall_at_5"] == pytest.approx(r5.mean(), abs=1e-12)
    np.testing.assert_allclose(result.evidence.values, ap, atol=1e-12)
    assert 0.05 < result.metrics["map_at_r"] < 0.95  # neither trivial nor chance
    assert result.diagnostics["depth"] == 400 and result.warnings == []


@pytest.mark.parametrize("stream_rows", [None, 13])
def test_exact_ties_rank_the_lower_train_row_first(stream_rows):
    X_tr, y_tr, X_te, y_te = tied(600, 120, 10, 12, seed=2)
    result = run(X_tr, y_tr, X_te, y_te, stream_rows)
    ap, r1, r5 = brute_force(X_tr, y_tr, X_te, y_te)
    np.testing.assert_allclose(result.evidence.values, ap, atol=1e-12)
    assert result.metrics["recall_at_1"] == pytest.approx(r1.mean(), abs=1e-12)
    assert result.metrics["recall_at_5"] == pytest.approx(r5.mean(), abs=1e-12)


def test_a_query_without_train_items_of_its_class_is_left_out_visibly():
    X_tr, y_tr, X_te, y_te = clustered(300, 60, 8, [100, 100, 100], seed=3)
    y_te = y_te.copy()
    y_te[:7] = 3  # a class the train split lacks
    result = run(X_tr, y_tr, X_te, y_te)
    ap, _, _ = brute_force(X_tr, y_tr, X_te, y_te)
    assert np.isnan(result.evidence.values[:7]).all()
    assert result.metrics["map_at_r"] == pytest.approx(np.nanmean(ap), abs=1e-12)
    assert [w["code"] for w in result.warnings] == ["no_relevant"]
    assert "7 of 60 queries" in result.warnings[0]["message"]


def test_r_beyond_max_rank_is_a_lower_bound_and_flagged_unreliable():
    X_tr, y_tr, X_te, y_te = clustered(400, 50, 8, [300, 100], seed=4, spread=1.5)
    full = run(X_tr, y_tr, X_te, y_te)
    cut = run(X_tr, y_tr, X_te, y_te, max_rank=150)
    assert cut.diagnostics["depth"] == 150 and cut.diagnostics["rank_truncated"] == int((y_te == 0).sum())
    assert [w["code"] for w in cut.warnings] == ["rank_truncated"]
    assert cut.metrics["map_at_r"] <= full.metrics["map_at_r"]
    small = y_te == 1  # R = 100 <= 150: those queries are exact
    np.testing.assert_allclose(cut.evidence.values[small], full.evidence.values[small], atol=1e-12)
    with pytest.raises(ValueError, match="max_rank"):
        RETRIEVAL.resolve({"max_rank": 2})


@pytest.mark.parametrize("N, R", [(7, 3), (9, 1), (8, 8), (10, 4)])
def test_chance_is_the_mean_ap_at_r_over_every_placement(N, R):
    aps = []
    for relevant in itertools.combinations(range(N), R):
        rel = np.zeros(N, bool)
        rel[list(relevant)] = True
        precision = np.cumsum(rel) / np.arange(1, N + 1)
        aps.append(sum(precision[i] for i in range(R) if rel[i]) / R)
    assert random_map_at_r(np.array([R]), N) == pytest.approx(np.mean(aps), rel=1e-12)


def test_chance_averages_over_queries_and_flags_a_random_encoder():
    rng = np.random.default_rng(5)
    y_tr, y_te = rng.integers(0, 4, 400), rng.integers(0, 4, 300)
    X_tr, X_te = rng.normal(size=(400, 16)).astype(np.float32), rng.normal(size=(300, 16)).astype(np.float32)
    R = np.bincount(y_tr, minlength=4)[y_te]
    expected = np.mean([random_map_at_r(np.array([r]), 400) for r in R])
    result = run(X_tr, y_tr, X_te, y_te)
    assert result.diagnostics["chance"] == pytest.approx(expected, rel=1e-12)
    assert expected < np.mean(R / 400)  # the expected R-precision is no chance level for AP@R
    # a score at or below chance is unreliable; a clustered encoder's is far above it
    at_chance = result.metrics["map_at_r"] <= expected
    assert at_chance == any(w["code"] == "at_chance" for w in result.warnings)
    good = run(*clustered(400, 100, 16, [100] * 4, seed=6))
    assert good.metrics["map_at_r"] > 5 * good.diagnostics["chance"]
    assert not any(w["code"] == "at_chance" for w in good.warnings)


def test_evidence_pairs_on_queries_and_gallery():
    X_tr, y_tr, X_te, y_te = clustered(300, 40, 8, [150, 150], seed=7)
    ev = run(X_tr, y_tr, X_te, y_te).evidence
    assert ev.kind == "values" and ev.metric == "map_at_r" and ev.values.shape == (40,)
    assert ev.fingerprint == values_fingerprint(y_te, y_tr)
    assert ev.record("k", "s")["values_fingerprint"] == ev.fingerprint
    assert values_fingerprint(y_te, y_tr[::-1]) != ev.fingerprint  # another gallery: not paired


def test_the_entry_declares_its_kind_and_headline():
    assert RETRIEVAL.kind == "retrieval" and RETRIEVAL.primary_metric == "map_at_r"
    assert RETRIEVAL.metric_kind.evidence == ("values",)
    assert set(RETRIEVAL.setting_help) == set(RETRIEVAL.defaults)


def test_two_encoders_compare_query_by_query():
    from pipeline.analysis.compare import compare_values

    X_tr, y_tr, X_te, y_te = clustered(600, 150, 16, [200, 150, 150, 100], seed=8)
    noisy = np.random.default_rng(9)
    good = run(X_tr, y_tr, X_te, y_te)
    bad = run(X_tr + 2 * noisy.normal(size=X_tr.shape).astype(np.float32), y_tr,
              X_te + 2 * noisy.normal(size=X_te.shape).astype(np.float32), y_te)
    assert good.evidence.fingerprint == bad.evidence.fingerprint  # the same queries and gallery: paired
    c = compare_values(good.evidence.values, bad.evidence.values, "map_at_r", n_resamples=200)
    assert c.metric == "map_at_r" and c.test == "paired-t" and c.n == 150
    assert c.difference == pytest.approx(good.metrics["map_at_r"] - bad.metrics["map_at_r"], abs=1e-12)
    assert c.difference > 0 and c.p_value < 1e-3 and c.ci_low > 0
