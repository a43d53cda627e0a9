"""Every encoder keeps its name end to end: two names for identical weights (a .safetensors
file and its .pth copy) and checkpoints another config scanned first share their ledger
records, yet each run's summary, report, correlation and `repeval results` name them as
the config does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from flows.benchmark import run_benchmark
from flows.cli.main import main
from jobs.config import load_config
from tests.helpers.configs import write_checkpoint

pytestmark = pytest.mark.slow


def _config(tmp: Path, name: str, encoders: list[dict], **extra) -> Path:
    raw = {"store": str(tmp / "store"), "dask": {"n_workers": 1, "processes": False},
           "extract": {"batch_size": 32},
           "encoders": encoders,
           "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 20, "test": 10}}}],
           "protocols": [{"name": "knn20", "protocol": "knn"}],
           "report": {"path": str(tmp / f"{name}.html")}, **extra}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_identical_weights_and_scanned_checkpoints_keep_every_name(tmp_path, prefect_harness, capsys):
    ck = tmp_path / "ck"
    ep2 = write_checkpoint(ck, "ep2", seed=2)
    torch.save(load_file(str(ep2)), tmp_path / "ep2.pth")  # the same tensors, another format and name
    write_checkpoint(ck, "ep5", seed=5)
    encoders = [{"name": "mine-ep2", "arch": "resnet18", "input_size": 32, "weights": str(ep2)},
                {"name": "mine-ep2-pth", "arch": "resnet18", "input_size": 32, "weights": str(tmp_path / "ep2.pth")},
                {"name": "mine-ep5", "arch": "resnet18", "input_size": 32, "weights": str(ck / "ep5.safetensors")}]
    a = _config(tmp_path, "a", encoders, reference={"scores": {"mine-ep2": 0.4, "mine-ep2-pth": 0.4, "mine-ep5": 0.7}},
                correlation={"settings": [{"name": "knn", "protocol": "knn20", "datasets": ["tex"]}],
                             "bootstrap": 50})
    first = run_benchmark(load_config(a))
    assert first["failures"] == [] and first["computed"] == 2 and first["cached"] == 1  # ep2 evaluated once
    assert {o["model"] for o in first["outcomes"]} == {"mine-ep2", "mine-ep2-pth", "mine-ep5"}
    corr = first["correlation"]["settings"][0]
    assert corr["status"] == "ok" and sorted(corr["models"]) == ["mine-ep2", "mine-ep2-pth", "mine-ep5"]
    text = Path(first["report"]).read_text()
    assert 'data-model="mine-ep2-pth"' in text and 'data-model="mine-ep2"' in text

    # another config scans the same folder under its own prefix: all cells are in the ledger
    b = _config(tmp_path, "b", [], checkpoints=[{"path": str(ck), "arch": "resnet18", "input_size": 32,
                                                "name_prefix": "lab-", "settle_seconds": 0}])
    second = run_benchmark(load_config(b))
    assert second["computed"] == 0 and second["cached"] == 2
    assert {o["model"] for o in second["outcomes"]} == {"lab-ep2", "lab-ep5"}
    text = Path(second["report"]).read_text()
    assert 'data-model="lab-ep2"' in text and 'data-model="mine-ep2"' not in text
    capsys.readouterr()
    assert main(["results", "--config", str(b)]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines()[1:] if not r.startswith("unreliable: ")]
    assert {r.split()[0] for r in rows} == {"lab-ep2", "lab-ep5"}
