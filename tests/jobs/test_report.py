"""The HTML report: written, parseable, every section present, escaped, plots decodable."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser

import pytest
from PIL import Image

from jobs.analysis.correlate import correlate_results
from jobs.report import BEST_MARKER, write_report
from jobs.report.inputs import named
from tests.helpers.records import (
    DATASETS, MODELS, logistic_diagnostics, logistic_metrics, make_config, make_record, synthetic_scores,
)

EVIL = "<script>alert(1)</script>"
SECTIONS = ("summary", "overview", "accuracy", "layers", "lowshot", "correlation", "ranks", "invariance",
            "calibration", "warnings", "provenance")
MAPS = ("rotation", "isotropic_scale", "translation", "per_feature_scale", "affine")


class _Page(HTMLParser):
    """Collects ids, links, images, score cells and the text of the warnings section."""

    def __init__(self):
        super().__init__()
        self.ids, self.hrefs, self.images, self.cells = set(), [], [], []
        self.stack, self.section, self.section_text = [], None, {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in ("img", "meta"):
            self.stack.append(tag)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "section":
            self.section = a.get("id")
        if tag == "a":
            self.hrefs.append(a["href"])
        if tag == "img":
            self.images.append(a["src"])
        if tag == "td" and "data-table" in a:
            self.cells.append(a)

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"unbalanced </{tag}>"

    def handle_data(self, data):
        if self.section:
            self.section_text[self.section] = self.section_text.get(self.section, "") + data


def _invariance_records(violation):
    cells = []
    for proto, expected in (("ridge_bias", [True, False, True, False, False]),
                            ("knn_cosine", [True, True, False, False, False])):
        for mp, exp in zip(MAPS, expected):
            changed = 7 if (not exp or (violation and proto == "knn_cosine" and mp == "rotation")) else 0
            cells.append({"protocol": proto, "map": mp, "expected_invariant": exp, "n_changed": changed,
                          "n_test": 200, "fraction_changed": changed / 200, "accuracy_before": 0.71,
                          "accuracy_after": 0.70 if changed else 0.71, "consistent": not (exp and changed)})
    return {"records": cells, "violations": sum(1 for c in cells if not c["consistent"])}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    models = MODELS[:4]
    ref, acc = synthetic_scores(models)
    recs = [make_record(m, d, "linear", logistic_metrics(a), diagnostics=logistic_diagnostics())
            for (m, d), a in acc.items()]
    # a non-converged fit, and an untrusted model name from a checkpoint folder
    recs.append(make_record("vit-b", "cifar10", "linear", logistic_metrics(0.5), converged=False,
                            diagnostics=logistic_diagnostics(False), layer="block3",
                            warnings=["L-BFGS stopped at max_iter=1000 before tol=1e-4"]))
    recs.append(make_record(EVIL, "pets", "knn20", {"top1": 0.4, "mean_per_class": 0.4, "score": 0.4}))
    recs += [make_record(m, d, "knn20", {"top1": s, "mean_per_class": s, "score": s})
             for m, s in zip(models, (0.61, 0.64, 0.66, 0.60)) for d in DATASETS[:2]]
    recs += [make_record(m, "pets", "fs20", {"score": s, "mean": s, "ci95": 0.012, "std": 0.15})
             for m, s in zip(models, (0.80, 0.83, 0.86, 0.81))]
    for i, m in enumerate(models):
        curve = {str(n): min(0.95, 0.2 + 0.1 * k + 0.02 * i) for k, n in enumerate((1, 2, 4, 8, 16))}
        curve["all"] = 0.8 + 0.02 * i
        recs.append(make_record(m, "flowers", "lowshot", {"curve": curve, "curve_std": {k: 0.01 for k in curve},
                                                          "score": curve["all"]}))
    recs.append(make_record("vit-s", "pets", "audit", _invariance_records(violation=True),
                            diagnostics={"n_train_used": 500, "dims_used": 120, "dims_stored": 512}))
    config = make_config(models, report={"baseline": "vit-s"},
                         correlation={"settings": [
                             {"name": "many-shot linear", "protocol": "linear", "datasets": DATASETS},
                             {"name": "knn", "protocol": "knn20", "datasets": DATASETS},  # too few models
                         ], "bootstrap": 100})
    corr = correlate_results(recs, config, ref)
    path = write_report(recs, corr, config, str(tmp_path_factory.mktemp("report") / "out" / "report.html"),
                        reference=ref)
    text = open(path, encoding="utf-8").read()
    page = _Page()
    page.feed(text)
    page.close()
    return {"path": path, "text": text, "page": page, "records": recs}


def test_written_and_every_section_present(report):
    assert report["path"].endswith("report.html")
    page = report["page"]
    assert not page.stack, f"unclosed tags: {page.stack}"
    for sid in SECTIONS:
        assert sid in page.ids


def test_every_provenance_link_resolves(report):
    page = report["page"]
    cell_links = [h[1:] for h in page.hrefs if h.startswith("#cell-")]
    assert cell_links and all(h in page.ids for h in cell_links)
    for rec in report["records"]:
        assert f"cell-{rec['cell_id']}" in page.ids
    text = report["text"]
    assert '<details id="cell-' in text and "weights_fingerprint" in text and "data_config" in text


def test_best_per_column_is_marked_on_the_right_cell(report):
    best = {(c["data-table"], c["data-dataset"]): c["data-model"] for c in report["page"].cells
            if c.get("class") == "best"}
    _, acc = synthetic_scores(MODELS[:4])
    for d in DATASETS:
        want = max(MODELS[:4], key=lambda m: acc[(m, d)])
        assert best[("linear@pre_logits", d)] == want
    assert best[("knn20@pre_logits", "pets")] == "vit-s"  # 0.66
    assert best[("fs20@pre_logits", "pets")] == "vit-s"
    assert report["text"].count(f'<span class="best-marker">{BEST_MARKER}</span>') == len(best)
    assert "86.0 \u00b1 1.2" in report["text"]  # few-shot: mean \u00b1 ci95 in %


def test_plots_decode(report):
    pngs = [s for s in report["page"].images if s.startswith("data:image/png;base64,")]
    text = report["text"]
    ranks = text[text.index('<section id="ranks">'):]
    ranks = ranks[:ranks.index("</section>")]  # Kendall matrices and radar charts: tests/jobs/test_ranks.py
    assert len(pngs) == 2 + ranks.count("data:image/png")  # one low-shot figure (flowers), one correlation scatter
    for src in pngs:
        img = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        img.verify()
        assert img.format == "PNG"


def test_sections_say_what_they_should(report):
    text = report["page"].section_text
    assert "not enough models (n=" in text["correlation"]
    assert "violation" in text["invariance"] and "violations: 1" in text["invariance"]
    assert "ECE" in text["calibration"] and "1.400" in text["calibration"]
    assert 'class="violation"' in report["text"]


def _contents(text: str) -> list[str]:
    nav = text[text.index("<nav>"):text.index("</nav>")]
    return re.findall(r'href="#([^"]+)"', nav)


def test_the_contents_list_the_sections_with_content_and_each_link_lands(report):
    listed = _contents(report["text"])
    assert all(sid in report["page"].ids for sid in listed)
    assert listed == ["summary", "accuracy", "layers", "lowshot", "correlation", "ranks", "invariance",
                      "calibration", "warnings", "provenance"]  # in page order; nothing failed, no series


def test_the_contents_leave_out_empty_sections(tmp_path):
    models = MODELS[:2]
    recs = [make_record(m, "pets", "knn20", {"top1": s, "mean_per_class": s, "score": s})
            for m, s in zip(models, (0.5, 0.7))]
    path = write_report(recs, None, make_config(models, correlation={"settings": []}), str(tmp_path / "r.html"))
    text = open(path, encoding="utf-8").read()
    assert _contents(text) == ["summary", "accuracy", "provenance"]
    for empty in ("lowshot", "invariance", "finetune", "diagnostics", "calibration", "warnings", "failed", "data",
                  "dense", "correlation", "series", "layers"):
        assert f'<section id="{empty}"' not in text  # a section with nothing to show is not rendered


def test_non_converged_record_is_listed(report):
    warn = report["page"].section_text["warnings"]
    assert "vit-b/cifar10/block3:linear" in warn
    assert "L-BFGS stopped at max_iter=1000" in warn


def test_untrusted_names_are_escaped(report):
    text = report["text"]
    assert EVIL not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert EVIL in report["page"].section_text["accuracy"]  # shown, as text


def test_without_correlation_or_optional_sections(tmp_path):
    models = MODELS[:2]
    recs = [make_record(m, "pets", "knn20", {"top1": s, "mean_per_class": s, "score": s})
            for m, s in zip(models, (0.5, 0.7))]
    config = make_config(models, correlation={"settings": []})
    path = write_report(recs, None, config, str(tmp_path / "r.html"), reference={models[0]: 0.7})
    page = _Page()
    page.feed(open(path, encoding="utf-8").read())
    text = page.section_text
    assert {"summary", "overview", "accuracy", "correlation", "provenance"} <= page.ids and not page.images
    assert "No correlation was computed" in text["correlation"] and "70.0" in text["correlation"]
    assert not {"lowshot", "invariance", "warnings", "failed", "calibration"} & page.ids  # nothing to show
    assert "Nothing failed and every score can back a verdict" in text["summary"]
    assert [c["data-model"] for c in page.cells if c.get("class") == "best"] == [models[1]]


def _score(m, d, setting, value, **kw):
    return make_record(m, d, setting, {"top1": value, "mean_per_class": value, "score": value}, **kw)


def test_failures_come_first_then_data_problems(tmp_path):
    models = MODELS[:2]
    config = make_config(models, correlation={"settings": []})
    failures = [{"kind": "cell", "label": "r18-a/pets/pre_logits:fs20", "attempts": 2,
                 "reason": "DataValidationError: n_way=5 needs at least 5 classes, but y has only 4"},
                {"kind": "checkpoint", "label": "checkpoint /ck/bad.safetensors", "attempts": 1,
                 "reason": "CheckpointError: safetensors checkpoint 'bad.safetensors' is truncated"}]
    notes = [{"where": "pets/train", "what": "2 unreadable image(s) left out (skip_bad)",
              "items": ["cat/broken.jpg", "dog/empty.png"]}]
    path = write_report([_score(models[0], "pets", "knn20", 0.5)], None, config, str(tmp_path / "r.html"),
                        failures=failures, data_notes=notes, waiting=["/ck/half-written.safetensors"])
    page = _Page()
    text = open(path, encoding="utf-8").read()
    page.feed(text)
    assert text.index('<section id="failed" class="failing">') < text.index('<section id="overview">')
    failed = page.section_text["failed"]
    assert "2 failure(s)" in failed and "r18-a/pets/pre_logits:fs20" in failed and "is truncated" in failed
    data = page.section_text["data"]
    assert "pets/train: 2 unreadable image(s)" in data and "cat/broken.jpg" in data
    assert "half-written.safetensors is still being written" in data


def test_best_layer_per_encoder(tmp_path):
    models = MODELS[:2]
    recs = [_score(models[0], "pets", "knn20", 0.5), _score(models[0], "pets", "knn20", 0.7, layer="block3"),
            _score(models[1], "pets", "knn20", 0.6), _score(models[1], "pets", "knn20", 0.4, layer="block3"),
            _score(models[0], "pets", "linear", 0.8)]  # one layer only: not listed
    path = write_report(recs, None, make_config(models, correlation={"settings": []}), str(tmp_path / "r.html"))
    page = _Page()
    text = open(path, encoding="utf-8").read()
    page.feed(text)
    layers = text[text.index('<section id="layers">'):]
    layers = layers[:layers.index("</section>")]
    assert f'data-layer="block3" data-model="{models[0]}"' in layers
    assert f'data-layer="pre_logits" data-model="{models[1]}"' in layers
    assert "70.0" in layers and "(block3)" in layers and "60.0" in layers and "(pre_logits)" in layers
    assert "linear (" not in page.section_text["layers"]
    assert {"acc-knn20-pre_logits", "acc-knn20-block3"} <= page.ids  # a table per layer


def test_two_names_sharing_one_record_each_keep_their_row(tmp_path):
    """Identical weights under two names: one ledger record, shown under both names."""
    rec = _score("mine-ep2", "pets", "knn20", 0.55)
    shared = named(rec, {"model": "mine-ep2-pth", "dataset": "pets", "layer": "pre_logits", "setting": "knn20"})
    config = make_config(["mine-ep2", "mine-ep2-pth"], correlation={"settings": []})
    path = write_report([rec, shared], None, config, str(tmp_path / "r.html"))
    page = _Page()
    page.feed(open(path, encoding="utf-8").read())
    rows = {c["data-model"] for c in page.cells if c["data-table"] == "knn20@pre_logits"}
    assert rows == {"mine-ep2", "mine-ep2-pth"}
    links = [h[1:] for h in page.hrefs if h.startswith("#cell-")]
    assert len(set(links)) == 2 and all(h in page.ids for h in links)
    assert "&quot;recorded_as&quot;: &quot;mine-ep2&quot;" in open(path, encoding="utf-8").read()


def test_relative_curve_needs_the_baseline_shots(tmp_path):
    models = MODELS[:2]
    full = {"1": 0.3, "4": 0.5, "all": 0.8}
    recs = [make_record(models[0], "pets", "lowshot", {"curve": {"1": 0.3, "all": 0.8}, "score": 0.8}),
            make_record(models[1], "pets", "lowshot", {"curve": full, "score": 0.8})]
    config = make_config(models, correlation={"settings": []}, report={"baseline": models[0]})
    path = write_report(recs, None, config, str(tmp_path / "r.html"))
    page = _Page()
    page.feed(open(path, encoding="utf-8").read())
    assert f"{models[1]}: no relative curve" in page.section_text["lowshot"]


def test_report_text_refers_to_no_missing_file(report):
    from tests.helpers.docs import dead_references

    dead = list(dead_references(report["text"], "report.html"))
    assert not dead, "the report refers to files the repository does not hold:\n" + "\n".join(map(str, dead))
