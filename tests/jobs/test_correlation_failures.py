"""A correlation that cannot be computed never passes silently: a metric its protocol does
not record is refused when the config is checked (naming the ones it does), an unnamed
metric is the protocol's primary one, and what still fails at run time is a failure like a
failed cell: recorded, listed by ``repeval results --failed``, first in the report (whose
failure box is red only then), and cleared by a later run that succeeds."""

from __future__ import annotations

import pytest
import yaml

from flows.cli.main import main
from jobs.config import load_config
from jobs.report.inputs import correlate_and_report
from pipeline.errors import ConfigError
from storage_schema.ledger import FailureLog
from tests.helpers.evidence import DATASET, evaluate_all, noisy_encoders
from tests.helpers.records import make_config

SETTINGS = {"knn": ("knn", {"n_neighbors": 10}), "ridge": ("ridge", {})}
MODELS = ("a", "b", "c")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny problems: on a shared 2-core runner torch's thread pool only adds wake-up latency."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("setting, metric, default", [("fs20", "top1", "mean"), ("knn20", "map", "score"),
                                                       ("linear", "curve", "score")])
def test_a_metric_the_protocol_does_not_record_is_refused_at_load(setting, metric, default):
    from pipeline.protocols.registry import get_protocol
    from tests.helpers.records import PROTOCOL_OF

    proto = get_protocol(PROTOCOL_OF[setting])
    with pytest.raises(ConfigError, match=rf"config\.correlation\.settings\[0\]\.metric: protocol "
                                          rf"'{proto.name}' records no metric '{metric}'; its metrics: "
                                          rf"{', '.join(proto.metrics)}"):
        make_config(["m"], correlation={"settings": [{"name": "x", "protocol": setting, "datasets": ["pets"],
                                                      "metric": metric}]})
    cfg = make_config(["m"], correlation={"settings": [{"name": "x", "protocol": setting, "datasets": ["pets"]}]})
    assert cfg.correlation.settings[0].metric == default == proto.primary_metric


def test_an_unbounded_metric_must_be_read_raw_and_a_measured_reference_is_checked_too():
    with pytest.raises(ConfigError, match=r"settings\[0\]\.bounded: 'nll' of 'logistic' is not a fraction"):
        make_config(["m"], correlation={"settings": [{"name": "x", "protocol": "linear", "datasets": ["pets"],
                                                      "metric": "nll"}]})
    make_config(["m"], correlation={"settings": [{"name": "x", "protocol": "linear", "datasets": ["pets"],
                                                  "metric": "nll", "bounded": False}]})
    with pytest.raises(ConfigError, match=r"config\.reference\.metric: protocol 'fewshot' records no metric 'top1'"):
        make_config(["m"], reference={"dataset": "pets", "protocol": "fs20", "metric": "top1"})
    assert make_config(["m"], reference={"dataset": "pets", "protocol": "fs20"}).reference.metric == "mean"


def test_an_unbounded_primary_metric_read_by_default_is_read_raw_too():
    with pytest.raises(ConfigError, match=r"settings\[0\]\.bounded: 'violations' of 'invariance' is not a fraction"):
        make_config(["m"], correlation={"settings": [{"name": "x", "protocol": "audit", "datasets": ["pets"]}]})
    cfg = make_config(["m"], correlation={"settings": [{"name": "x", "protocol": "audit", "datasets": ["pets"],
                                                        "bounded": False}]})
    assert cfg.correlation.settings[0].metric == "violations"


def _raw(url: str, report: str, metric: str) -> dict:
    return {
        "store": url, "report": {"path": report},
        "encoders": [{"name": m, "source": "store"} for m in MODELS],
        "datasets": [{"name": DATASET, "adapter": "digits"}],
        "protocols": [{"name": name, "protocol": p, "settings": s} for name, (p, s) in SETTINGS.items()],
        "reference": {"scores": {"a": 0.8, "b": 0.7, "c": 0.5}},
        # ridge records map11 on multi-label data only: these single-label records have none
        "correlation": {"settings": [{"name": "knn-corr", "protocol": "knn", "datasets": [DATASET]},
                                     {"name": "ridge-corr", "protocol": "ridge", "datasets": [DATASET],
                                      "metric": metric}], "bootstrap": 0},
    }


def test_a_correlation_that_fails_at_run_time_is_a_failure_until_it_succeeds(tmp_path, capsys):
    store = noisy_encoders(tmp_path, {"a": 0.0, "b": 2.0, "c": 6.0})
    records = evaluate_all(store, MODELS, SETTINGS)
    cells = [{"cell_id": r["cell_id"], "model": m, "dataset": DATASET, "layer": "pre_logits", "setting": s}
             for (m, s), r in records.items()]
    report = str(tmp_path / "out" / "report.html")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_raw(store.url, report, "map11")))  # passes the check: ridge can record it
    out = correlate_and_report(store, load_config(path), cells)
    [failed] = out["correlation_failures"]
    assert failed["label"] == "correlation ridge-corr" and failed["kind"] == "correlation"
    assert "has no metric 'map11'" in failed["reason"] and "top1" in failed["reason"]
    assert [s["status"] for s in out["correlation"]["settings"]] == ["ok", "invalid"]
    assert [r["label"] for r in FailureLog(store).records("correlation")] == ["correlation ridge-corr"]
    assert out["failures"][0]["label"] == "correlation ridge-corr"  # first in the report
    text = open(out["report"], encoding="utf-8").read()
    failed_box = text[text.index('<section id="failed" class="failing">'):text.index('<section id="summary">')]
    assert "correlation ridge-corr" in failed_box and "has no metric" in failed_box
    assert main(["results", "--config", str(path), "--failed"]) == 0
    listed = capsys.readouterr().out
    assert "correlation  correlation ridge-corr" in listed and "has no metric 'map11'" in listed
    # fixed: the failure is cleared, the box is no longer red
    path.write_text(yaml.safe_dump(_raw(store.url, report, "score")))
    again = correlate_and_report(store, load_config(path), cells)
    assert again["correlation_failures"] == [] and FailureLog(store).records() == []
    text = open(again["report"], encoding="utf-8").read()
    assert '<section id="failed"' not in text and "failure(s)</a>" not in text  # no failure: no red box
    assert main(["results", "--config", str(path), "--failed"]) == 0
    assert "no failures on record" in capsys.readouterr().out
