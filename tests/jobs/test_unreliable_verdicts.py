"""No verdict from an untrusted score: ``repeval compare``, a checkpoint series, the run
summary, its events and the report say ``unreliable: <reason>`` where one side's record
carries an ``unreliable`` fit warning, and still judge every other cell.

The store holds digits pixels as two "encoders": ``clean`` and ``noisy`` (heavy noise).
Ridge on the noisy pixels wants more shrinkage than its default grid's 1e4: its alpha
sits at the grid's end while PRESS still falls there (``grid_edge``), a degenerate fit.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flows.cli.main import main
from jobs.report.events import build_report_summary, event_payload
from jobs.analysis.compare import compare_encoders
from jobs.config import load_config
from jobs.report import write_report
from jobs.analysis.series import analyse_series
from jobs.report.run_summary import warning_lines
from pipeline.analysis.compare import benjamini_hochberg
from tests.helpers.evidence import DATASET, evaluate_all, noisy_encoders
from tests.helpers.html import parse_strict

SETTINGS = {"knn": ("knn", {"n_neighbors": 10}), "ridge": ("ridge", {})}
RIDGE = ("ridge", DATASET, "pre_logits")
KNN = ("knn", DATASET, "pre_logits")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny problems: on a shared 2-core runner torch's thread pool only adds wake-up latency."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    root = tmp_path_factory.mktemp("unreliable")
    store = noisy_encoders(root, {"clean": 0.0, "noisy": 6.0})
    records = evaluate_all(store, ["clean", "noisy"], SETTINGS)
    return store, str(root / "store"), records


def test_the_noisy_ridge_fit_is_degenerate(cells):
    _, _, records = cells
    rec = records["noisy", "ridge"]
    press = rec["diagnostics"]["press"]
    assert rec["diagnostics"]["alpha"] == 1e4 and press[-1] < press[-2]  # the fact: still falling at the edge
    assert [w["code"] for w in rec["warnings"]] == ["grid_edge"]
    assert records["clean", "ridge"]["warnings"] == [] and records["noisy", "knn"]["warnings"] == []


def test_compare_gives_no_verdict_on_the_degenerate_cell_and_judges_the_rest(cells):
    store, _, records = cells
    out = compare_encoders(store, list(records.values()), "clean", "noisy")
    ridge, knn = out.verdicts[RIDGE], out.verdicts[KNN]
    assert ridge.verdict == "unreliable" and ridge.text.startswith("unreliable: noisy grid_edge: alpha = 1e+04")
    assert math.isnan(ridge.p_adjusted) and ridge.to_dict()["p_adjusted"] is None
    assert knn.verdict == "better"
    # the family is the trusted cells only: one cell, its p-value unadjusted
    assert knn.p_adjusted == pytest.approx(float(benjamini_hochberg([knn.comparison.p_value])[0]), rel=1e-12)
    assert (out.settings["ridge"].unreliable, out.settings["ridge"].worse, out.settings["ridge"].better) == (1, 0, 0)
    assert math.isnan(out.settings["ridge"].mean_difference)


def test_the_compare_command_says_why(cells, capsys):
    _, url, _ = cells
    assert main(["compare", "noisy", "clean", "--store", url, "--resamples", "100"]) == 0
    text = capsys.readouterr().out
    assert "no verdict on 1 (unreliable)" in text
    assert f"ridge/{DATASET}/pre_logits: unreliable: noisy grid_edge: alpha = 1e+04" in text
    # the ridge setting's only cell has no verdict: no mean, and the line says why
    ridge_line = next(line for line in text.splitlines() if line.startswith("ridge: "))
    assert "no mean difference: no cell has a verdict" in ridge_line and "nan" not in text.lower()
    assert main(["compare", "noisy", "clean", "--store", url, "--resamples", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cell = {c["setting"]: c for c in out["cells"]}["ridge"]
    assert cell["verdict"] == "unreliable" and cell["p_adjusted"] is None and "grid_edge" in cell["reason"]
    assert {s["setting"]: s["mean_difference"] for s in out["settings"]}["ridge"] is None  # null, not NaN


def test_the_intervals_are_at_the_level_of_alpha(cells, capsys):
    from pipeline.analysis.compare.agreement import mcnemar_interval

    _, url, _ = cells
    assert main(["compare", "clean", "noisy", "--store", url, "--resamples", "100", "--alpha", "0.01"]) == 0
    text = capsys.readouterr().out
    assert "99% bootstrap" in text and "99% test's interval" in text and "intervals at 99 %" in text
    assert main(["compare", "clean", "noisy", "--store", url, "--resamples", "100", "--alpha", "0.01",
                 "--json"]) == 0
    knn = {c["setting"]: c for c in json.loads(capsys.readouterr().out)["cells"]}["knn"]
    assert knn["confidence"] == 0.99 and knn["test"] == "mcnemar-exact"
    assert (knn["test_ci_low"], knn["test_ci_high"]) == pytest.approx(
        mcnemar_interval(knn["a_only"], knn["b_only"], knn["n"], 0.99), rel=1e-12)
    wider = mcnemar_interval(knn["a_only"], knn["b_only"], knn["n"], 0.95)
    assert knn["test_ci_low"] < wider[0] and knn["test_ci_high"] > wider[1]


def test_results_show_the_warning_codes_and_why_a_score_is_untrusted(cells, capsys):
    _, url, _ = cells
    assert main(["results", "--store", url]) == 0
    text = capsys.readouterr().out
    lines = {tuple(line.split()[:4]): line for line in text.splitlines()}
    assert "warnings" in text.splitlines()[0]
    assert lines["noisy", DATASET, "pre_logits", "ridge"].split()[-2] == "grid_edge"
    assert lines["clean", DATASET, "pre_logits", "ridge"].split()[-2] == "-"
    assert f"unreliable: noisy/{DATASET}/pre_logits:ridge: grid_edge: alpha = 1e+04" in text


def _series_config(url: str):
    return load_config({
        "store": url,
        "encoders": [{"name": "clean", "source": "store", "series": "s", "step": 100},
                     {"name": "noisy", "source": "store", "series": "s", "step": 200}],
        "datasets": [{"name": DATASET, "adapter": "digits"}],
        "protocols": [{"name": name, "protocol": p, "settings": s} for name, (p, s) in SETTINGS.items()],
        "correlation": {"settings": []},
    })


def test_a_series_newest_checkpoint_regresses_only_where_both_scores_can_be_trusted(cells, tmp_path):
    store, url, records = cells
    cfg = _series_config(url)
    [series] = analyse_series(store, list(records.values()), cfg)
    assert series.newest.encoder == "noisy"
    assert series.check.regressed == (KNN,)  # knn: a true regression
    assert series.verdicts[RIDGE].verdict == "unreliable"
    assert series.unreliable == [{"cell": "/".join(RIDGE), "reason": series.verdicts[RIDGE].reason}]
    assert [r["cell"] for r in series.regressions()] == ["/".join(KNN)]
    summary = build_report_summary(list(records.values()), [], [series], evaluated=["noisy"])
    assert [r["cell"] for r in summary["regressions"]] == ["/".join(KNN)]
    flagged = {(w["encoder"], w["cell"]): w for w in summary["warnings"]}
    assert flagged["noisy", "/".join(RIDGE)]["unreliable"] and flagged["noisy", "/".join(RIDGE)]["codes"] == [
        "grid_edge"]
    assert summary["encoders"]["noisy"]["cells"]["/".join(RIDGE)]["warnings"] == ["grid_edge"]
    payload = event_payload({**summary, "changes": {}}, None)
    assert [r["cell"] for r in payload["regressions"]] == ["/".join(KNN)]
    assert payload["series"][0]["unreliable"][0]["cell"] == "/".join(RIDGE)
    assert payload["warnings"] == [{"encoder": "noisy", "cell": "/".join(RIDGE), "codes": ["grid_edge"],
                                    "unreliable": True}]
    lines = warning_lines(summary["warnings"])
    assert lines[0].startswith("WARNINGS: 1 record(s)") and "UNRELIABLE noisy ridge/" in lines[1]
    # the report: the untrusted cell on the first screen, red; no regression and no "best" from it
    path = write_report(list(records.values()), None, cfg, str(tmp_path / "r.html"), series=[series],
                        summary=summary)
    text = open(path, encoding="utf-8").read()
    parse_strict(text)
    assert text.index('<section id="summary">') < text.index('<section id="accuracy">')
    opening = text[text.index('<section id="summary">'):text.index('<section id="overview">')]
    assert "1 score(s) not to be trusted" in opening and "Not to be trusted (1)" in opening
    untrusted = opening[opening.index('id="untrusted"'):]
    assert f"noisy/{DATASET}/pre_logits:ridge" in untrusted and "grid_edge: alpha = 1e+04" in untrusted
    assert "significantly worse than the best so far on 1 of" in opening and f"knn/{DATASET}/pre_logits" in opening
    section = text[text.index('<section id="series">'):]
    assert "no verdict on 1 cell(s)" in section[:section.index("</section>")]
    assert "every score can back a verdict" not in text


def test_the_summary_of_trusted_records_says_so(cells, tmp_path):
    store, url, records = cells
    clean = [r for (m, _), r in records.items() if m == "clean"]
    summary = build_report_summary(clean, [], [])
    assert summary["warnings"] == [] and warning_lines(summary["warnings"]) == []
    path = write_report(clean, None, _series_config(url), str(tmp_path / "r.html"), summary=summary)
    assert "Nothing failed and every score can back a verdict" in open(path, encoding="utf-8").read()
    np.testing.assert_array_equal([r["metrics"]["score"] > 0.9 for r in clean], [True, True])
