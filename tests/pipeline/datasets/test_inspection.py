"""`repeval datasets show`: what a copy holds, before a long run."""

from __future__ import annotations

import json
from pathlib import Path

from flows.cli.main import main
from pipeline.datasets import dataset_summary, make_dataset
from tests.pipeline.datasets import layouts as L
from tests.pipeline.datasets import layouts_more as M


def test_show_prints_splits_counts_metric_validation_and_fingerprints(tmp_path: Path, capsys) -> None:
    root = M.voc2007(tmp_path).root
    assert main(["datasets", "show", "voc2007", "--param", f"root={root}"]) == 0
    out = capsys.readouterr().out
    ds = make_dataset("voc2007", root=root)
    assert "metric       map11: 11-point mean average precision" in out
    assert "multi-label (n, C); -1 marks difficult" in out and "the authors' split 'val'" in out
    assert "stat: file list with sizes and modification times" in out
    for split, n in (("train", 4), ("val", 3), ("test", 5)):
        line = next(li for li in out.splitlines() if li.strip().startswith(split + " "))
        assert f" {n} " in line and ds.fingerprint(split)[:16] in line


def test_show_json_and_skipped_files(tmp_path: Path, capsys) -> None:
    layout = L.pets(tmp_path)
    (layout.root / "images" / "Bengal_3.jpg").unlink()
    argv = ["datasets", "show", "pets", "--param", f"root={layout.root}", "skip_bad=true", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    test = next(s for s in summary["splits"] if s["split"] == "test")
    assert test["skipped"] == ["Bengal_3"] and test["samples"] == 2
    assert summary["metric"] == "mean_per_class" and summary["validation"]["source"] == "train_fraction"
    assert summary["roles"] == {"train": "train", "test": "test", "pooled": "all"}
    assert main(argv[:-1]) == 0
    assert "skipped in test: Bengal_3" in capsys.readouterr().out


def test_show_names_the_missing_file(tmp_path: Path, capsys) -> None:
    layout = L.flowers102(tmp_path)
    (layout.root / "setid.mat").unlink()
    assert main(["datasets", "show", "flowers102", "--param", f"root={layout.root}"]) == 2
    err = capsys.readouterr().err
    assert str(layout.root / "setid.mat") in err and err.count("\n") == 1


def test_summary_of_generated_and_feature_datasets() -> None:
    summary = dataset_summary(make_dataset("textures", n_per_class={"train": 2, "test": 1}))
    assert summary["splits"][0]["fingerprint_mode"] == "generated" and summary["num_classes"] == 4
