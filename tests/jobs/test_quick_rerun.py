"""Reruns with nothing to do, answered from the ledger: a config with a dense dataset (its
map layers name per-pixel targets, not the split's labels; a changed image still takes the
full run), and a checkpoint folder whose steps are read from the files (the facts an
earlier scan read come from the store: no file read, no torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import yaml

from jobs.config import load_config
from jobs.evaluation.evaluate import evaluate_cell
from jobs.run.plan import list_work, run_extract_unit
from jobs.run.ledger_answer import record_run
from jobs.run.spine import Run
from tests.helpers.cli import REPO, cli_env
from tests.helpers.configs import write_checkpoint
from tests.helpers.dense_layouts import write_ade20k


def test_an_unchanged_dense_config_is_answered_from_the_ledger(tmp_path):
    root = write_ade20k(tmp_path / "ade", n_train=4, n_val=2, size=(32, 32))
    report = tmp_path / "report.html"
    raw = {
        "store": str(tmp_path / "store"),
        "extract": {"batch_size": 4, "chunk_batches": 1},
        "encoders": [{"name": "r18", "arch": "resnet18", "input_size": 32, "layers": ["block1.map"]}],
        "datasets": [{"name": "ade", "adapter": "ade20k", "params": {"root": str(root)}, "test_split": "val"}],
        "protocols": [{"name": "seg", "protocol": "segmentation",
                       "settings": {"learning_rates": [0.5], "epochs": 1, "batch_size": 4, "device": "cpu"}}],
        "report": {"path": str(report)},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    store = cfg.open_store()
    plan = list_work(cfg, store=store)
    for unit in plan.units:
        run_extract_unit(store, unit, plan.config)
    assert [evaluate_cell(store, c).status for c in plan.cells] == ["computed"]
    report.write_text("<html></html>")  # the run's report (this test runs no flow)
    assert record_run(cfg.open_store(), list_work(cfg, store=cfg.open_store()), {"report": str(report), "failures": []})

    answer = Run(path).ledger_answer()
    assert answer is not None and (answer.units, answer.cells) == (2, 1)

    image = sorted((root / "ADEChallengeData2016" / "images" / "validation").iterdir())[0]
    image.chmod(0o644)  # the layout is written read-only
    image.write_bytes(image.read_bytes()[:-1] + b"\0")  # other pixels: the targets' images changed
    assert Run(path).ledger_answer() is None


def test_an_unchanged_folder_series_is_answered_without_reading_a_checkpoint(tmp_path):
    folder = tmp_path / "ckpts"
    for seed, name in enumerate(("run_a", "run_b")):  # no step in the names: read from the files
        write_checkpoint(folder, name, seed)
    old = time.time() - 120  # settled
    for f in folder.iterdir():
        os.utime(f, (old, old))
    report = tmp_path / "report.html"
    raw = {
        "store": str(tmp_path / "store"),
        "extract": {"batch_size": 16, "chunk_batches": 1},
        "checkpoints": [{"path": str(folder), "arch": "resnet18", "input_size": 32}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 8, "test": 4}}}],
        "protocols": [{"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}}],
        "report": {"path": str(report)},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    store = cfg.open_store()
    plan = list_work(cfg, store=store)
    assert [e.name for e in plan.config.encoders] == ["run_a", "run_b"]
    for unit in plan.units:
        run_extract_unit(store, unit, plan.config)
    for cell in plan.cells:
        evaluate_cell(store, cell)
    report.write_text("<html></html>")
    assert record_run(cfg.open_store(), list_work(cfg, store=cfg.open_store()), {"report": str(report), "failures": []})

    # a fresh process: the folder's facts come from the store, no file is read, no torch imported
    probe = ("import runpy, sys; sys.argv = ['repeval', 'run', sys.argv[1]]\n"
             "try:\n    runpy.run_module('flows.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "print('TORCH=' + str('torch' in sys.modules), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, env=cli_env(),
                         cwd=REPO, timeout=120)
    assert out.stdout.startswith("nothing to do: all 2 cells and 4 extractions"), out.stdout + out.stderr
    assert "TORCH=False" in out.stderr, out.stderr
