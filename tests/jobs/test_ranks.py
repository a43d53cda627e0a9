"""Rank agreement between protocol settings from ledger records: the ranks, the pairs'
statistics (checked against scipy), the report section and ``repeval results --ranks``."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from flows.cli.main import main
from jobs.analysis.ranks import best_layer_scores, rank_agreement_of, rank_rows
from jobs.report import write_report
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.records import make_config, make_record

MODELS = ["m0", "m1", "m2", "m3", "m4"]
LINEAR = dict(zip(MODELS, (0.50, 0.60, 0.70, 0.80, 0.90)))
KNN = dict(zip(MODELS, (0.45, 0.65, 0.55, 0.85, 0.75)))  # some pairs flipped against linear
FEW = dict(zip(MODELS, (0.30, 0.30, 0.40, 0.20, 0.50)))  # a tie


def _records(extra=()):
    recs = []
    for setting, scores in (("linear", LINEAR), ("knn20", KNN), ("fs20", FEW)):
        # each record carries its protocol's headline (few-shot's is ``mean``) as evaluation writes it
        recs += [make_record(m, "pets", setting, {"score": s, "top1": s, "mean": s}) for m, s in scores.items()]
    # a worse layer is not the encoder's score; a better one is
    recs.append(make_record("m0", "pets", "linear", {"score": 0.10}, layer="block3"))
    recs.append(make_record("m1", "pets", "knn20", {"score": 0.95}, layer="block3"))
    recs.append(make_record("m2", "pets", "audit", {"violations": 0}))  # no score: not ranked
    return recs + list(extra)


def test_ranks_are_of_each_encoders_best_layer():
    best = best_layer_scores(_records())
    assert best[("m0", "pets", "linear")] == (0.50, "pre_logits")
    assert best[("m1", "pets", "knn20")] == (0.95, "block3")
    assert ("m2", "pets", "audit") not in best
    rows = {(r["setting"], r["model"]): r for r in rank_rows(_records())}
    assert rows[("linear", "m4")]["rank"] == 1 and rows[("linear", "m0")]["rank"] == 5
    assert rows[("knn20", "m1")]["rank"] == 1 and rows[("knn20", "m1")]["layer"] == "block3"
    assert rows[("fs20", "m0")]["rank"] == rows[("fs20", "m1")]["rank"] == 3.5  # tied: the average rank
    assert [r["setting"] for r in rank_rows(_records())][::5] == ["linear", "knn20", "fs20"]


def test_pairs_are_scipys_kendall_and_spearman_and_count_flips():
    (agreement,) = rank_agreement_of(_records(), n_bootstrap=200, seed=1)
    assert agreement.dataset == "pets" and agreement.settings == ["linear", "knn20", "fs20"]
    knn = {**KNN, "m1": 0.95}
    for p in agreement.pairs:
        a, b = ({"linear": LINEAR, "knn20": knn, "fs20": FEW}[p[k]] for k in ("setting_a", "setting_b"))
        x, y = [a[m] for m in MODELS], [b[m] for m in MODELS]
        assert p["kendall_tau"] == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
        assert p["spearman_rho"] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
        flips = sum(1 for i in range(5) for j in range(i + 1, 5) if (x[i] - x[j]) * (y[i] - y[j]) < 0)
        assert p["flips"] == flips and p["n_pairs"] == 10
        assert p["kendall_ci"][0] <= p["kendall_tau"] <= p["kendall_ci"][1]
    assert agreement.ranks["linear"]["m4"] == 1.0


def test_a_pair_that_cannot_be_compared_says_why():
    two = [make_record(m, "flowers", s, {"score": v}) for s in ("linear", "knn20")
           for m, v in zip(MODELS[:2], (0.4, 0.6))]
    flat = [make_record(m, "cifar10", s, {"score": 0.5 if s == "knn20" else v}) for s in ("linear", "knn20")
            for m, v in zip(MODELS[:3], (0.4, 0.5, 0.6))]
    by_dataset = {a.dataset: a for a in rank_agreement_of(_records(two + flat), n_bootstrap=0)}
    assert not by_dataset["flowers"].pairs and "share 2 scored encoder(s)" in by_dataset["flowers"].skipped[0][2]
    assert "gives all 3 encoders the same score" in by_dataset["cifar10"].skipped[0][2]
    assert by_dataset["pets"].pairs[0]["kendall_ci"] is None  # no bootstrap asked


def test_report_has_the_rank_agreement_section(tmp_path):
    config = make_config(MODELS, correlation={"settings": [], "bootstrap": 50})
    reference = dict(zip(MODELS, (0.7, 0.6, 0.8, 0.75, 0.9)))
    text = open(write_report(_records(), None, config, str(tmp_path / "r.html"), reference=reference),
                encoding="utf-8").read()
    ranks = text[text.index('<section id="ranks">'):]
    ranks = ranks[:ranks.index("</section>")]
    (agreement,) = rank_agreement_of(_records(), n_bootstrap=50)
    for p in agreement.pairs:
        assert f"{p['setting_a']} vs {p['setting_b']}" in ranks
        assert f"{p['flips']} of 10" in ranks
    images = [s for s in ranks.split('src="')[1:]]
    assert len(images) == 2  # the Kendall matrix and the radar chart (reference + three settings)
    for src in images:
        Image.open(io.BytesIO(base64.b64decode(src.split('"')[0].split(",", 1)[1]))).verify()


def test_results_ranks_prints_the_ranks_and_the_agreement(tmp_path, capsys):
    store = FeatureStore(str(tmp_path / "store"))
    ledger = Ledger(store)
    for rec in _records():
        ledger.put(rec)
    assert main(["results", "--store", store.url, "--ranks"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["dataset", "setting", "rank", "model", "layer", "score"]
    assert lines[1].split() == ["pets", "linear", "1", "m4", "pre_logits", "0.9000"]
    assert ["pets", "knn20", "1", "m1", "block3", "0.9500"] in [line.split() for line in lines]
    tau = stats.kendalltau([LINEAR[m] for m in MODELS], [{**KNN, "m1": 0.95}[m] for m in MODELS]).statistic
    pair = next(line.split() for line in lines if "linear vs knn20" in line)
    assert pair[:6] == ["pets", "linear", "vs", "knn20", "5", f"{tau:.3f}"] and pair[-3:] == ["4", "of", "10"]
    assert "1000 bootstrap resamples over encoders" in out
    path = tmp_path / "ranks.json"
    assert main(["results", "--store", store.url, "--ranks", "--format", "json", "--output", str(path)]) == 0
    written = json.loads(path.read_text())
    assert len(written) == 15 and {r["rank"] for r in written if r["setting"] == "fs20"} == {1.0, 2.0, 3.5, 5.0}
    assert main(["results", "--store", store.url, "--ranks", "--format", "parquet", "--output", str(path)]) == 2
    assert np.isfinite(tau)
