"""The rerun note of a config with a dense dataset: its map layers name per-pixel targets
(not the split's labels), and an unchanged rerun is still answered from the ledger; a
changed image still takes the full run."""

from __future__ import annotations

import yaml

from jobs.config import load_config
from jobs.evaluation.evaluate import evaluate_cell
from jobs.plan import make_plan, run_extract_unit
from jobs.rerun import ledger_answer, record_run
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
    plan = make_plan(cfg, store=store, check=False)
    for unit in plan.units:
        run_extract_unit(store, unit, plan.config)
    assert [evaluate_cell(store, c).status for c in plan.cells] == ["computed"]
    report.write_text("<html></html>")  # the run's report (this test runs no flow)
    assert record_run(cfg, {"report": str(report), "failures": []})

    answer = ledger_answer(load_config(path))
    assert answer is not None and (answer.units, answer.cells) == (2, 1)

    image = sorted((root / "ADEChallengeData2016" / "images" / "validation").iterdir())[0]
    image.chmod(0o644)  # the layout is written read-only
    image.write_bytes(image.read_bytes()[:-1] + b"\0")  # other pixels: the targets' images changed
    assert ledger_answer(load_config(path)) is None
