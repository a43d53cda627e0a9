"""The top of a setting on a dataset: the best cell and the cells its test images cannot
tell from it, checked against McNemar's exact test written out (a binomial test of the
discordant pairs, scipy) and the Benjamini-Hochberg formula; the score printed with the
decimals its standard error supports.

The store holds digits pixels as four "encoders": ``clean``, two a little noisier
(``near-a``, ``near-b``, within a point of it) and ``noisy`` (far below).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from jobs.analysis.leaders import percent_at_precision, top_group
from jobs.evaluation.evaluate import Cell, evaluate_cell
from tests.helpers.evidence import DATASET, evaluate_all, noisy_encoders

NOISE = {"clean": 0.0, "near-a": 0.6, "near-b": 0.9, "noisy": 6.0}
SETTINGS = {"logistic": ("logistic", {"Cs": None, "C": 1.0, "max_iter": 300}), "ridge": ("ridge", {})}


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    store = noisy_encoders(tmp_path_factory.mktemp("leaders"), NOISE)
    return store, evaluate_all(store, list(NOISE), SETTINGS)


def _bh(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg written out: adjusted_(i) = min over j >= i of m p_(j) / j."""
    order = np.argsort(p)
    m = p.size
    adjusted = np.minimum.accumulate((m * p[order] / np.arange(1, m + 1))[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def _predictions(store, rec) -> np.ndarray:
    return store.open_array(rec["evidence"]["key"]).read()


def test_the_group_is_every_cell_not_significantly_worse_than_the_best(cells):
    store, records = cells
    group = top_group(store, records.values(), "logistic", DATASET)
    scores = {model: records[model, "logistic"]["metrics"]["score"] for model in NOISE}
    best = max(scores, key=scores.get)
    assert group.best == f"{best} pre_logits" and group.score == scores[best]
    # McNemar's exact test by hand: the discordant pairs, a two-sided binomial test at 1/2
    y = store.open_array(records[best, "logistic"]["evidence"]["labels"]).read()
    right = {m: _predictions(store, records[m, "logistic"]) == y for m in NOISE}
    others = [m for m in NOISE if m != best]
    p = np.array([binomtest(int((right[best] & ~right[m]).sum()),
                            int((right[best] ^ right[m]).sum()), 0.5).pvalue for m in others])
    tied = {best} | {m for m, q in zip(others, _bh(p)) if q > 0.05}
    assert group.tied == tuple(sorted((m, "pre_logits") for m in tied))
    assert group.n == y.size and not group.left_out
    # the fact the test stands on: the near ones are tied, the noisy one is not
    assert ("noisy", "pre_logits") not in group.tied and len(group.tied) >= 2
    # printed: the score at its precision, no member named (one at the edge would come and go)
    assert group.line() == (f"best logistic accuracy on {DATASET}: {percent_at_precision(group.score, y.size)} % of "
                            f"{y.size} test images (no single encoder is best: layers of several are within noise "
                            "of the top by McNemar's test, BH 5 %)")
    assert group.to_dict()["tied"] == [f"{m} pre_logits" for m in sorted(tied)]
    assert group.test == "mcnemar-exact" and group.to_dict()["test"] == "mcnemar-exact"


def test_one_encoders_layers_tied_name_the_encoder(cells, tmp_path):
    store, records = cells
    noisy_encoders(tmp_path, {"clean": 0.3}, store=store, layer="block3")  # a second layer of clean
    block3 = evaluate_cell(store, Cell("clean", DATASET, "block3", "logistic", *SETTINGS["logistic"])).record
    group = top_group(store, [records["clean", "logistic"], records["noisy", "logistic"], block3], "logistic", DATASET)
    assert group.tied == (("clean", "block3"), ("clean", "pre_logits"))
    assert group.line().endswith("test images (clean, its layers block3 and pre_logits tied; every other encoder's "
                                 "layers are significantly below by McNemar's test, BH 5 %)")


def test_an_unreliable_cell_is_left_out_and_named(cells):
    store, records = cells
    assert [w["code"] for w in records["noisy", "ridge"]["warnings"]] == ["grid_edge"]  # the fact
    group = top_group(store, records.values(), "ridge", DATASET)
    assert len(group.left_out) == 1 and group.left_out[0].startswith("noisy pre_logits: grid_edge: ")
    assert all(model != "noisy" for model, _ in group.tied)
    assert group.line().endswith("; 1 unreliable cell(s) left out")


def test_no_trusted_cell_gives_no_group(cells):
    store, records = cells
    assert top_group(store, records.values(), "logistic", "another-dataset") is None
    only_noisy = [records["noisy", "ridge"]]
    assert top_group(store, only_noisy, "ridge", DATASET) is None


def test_one_cell_alone_is_its_own_group(cells):
    store, records = cells
    group = top_group(store, [records["clean", "logistic"]], "logistic", DATASET)
    assert group.tied == (("clean", "pre_logits"),) and group.n == 540
    assert group.line().endswith("test images (clean pre_logits; every other layer is significantly below it by "
                                 "McNemar's test, BH 5 %)")


@pytest.mark.parametrize(("score", "n", "text"), [
    (0.929, 450, "93"),      # standard error 1.2 points: whole points
    (0.9312, 45_000, "93.1"),  # 0.12 points: one decimal
    (0.93123, 4_500_000, "93.12"),
    (1.0, 100, "100"),       # no spread: at least 1/n (one point)
    (0.5, 10, "50"),         # 16 points: still whole points, never tens
])
def test_the_printed_score_has_the_decimals_its_standard_error_supports(score, n, text):
    assert percent_at_precision(score, n) == text
