"""A shared store: two configs that give the name ``ra`` to other weights (random-init
resnet18 checkpoints saved with seeds 0 and 7) each see their own records in ``results``,
``compare`` and the report, whichever ran last; two evaluations of one cell at once
compute it once (the cell's lease)."""

from __future__ import annotations

import json
import logging
import shutil
import threading

import pytest
import yaml

from flows.cli.main import main
from jobs.config import load_config
from jobs.evaluation.encoder_identity import encoder_identity, name_clash_lines
from jobs.evaluation.evaluate import check_unchanged, evaluate_cell
from jobs.evaluation.identity import cell_arrays
from jobs.run.plan import list_work, run_extract_unit
from jobs.report.inputs import correlate_and_report
from jobs.report.results import config_cells, config_records
from pipeline.errors import StaleArrayError
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.configs import write_checkpoint


def _config(tmp_path, name: str, seed: int, *, weights=None, train: int = 12, base: bool = True) -> str:
    weights = weights or write_checkpoint(tmp_path / f"weights{seed}", "ra", seed)
    raw = {
        "store": str(tmp_path / "store"),
        "extract": {"batch_size": 16, "chunk_batches": 1},
        "encoders": [{"name": "ra", "arch": "resnet18", "input_size": 32, "weights": str(weights)}]
        + ([{"name": "base", "arch": "resnet18", "input_size": 32, "seed": 1}] if base else []),
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": train, "test": 8}}}],
        "protocols": [{"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}}],
        "report": {"path": str(tmp_path / name / "report.html")},
    }
    (tmp_path / name).mkdir()
    path = tmp_path / name / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _run(path: str) -> dict[str, dict]:
    """Extract and evaluate a config without Prefect; its records by encoder name."""
    cfg = load_config(path)
    store = cfg.open_store()
    plan = list_work(cfg, store=store)  # its checks are tested elsewhere
    for unit in plan.units:
        run_extract_unit(store, unit, plan.config)
    return {c.model: evaluate_cell(store, c).record for c in plan.cells}


def _results(path: str, tmp_path) -> dict[str, dict]:
    """What ``repeval results --config`` shows, as its JSON export, by encoder name."""
    out = tmp_path / "results.json"
    assert main(["results", "--config", path, "--format", "json", "--output", str(out)]) == 0
    return {r["model"]: r for r in json.loads(out.read_text())}


@pytest.fixture(scope="module")
def two_configs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared")
    a, b = _config(tmp, "a", 0), _config(tmp, "b", 7)
    first = _run(a)
    second = _run(b)  # b's extraction replaces the features stored under `ra`
    return tmp, a, b, first, second


def test_the_two_encoders_named_ra_are_other_weights(two_configs):
    _, a, b, first, second = two_configs
    assert encoder_identity(load_config(a).encoders[0]) != encoder_identity(load_config(b).encoders[0])
    assert first["ra"]["provenance"]["weights_fingerprint"] != second["ra"]["provenance"]["weights_fingerprint"]
    assert first["ra"]["cell_id"] != second["ra"]["cell_id"]
    assert first["base"]["cell_id"] == second["base"]["cell_id"]  # the same weights: one record


def test_each_config_shows_its_own_record_whichever_ran_last(two_configs):
    tmp, a, b, first, second = two_configs
    for path, own in ((a, first), (b, second)):
        shown = _results(path, tmp)
        assert shown["ra"]["cell_id"] == own["ra"]["cell_id"]
        assert shown["ra"]["metrics"] == own["ra"]["metrics"]
    # history (--all) never lists the other config's record of `ra`
    for path, other in ((a, second), (b, first)):
        cfg = load_config(path)
        rows, _ = config_records(cfg.open_store(read_only=True), cfg, all_records=True)
        assert other["ra"]["cell_id"] not in {r["cell_id"] for r in rows if r["model"] == "ra"}


def test_compare_and_report_agree_with_results(two_configs, capsys):
    tmp, a, b, first, second = two_configs
    for path, own in ((a, first), (b, second)):
        capsys.readouterr()
        assert main(["compare", "ra", "base", "--config", path, "--json"]) == 0
        cells = json.loads(capsys.readouterr().out)["cells"]
        assert [c["score_a"] for c in cells] == [pytest.approx(own["ra"]["metrics"][cells[0]["metric"]])]
        cfg = load_config(path)
        store = cfg.open_store(read_only=True)
        found, _, plan = config_cells(store, cfg)
        out = correlate_and_report(store, plan.config, found, path=str(tmp / "r.html"), plan=plan,
                                   write_summary=False)
        weights = out["summary"]["encoders"]["ra"]["weights"]
        assert weights == own["ra"]["provenance"]["weights_fingerprint"]


def test_a_listing_by_names_alone_says_a_name_holds_two_configs_weights(two_configs, capsys):
    tmp, *_ = two_configs
    capsys.readouterr()
    assert main(["results", "--store", str(tmp / "store")]) == 0
    err = capsys.readouterr().err
    assert "encoder 'ra' names the weights or images of 2 configs" in err and "'base'" not in err


def test_a_run_says_the_name_holds_another_configs_weights(two_configs):
    _, a, b, _, _ = two_configs
    cfg = load_config(a)
    lines = name_clash_lines(cfg.open_store(read_only=True), list_work(cfg).cells)
    assert len(lines) == 1 and lines[0].startswith("encoder 'ra' on 'tex': ") and "weights7" in lines[0]
    assert name_clash_lines(None, list_work(cfg).cells) == []


def test_a_rerun_of_the_first_config_takes_its_own_record_again(two_configs):
    tmp, a, b, first, second = two_configs
    again = _run(a)  # re-extracts `ra` from seed 0; the ledger answers the cell
    assert again["ra"]["cell_id"] == first["ra"]["cell_id"]
    assert _results(a, tmp)["ra"]["cell_id"] == first["ra"]["cell_id"]
    assert _results(b, tmp)["ra"]["cell_id"] == second["ra"]["cell_id"]


def test_two_evaluations_of_one_cell_at_once_compute_it_once(tmp_path, caplog):
    path = _config(tmp_path, "c", 0)
    cfg = load_config(path)
    store = cfg.open_store()
    plan = list_work(cfg, store=store)
    for unit in plan.units:
        if unit.encoder.name == "ra":
            run_extract_unit(store, unit, plan.config)
    cell = next(c for c in plan.cells if c.model == "ra")
    start, outcomes = threading.Barrier(2), []

    def evaluate():
        own = FeatureStore(cfg.store)  # each "run" opens the store itself
        start.wait()
        outcomes.append(evaluate_cell(own, cell))

    caplog.set_level(logging.INFO)
    threads = [threading.Thread(target=evaluate) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.status for o in outcomes) == ["cached", "computed"]
    # the second waited for the first and took its record: it never computed the cell itself
    assert "recorded by another process meanwhile" not in caplog.text
    assert len(Ledger(store)) == 1 and outcomes[0].cell_id == outcomes[1].cell_id


def test_a_cell_whose_arrays_were_replaced_while_read_is_not_recorded(two_configs):
    _, a, b, _, _ = two_configs
    cfg = load_config(a)
    store = cfg.open_store()
    cell = next(c for c in list_work(cfg).cells if c.model == "ra")
    arrays = cell_arrays(store, cell)  # read as config a's run would
    other = load_config(b)
    for unit in list_work(other).units:  # config b extracts `ra` meanwhile
        if unit.encoder.name == "ra":
            run_extract_unit(store, unit, other)
    with pytest.raises(StaleArrayError, match="was replaced while the cell read it"):
        check_unchanged(store, cell, arrays)


@pytest.mark.slow  # three configs extracted and evaluated
def test_a_dataset_name_for_other_images_and_a_copy_of_the_weights(tmp_path):
    weights = write_checkpoint(tmp_path / "w", "ra", 3)
    copy = tmp_path / "copy" / "ra.safetensors"
    copy.parent.mkdir()
    shutil.copy(weights, copy)
    p = _config(tmp_path, "p", 3, weights=weights, base=False)
    q = _config(tmp_path, "q", 3, weights=copy, base=False)  # identical weights at another path
    r = _config(tmp_path, "r", 3, weights=weights, train=16, base=False)  # `tex` of other images
    first = _run(p)["ra"]
    assert _run(q)["ra"]["cell_id"] == first["cell_id"]  # the same arrays: the ledger's answer
    other = _run(r)["ra"]  # replaces `tex`'s labels and `ra`'s features
    assert other["cell_id"] != first["cell_id"] and other["n_train"] != first["n_train"]
    for path, own in ((p, first), (q, first), (r, other)):
        cfg = load_config(path)
        found, missing, _ = config_cells(cfg.open_store(read_only=True), cfg)
        assert [c["cell_id"] for c in found] == [own["cell_id"]] and not missing
