"""``repeval compare`` on a small real store, every number checked against a direct
computation from the stored predictions and episode accuracies."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from flows.cli.main import main
from pipeline.analysis.compare import labels_fingerprint
from storage_schema.evidence import read_evidence
from tests.helpers.evidence import DATASET, SETTINGS, evaluate_all, noisy_encoders, put_labels

QUICK = {k: SETTINGS[k] for k in ("knn", "ridge", "few", "low")}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    store = noisy_encoders(root, {"clean": 0.0, "twin": 0.02, "noisy": 6.0})
    return store, str(root / "store"), evaluate_all(store, ["clean", "twin", "noisy"], QUICK)


def _json(capsys, *args) -> dict:
    assert main(["compare", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _bh(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values by their definition: min over j >= i of p_(j) m / j."""
    order = np.argsort(p)
    m = p.size
    ranked = p[order] * m / np.arange(1, m + 1)
    out = np.empty(m)
    out[order] = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
    return out


def test_compare_gives_the_direct_statistics_of_every_cell(compared, capsys):
    store, url, records = compared
    out = _json(capsys, "clean", "noisy", "--store", url, "--resamples", "200")
    cells = {c["setting"]: c for c in out["cells"]}
    assert set(cells) == set(QUICK) and out["not_compared"] == []
    y = store.labels(DATASET, "test").read()
    for setting in ("knn", "ridge"):
        a = read_evidence(store, records["clean", setting]["evidence"])
        b = read_evidence(store, records["noisy", setting]["evidence"])
        a_only, b_only = int(np.sum((a == y) & (b != y))), int(np.sum((b == y) & (a != y)))
        c = cells[setting]
        assert (c["a_only"], c["b_only"]) == (a_only, b_only) and c["test"] == "mcnemar-exact"
        assert c["p_value"] == pytest.approx(stats.binomtest(min(a_only, b_only), a_only + b_only).pvalue, rel=1e-9)
        assert c["score_a"] == records["clean", setting]["metrics"]["score"]
        assert c["score_b"] == records["noisy", setting]["metrics"]["score"]
        assert c["ci_low"] < c["difference"] < c["ci_high"]
        exact = stats.binomtest(a_only, a_only + b_only).proportion_ci(method="exact")  # the test's own interval
        scale = (a_only + b_only) / y.size
        assert (c["test_ci_low"], c["test_ci_high"]) == pytest.approx((scale * (2 * exact.low - 1),
                                                                      scale * (2 * exact.high - 1)), rel=1e-9)
        assert c["agreement"] is None  # clean beats noisy by far: interval and verdict read alike
    fa = read_evidence(store, records["clean", "few"]["evidence"])
    fb = read_evidence(store, records["noisy", "few"]["evidence"])
    assert cells["few"]["p_value"] == pytest.approx(stats.ttest_rel(fa, fb).pvalue, rel=1e-9)
    assert cells["few"]["score_a"] == records["clean", "few"]["metrics"]["score"]
    la = read_evidence(store, records["clean", "low"]["evidence"])[-3:]  # the 3 fits of N = 8
    lb = read_evidence(store, records["noisy", "low"]["evidence"])[-3:]
    fit_a, fit_b = (la == y).mean(axis=0), (lb == y).mean(axis=0)
    assert cells["low"]["test"] == "paired-t" and cells["low"]["score_a"] == pytest.approx(
        records["clean", "low"]["metrics"]["score"], abs=1e-15)
    assert cells["low"]["p_value"] == pytest.approx(stats.ttest_rel(fit_a, fit_b).pvalue, rel=1e-9)
    p = np.array([c["p_value"] for c in out["cells"]])
    np.testing.assert_allclose([c["p_adjusted"] for c in out["cells"]], _bh(p), rtol=1e-12)
    assert all(c["verdict"] == "better" for c in out["cells"])  # noise costs accuracy on every cell


def test_identical_quality_is_indistinguishable_and_a_line_per_setting(compared, capsys):
    _, url, _ = compared
    out = _json(capsys, "clean", "twin", "--store", url, "--setting", "knn", "--setting", "few")
    assert {c["setting"] for c in out["cells"]} == {"knn", "few"}
    assert all(c["verdict"] == "indistinguishable" for c in out["cells"])
    assert main(["compare", "noisy", "clean", "--store", url]) == 0
    text = capsys.readouterr().out
    for setting in QUICK:
        assert f"{setting}: noisy better on 0, worse on 1, indistinguishable on 0 of 1 cell(s)" in text
    assert "worse" in text and "mcnemar-exact" in text and "test's interval" in text and "discordant)" in text


def test_stale_labels_refuse_the_comparison_and_name_why(compared, tmp_path, capsys):
    store, url, records = compared
    assert main(["compare", "clean", "nobody", "--store", url]) == 2
    assert "no records of encoder 'nobody'; encoders with records: clean, noisy, twin" in capsys.readouterr().err
    # the test labels are rewritten (another dataset under the same name): every cell that
    # pairs on them is refused, with the reason; few-shot episodes pair on their own fingerprint
    y = store.labels(DATASET, "test").read()
    put_labels(store, DATASET, "test", y[::-1].copy())
    assert labels_fingerprint(store.labels(DATASET, "test").read()) != records["clean", "knn"]["evidence"][
        "labels_fingerprint"]
    out = _json(capsys, "clean", "noisy", "--store", url)
    refused = {n["cell"]: n["reason"] for n in out["not_compared"]}
    assert set(refused) == {f"{s}/{DATASET}/pre_logits" for s in ("knn", "ridge", "low")}
    assert all("changed since" in r and "stale fingerprint" in r for r in refused.values())
    assert [c["setting"] for c in out["cells"]] == ["few"]
    put_labels(store, DATASET, "test", y)  # back as it was, for the other tests
