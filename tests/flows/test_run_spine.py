"""The run's spine: one scan loads its config once and lists each folder once; a workspace
moved whole keeps its records and its no-op rerun."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
import yaml

import jobs.config.checkpoint_folders as folders
import jobs.config.load as config_loading
from flows.cli.main import main
from jobs.run.changes import save_state
from jobs.run.spine import Run
from tests.helpers.configs import tiny_config, write_checkpoint


def _count_reads(monkeypatch) -> tuple[list[str], Counter]:
    """The config texts parsed and the folders listed, as they happen."""
    loads: list[str] = []
    listed: Counter = Counter()
    load_yaml, scan_files = config_loading.load_yaml, folders.scan_files

    def counted_load(text, name):
        loads.append(name)
        return load_yaml(text, name)

    def counted_scan(scan, **kwargs):
        listed[str(scan.path)] += 1
        return scan_files(scan, **kwargs)

    monkeypatch.setattr(config_loading, "load_yaml", counted_load)
    monkeypatch.setattr(folders, "scan_files", counted_scan)
    return loads, listed


def _folder_config(tmp_path) -> str:
    raw = tiny_config(tmp_path)
    raw["encoders"] = raw["encoders"][:1]
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": "resnet18", "input_size": 32, "settle_seconds": 0},
                          {"path": str(tmp_path / "ck2"), "arch": "resnet18", "input_size": 32, "settle_seconds": 0}]
    write_checkpoint(tmp_path / "ck", "ep1", seed=1)
    write_checkpoint(tmp_path / "ck2", "other1", seed=2)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.slow  # a flow run on the session's Prefect API
def test_one_scan_loads_its_config_once_and_lists_each_folder_once(tmp_path, prefect_harness, monkeypatch):
    from flows.schedules import scan_checkpoints_flow

    config = _folder_config(tmp_path)
    run = Run(config)
    save_state(run.store(writable=True), run.listing.config, run.watch_key, files=run.listing.scan.signatures())
    loads, listed = _count_reads(monkeypatch)
    assert scan_checkpoints_flow(config) == {"ran": False, "new_encoders": []}  # nothing new since
    assert loads == [config]
    assert listed == {str(tmp_path / "ck"): 1, str(tmp_path / "ck2"): 1}


def test_a_run_reads_its_config_and_folders_once_whatever_its_verbs_ask(tmp_path, monkeypatch):
    config = _folder_config(tmp_path)
    loads, listed = _count_reads(monkeypatch)
    run = Run(config)
    assert run.ledger_answer() is None  # nothing stored yet
    changes = run.changes()
    assert changes.new_encoders == ["r18a", "ep1", "other1"] and not changes.recorded
    assert [c.model for c in run.check().cells].count("ep1") == 4
    assert loads == [config]
    assert listed == {str(tmp_path / "ck"): 1, str(tmp_path / "ck2"): 1}


@pytest.mark.slow  # two runs of one checkpoint folder, extraction included
def test_a_workspace_moved_whole_keeps_its_results_and_does_no_work(tmp_path, capsys):
    first = tmp_path / "lab"
    raw = {
        "store": "./store",
        "checkpoints": [{"path": "runs/ck", "arch": "resnet18", "input_size": 32, "layers": ["pre_logits"],
                         "settle_seconds": 0}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 20, "test": 10}}}],
        "protocols": [{"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}}],
        "report": {"path": "report/report.html"},
        "dask": {"n_workers": 1, "processes": False},
    }
    write_checkpoint(first / "runs" / "ck", "ep1", seed=1)
    (first / "config.yaml").write_text(yaml.safe_dump(raw))
    assert main(["run", str(first / "config.yaml")]) == 0
    before = _results(first / "config.yaml", tmp_path / "before.json")
    assert [r[0] for r in before] == ["ep1"]

    moved = tmp_path / "mounted" / "elsewhere"
    shutil.copytree(first, moved)  # times kept, as cp -a and rsync -a keep them
    shutil.rmtree(first)  # nothing of the old place is left to be found
    assert _results(moved / "config.yaml", tmp_path / "after.json") == before  # the same records and cell ids
    capsys.readouterr()
    assert main(["run", str(moved / "config.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nothing to do: all 1 cells and 2 extractions are in the ledger")
    assert f"report: {moved / 'report' / 'report.html'}" in out


def _results(config, out) -> list[tuple]:
    assert main(["results", "--config", str(config), "--format", "json", "--output", str(out)]) == 0
    return sorted((r["model"], r["dataset"], r["layer"], r["setting"], r["cell_id"], json.dumps(r["metrics"]))
                  for r in json.loads(out.read_text()))
