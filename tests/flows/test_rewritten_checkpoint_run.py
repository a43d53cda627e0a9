"""A folder run whose DINO-style ``checkpoint.pth`` is rewritten by the trainer after its first
extraction unit: no record is made from mixed weights, the run says so in one line per
failure and exits 3; the next run, the file now still, evaluates the new weights. Real
Prefect API, real Dask (in-process, one worker: the units run one after another), real timm."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import timm
import torch
import yaml

import flows.tasks as tasks
from flows.cli.main import main
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from storage_schema.provenance import WEIGHTS_FIELD

ARCH = "test_resnet"


def _save(path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    torch.save({"teacher": timm.create_model(ARCH, num_classes=0).state_dict(), "epoch": seed}, path)


def _run(config: Path) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", str(config), "--json"])
    return code, json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.mark.slow
def test_a_checkpoint_rewritten_during_a_run_gives_no_record_and_the_next_run_takes_it(
        tmp_path: Path, prefect_harness, monkeypatch) -> None:
    (tmp_path / "ck").mkdir()
    ck = tmp_path / "ck" / "checkpoint.pth"
    _save(ck, seed=0)
    raw = {
        "store": str(tmp_path / "store"),
        "dask": {"n_workers": 1, "processes": False, "threads_per_worker": 1},
        "extract": {"batch_size": 20, "chunk_batches": 1},
        "checkpoints": [{"path": str(tmp_path / "ck"), "arch": ARCH, "input_size": 32, "settle_seconds": 0,
                         "pattern": "*.pth", "checkpoint_key": "teacher"}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 6, "test": 4}}}],
        "protocols": [{"name": "knn", "protocol": "knn", "settings": {"n_neighbors": 3}}],
        "report": {"path": str(tmp_path / "out" / "report.html")},
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    real, started = tasks.run_extract_unit, tmp_path / "units started"
    started.mkdir()

    def trainer_saves_after_the_first_unit(store, unit, extract):
        # the tasks get copies of this closure: what ran before is counted on disk
        if any(started.iterdir()):  # the next epoch's weights land between the train and the test split
            _save(ck, seed=1)
        (started / unit.split).touch()
        return real(store, unit, extract)

    monkeypatch.setattr(tasks, "run_extract_unit", trainer_saves_after_the_first_unit)
    code, summary = _run(config)
    assert code == 3 and summary["computed"] == 0
    reasons = [f["reason"] for f in summary["failures"]]
    changed = [r for r in reasons if "WeightsChangedError" in r]
    assert changed and all(str(ck) in r and "\n" not in r for r in changed)
    store = FeatureStore(raw["store"])
    assert len(Ledger(store)) == 0  # no record: no verdict, event or alert from mixed weights

    monkeypatch.setattr(tasks, "run_extract_unit", real)  # the trainer is done: the file stays
    code, summary = _run(config)
    assert code == 0 and summary["computed"] == 1 and summary["failures"] == []
    (rec,) = list(Ledger(store))
    weights = {st.attrs[WEIGHTS_FIELD] for st in store.list_arrays() if st.key.startswith("features/")}
    assert weights == {rec["provenance"][WEIGHTS_FIELD]}  # the stale train array was re-extracted
