"""A cell's evidence in a real store: written before its record, named by it, read back
checked, and covered by ``repeval verify``."""

from __future__ import annotations

import numpy as np
import pytest

from flows.cli.main import main
from jobs.evaluation.evaluate import Cell, evaluate_cell
from pipeline.analysis.compare import evidence_sha256, labels_fingerprint
from pipeline.errors import StaleArrayError
from pipeline.protocols.evidence import Evidence
from storage_schema import FeatureStore
from storage_schema.evidence import iter_evidence_keys, read_evidence, write_evidence
from storage_schema.keys import evidence_group_key
from storage_schema.ledger import Ledger
from tests.helpers.evidence import DATASET, SETTINGS, evaluate_all, noisy_encoders

KINDS = {"knn": "predictions", "ridge": "predictions", "few": "episodes", "low": "fits"}
QUICK = {k: SETTINGS[k] for k in KINDS}  # the logistic probe's evidence is checked without a store


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    root = tmp_path_factory.mktemp("evidence")
    store = noisy_encoders(root, {"clean": 0.0})
    return store, evaluate_all(store, ["clean"], QUICK)


def test_every_record_names_its_stored_evidence(evaluated):
    store, records = evaluated
    y_test = store.labels(DATASET, "test").read()
    for (model, setting), rec in records.items():
        entry = rec["evidence"]
        assert entry["kind"] == KINDS[setting] and entry["key"].startswith(evidence_group_key(rec["cell_id"]))
        st = store.status(entry["key"])
        assert st.complete and st.n_chunks == 1 and st.attrs["sha256"] == entry["sha256"]
        values = read_evidence(store, entry)
        assert evidence_sha256(values) == entry["sha256"] and list(values.shape) == entry["shape"]
        if entry["kind"] == "episodes":
            assert values.dtype == np.float64 and values.mean() == rec["metrics"]["score"]
        else:
            assert values.dtype == np.int16 and entry["labels_fingerprint"] == labels_fingerprint(y_test)
            assert entry["labels"] == f"datasets/{DATASET}/test/labels"
        if entry["kind"] == "predictions":
            assert np.mean(values == y_test) == rec["metrics"]["top1"]
        if entry["kind"] == "fits":
            assert np.mean(values[-3:] == y_test) == rec["metrics"]["score"]  # the headline N = 8, 3 fits
    assert len(list(iter_evidence_keys(store))) == len(records)


def test_a_cached_cell_keeps_its_evidence(evaluated):
    store, records = evaluated
    protocol, params = SETTINGS["knn"]
    again = evaluate_cell(store, Cell("clean", DATASET, "pre_logits", "knn", protocol, params))
    assert again.status == "cached" and again.record["evidence"] == records["clean", "knn"]["evidence"]


def test_evidence_that_changed_since_its_record_is_refused(tmp_path):
    store = noisy_encoders(tmp_path, {"m": 0.0})
    rec = evaluate_cell(store, Cell("m", DATASET, "pre_logits", "knn", *SETTINGS["knn"])).record
    values = read_evidence(store, rec["evidence"])
    other = Evidence.of_predictions(store.labels(DATASET, "test").read(), (values + 1) % 10, 10)
    with store.lease(evidence_group_key(rec["cell_id"])) as lease:  # rewritten through the one write path
        write_evidence(store, lease, rec["cell_id"], other)
    with pytest.raises(StaleArrayError, match="not what its record was made from"):
        read_evidence(store, Ledger(store).get(rec["cell_id"])["evidence"])


def test_verify_reads_every_cells_evidence(tmp_path, capsys):
    store = noisy_encoders(tmp_path, {"m": 0.0})
    rec = {s: evaluate_cell(store, Cell("m", DATASET, "pre_logits", s, *SETTINGS[s])).record for s in ("knn", "few")}
    url = str(tmp_path / "store")
    assert main(["verify", "--store", url, "--all"]) == 0
    assert "ok         2 of 2 cells' evidence" in capsys.readouterr().out
    chunk = tmp_path / "store" / rec["knn"]["evidence"]["key"] / "c" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    few = rec["few"]
    with store.lease(evidence_group_key(few["cell_id"])) as lease:
        write_evidence(FeatureStore(url), lease, few["cell_id"],
                       Evidence("episodes", np.zeros(60), few["evidence"]["episodes_fingerprint"], "episode_accuracy"))
    assert main(["verify", "--store", url]) == 1
    out = capsys.readouterr().out
    assert f"damaged    {rec['knn']['evidence']['key']} (cell {rec['knn']['cell_id']}): chunk(s) [0]" in out
    assert f"changed    {few['evidence']['key']}" in out and "2 problem(s)" in out
