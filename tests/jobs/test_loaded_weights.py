"""Weights are what the record says: a checkpoint rewritten during a run (DINO rewrites
``checkpoint.pth`` every epoch) gives no record from mixed weights; every feature array
records the weights its extraction loaded; ``repeval ls`` shows them and ``repeval verify``
finds a record whose arrays disagree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
import zarr

from flows.cli.main import main as cli
from jobs.config import load_config
from jobs.evaluation.evaluate import evaluate_cells
from jobs.evaluation.identity import identify_cells
from jobs.extraction.extract import extract
from jobs.run.failures import extraction_failure
from jobs.run.plan import make_adapter, make_plan, run_extract_unit
from pipeline.encoders import load_encoder
from pipeline.errors import WeightsChangedError
from storage_schema.ledger import Ledger
from storage_schema.provenance import WEIGHTS_FIELD, array_weights

ARCH = "test_resnet"


def _write(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    torch.save(timm.create_model(ARCH, num_classes=0).state_dict(), path)
    return path


@pytest.fixture
def setup(tmp_path: Path):
    """A config of one checkpoint encoder on a tiny dataset with one k-NN setting, its plan and store."""
    ck = _write(tmp_path / "ck" / "checkpoint.pth", seed=0)
    cfg = load_config({
        "store": str(tmp_path / "store"), "extract": {"batch_size": 16, "chunk_batches": 1, "device": "cpu"},
        "encoders": [{"name": "checkpoint", "arch": ARCH, "weights": str(ck), "input_size": 32}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 8, "test": 4}}}],
        "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 3}}],
    })
    plan = make_plan(cfg)
    return ck, plan, cfg.open_store()


def _fingerprint(plan) -> str:
    return load_encoder(plan.config.encoders[0].spec(), device="cpu").weights_fingerprint


def _run_units(store, plan, between=lambda: None):
    """Every unit in order (``between`` runs after the first), as the flow hands them out:
    a unit that fails is an outcome; then every cell, told which extractions failed."""
    outcomes = []
    for i, unit in enumerate(plan.units):
        if i == 1:
            between()
        try:
            run_extract_unit(store, unit, plan.config)
            outcomes.append({"status": "extracted"})
        except Exception as exc:  # noqa: BLE001  as flows.tasks.extract_task
            outcomes.append(extraction_failure(unit.encoder.name, unit.dataset.name, unit.split,
                                               unit.encoder.weights, exc))
    unavailable = {(o["model"], o["dataset"]): f"extraction {o['label']} failed: {o['reason']}"
                   for o in outcomes if o["status"] == "failed"}
    return outcomes, evaluate_cells(store, plan.cells, unavailable=unavailable)


def test_a_normal_run_records_the_loaded_weights_on_every_array_and_the_record(setup, capsys) -> None:
    ck, plan, store = setup
    assert [u.split for u in plan.units] == ["train", "test"] and plan.units[0].weights_signature
    _, cells = _run_units(store, plan)
    assert [c["status"] for c in cells] == ["computed"]
    expected = _fingerprint(plan)
    arrays = [st for st in store.list_arrays() if st.key.startswith("features/")]
    assert len(arrays) == 2 and {st.attrs[WEIGHTS_FIELD] for st in arrays} == {expected}
    (rec,) = list(Ledger(store))
    assert rec["provenance"][WEIGHTS_FIELD] == expected
    assert set(rec["provenance"]["feature_weights"].values()) == {expected}
    assert cli(["ls", "--store", store.url]) == 0
    listing = capsys.readouterr().out
    assert listing.count(expected[:12]) == 2  # each feature array's own weights, short form
    assert cli(["verify", "--store", store.url]) == 0
    assert "0 problem(s)" in capsys.readouterr().out
    from jobs.report.page import write_report  # the report's provenance: the record's and each array's weights

    html = Path(write_report([rec], None, plan.config, str(ck.parent.parent / "report.html"))).read_text()
    block = html[html.index('<section id="provenance">'):]
    assert f'"weights": "{expected[:12]}"' in block.replace("&#34;", '"').replace("&quot;", '"')
    assert block.count(expected[:12]) >= 3  # the record's, and the train and test arrays'


def test_a_checkpoint_rewritten_between_the_splits_gives_no_record_and_one_line(setup) -> None:
    ck, plan, store = setup
    outcomes, cells = _run_units(store, plan, between=lambda: _write(ck, seed=1))  # the next epoch's weights
    assert outcomes[0]["status"] == "extracted" and outcomes[1]["error_type"] == "WeightsChangedError"
    reason = outcomes[1]["reason"]
    assert str(ck) in reason and "rewritten after this run was planned" in reason and "\n" not in reason
    assert [c["status"] for c in cells] == ["failed"] and "WeightsChangedError" in cells[0]["reason"]
    assert len(Ledger(store)) == 0  # no record, hence no verdict, event or alert drawn from one
    assert store.status("features/checkpoint/tex/test/pre_logits") is None  # nothing written from the new file


def test_arrays_of_different_weights_are_never_one_cell(setup) -> None:
    """Even when the file's signature cannot tell (a unit planned without one): the cell
    compares the weights each array came from."""
    ck, plan, store = setup
    spec, adapter = plan.config.encoders[0].spec(), make_adapter(plan.config.datasets[0])
    settings = plan.config.encoders[0].extract_settings(plan.config.extract)
    extract(store, spec, adapter, "train", settings)
    old = _fingerprint(plan)
    _write(ck, seed=1)
    extract(store, spec, adapter, "test", settings)
    new = _fingerprint(plan)
    assert old != new
    assert identify_cells(store, plan.cells) == [None]  # never answered from the ledger as recorded
    (cell,) = evaluate_cells(store, plan.cells)
    assert cell["status"] == "failed" and cell["error_type"] == "WeightsMismatchError"
    assert old[:12] in cell["reason"] and new[:12] in cell["reason"] and "\n" not in cell["reason"]
    assert len(Ledger(store)) == 0
    # the next run (the file now still) re-extracts the stale split and computes the cell
    replan = make_plan(plan.config)
    _, cells = _run_units(store, replan)
    assert [c["status"] for c in cells] == ["computed"]
    assert list(Ledger(store))[0]["provenance"][WEIGHTS_FIELD] == new


def test_a_file_changed_while_it_is_read_is_refused(setup, monkeypatch) -> None:
    ck, plan, store = setup
    import pipeline.encoders as encoders

    real = encoders.load_encoder

    def load_then_rewrite(*args, **kwargs):  # the trainer saves while the worker reads
        out = real(*args, **kwargs)
        _write(ck, seed=2)
        return out

    monkeypatch.setattr(encoders, "load_encoder", load_then_rewrite)
    with pytest.raises(WeightsChangedError, match="changed while it was read"):
        run_extract_unit(store, plan.units[0], plan.config)
    assert store.status("features/checkpoint/tex/train/pre_logits") is None


def _edit_attr(store, key: str, **attrs) -> None:
    array = zarr.open_array(store._zstore, path=key, mode="r+", zarr_format=3)
    for name, value in attrs.items():
        if value is None:
            del array.attrs[name]
        else:
            array.attrs[name] = value


def test_verify_finds_a_record_whose_arrays_disagree_and_warns_on_unknown(setup, capsys) -> None:
    ck, plan, store = setup
    _run_units(store, plan)
    key = "features/checkpoint/tex/test/pre_logits"
    _edit_attr(store, key, **{WEIGHTS_FIELD: "ebf433" + "0" * 26})
    assert cli(["verify", "--store", store.url]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("mixed weights"))
    assert "checkpoint/tex/pre_logits/knn" in line and "ebf4330000000" not in line and "ebf433000000" in line
    assert _fingerprint(plan)[:12] in line
    # an array from before arrays recorded their weights: unknown, a warning, not a problem
    encoder = dict(store.status(key).attrs["encoder"])
    encoder.pop(WEIGHTS_FIELD)
    _edit_attr(store, key, **{WEIGHTS_FIELD: None, "encoder": encoder})
    assert array_weights(store.status(key).attrs) is None
    assert cli(["verify", "--store", store.url]) == 0
    out = capsys.readouterr().out
    assert "weights unknown" in out and "0 problem(s)" in out
    assert cli(["ls", "--store", store.url, "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[key]["weights"] == "unknown"


def test_a_cell_that_reads_the_weights_gives_no_record_when_the_file_is_rewritten_while_it_runs(
        tmp_path: Path, monkeypatch) -> None:
    import jobs.evaluation.weights as weights_jobs

    ck = _write(tmp_path / "ck" / "checkpoint.pth", seed=0)
    cfg = load_config({
        "store": str(tmp_path / "store"), "extract": {"device": "cpu"},
        "encoders": [{"name": "checkpoint", "arch": ARCH, "weights": str(ck), "input_size": 32}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 4, "test": 4}}}],
        "protocols": [{"name": "sal", "protocol": "saliency", "settings": {"n_images": 2, "n_examples": 1}}],
    })
    (cell,) = make_plan(cfg).cells
    store = cfg.open_store()
    real = weights_jobs._image_data

    def then_rewrite(*args, **kwargs):  # after the cell id was taken from the old weights
        out = real(*args, **kwargs)
        _write(ck, seed=1)
        return out

    monkeypatch.setattr(weights_jobs, "_image_data", then_rewrite)
    with pytest.raises(WeightsChangedError, match="rewritten while checkpoint/tex"):
        weights_jobs.weights_cell(store, cell, cfg.extract)
    assert len(Ledger(store)) == 0
    monkeypatch.setattr(weights_jobs, "_image_data", real)  # the file now still: the next run records it
    assert weights_jobs.weights_cell(store, cell, cfg.extract)["status"] == "computed"
    (rec,) = list(Ledger(store))
    assert rec["provenance"][WEIGHTS_FIELD] == _fingerprint(make_plan(cfg))
