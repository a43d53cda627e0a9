"""A checkpoint folder's mistakes, as a lab meets them: the config check refuses a folder
whose settings fit none of its files (a DINO folder without ``checkpoint_key: teacher``),
and the scan's own arch and layers, before any work; a file refused before is taken again
once a setting that decides how it is read changes (not only the file); a run whose folder
files were all skipped says so and exits 3; a file whose reader raises anything (a
malformed "safe" pickle) fails alone, named. Real timm checkpoints written here."""

from __future__ import annotations

import copy
import os
import pickle
import time
from pathlib import Path

import pytest
import timm
import torch
import yaml

from flows.cli.main import main
from jobs.config import load_config
from jobs.config.checkpoint_folders import reading_settings, scan_checkpoints
from jobs.run.plan import list_work, make_plan
from jobs.run.spine import Run
from pipeline.errors import ConfigError
from storage_schema import FeatureStore
from storage_schema.ledger import FailureLog
from tests.helpers.configs import tiny_config

ARCH = "test_resnet"


def _dino(path: Path, seed: int, epoch: int) -> Path:
    """A DINO-style file: teacher and student state dicts under ``backbone.``, the epoch, args."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    sd = timm.create_model(ARCH, num_classes=0).state_dict()
    torch.save({"teacher": {f"backbone.{k}": v for k, v in sd.items()},
                "student": {f"backbone.{k}": v + 1 for k, v in sd.items()}, "epoch": epoch}, path)
    return path


def _plain(path: Path, seed: int = 0, arch: str = ARCH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    torch.save(timm.create_model(arch, num_classes=0).state_dict(), path)
    return path


def _config(tmp_path: Path, encoders: bool = False, **scan) -> dict:
    raw = tiny_config(tmp_path)
    raw["encoders"] = raw["encoders"][:1] if encoders else []
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": ARCH, "input_size": 32, "settle_seconds": 0,
                           "pattern": "*.pth", **scan}]
    return raw


def _failures(raw: dict) -> list[dict]:
    store = Path(raw["store"])
    return FailureLog(FeatureStore(str(store))).records("checkpoint") if store.exists() else []


def test_a_folder_whose_settings_fit_none_of_its_files_is_a_config_mistake(tmp_path: Path) -> None:
    for i in (1, 2):
        _dino(tmp_path / "ck" / f"checkpoint000{i}.pth", seed=i, epoch=i + 1)
    raw = _config(tmp_path, encoders=True)
    raw["encoders"].append({"name": "typo", "arch": "resnet18", "input_size": 32, "layers": ["block99"]})
    with pytest.raises(ConfigError) as err:
        make_plan(load_config(raw))
    text = str(err.value)
    # every mistake at once: the entry's and the folder's, each naming where it is
    assert "config.encoders[1]" in text and "block99" in text
    assert "config.checkpoints[0]" in text and "none of its 2 checkpoint file(s)" in text
    assert "checkpoint0001.pth" in text and "checkpoint0002.pth" in text and "checkpoint_key: teacher" in text
    assert _failures(raw) == [] and not (tmp_path / "store" / "features").exists()  # nothing written
    raw["encoders"].pop()
    raw["checkpoints"][0]["checkpoint_key"] = "teacher"  # the advice taken
    assert [e.name for e in make_plan(load_config(raw)).config.encoders] == ["r18a", "checkpoint0001",
                                                                            "checkpoint0002"]


def test_the_scan_arch_and_layers_are_checked_with_no_file_yet(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    raw = _config(tmp_path, layers=["pre_logits", "block99"])
    with pytest.raises(ConfigError, match=r"config\.checkpoints\[0\] .*block99"):
        make_plan(load_config(raw))
    raw["checkpoints"][0].update(layers=["pre_logits"], arch="resnet_does_not_exist")
    with pytest.raises(ConfigError, match=r"config\.checkpoints\[0\] .*resnet_does_not_exist"):
        make_plan(load_config(raw))


def test_the_run_command_refuses_a_folder_mistake_before_any_work(tmp_path: Path, capsys) -> None:
    _dino(tmp_path / "ck" / "checkpoint0001.pth", seed=1, epoch=2)
    raw = _config(tmp_path, encoders=True)  # another encoder that would be extracted first
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["run", str(config)]) == 2
    err = capsys.readouterr().err
    assert "config.checkpoints[0]" in err and "checkpoint_key: teacher" in err
    assert not (tmp_path / "store" / "features").exists()  # r18a was never extracted


def test_a_changed_reading_setting_takes_a_failed_file_again(tmp_path: Path) -> None:
    files = [_dino(tmp_path / "ck" / f"checkpoint000{i}.pth", seed=i, epoch=i + 1) for i in (1, 2)]
    raw = _config(tmp_path)
    # a scheduled scan (not strict) records each file's failure, with the settings it was read with
    plan = Run(load_config(raw), scheduled=True).plan()
    assert plan.config.encoders == [] and len(plan.checkpoint_failures) == 2
    failed = {r["file"]: r for r in _failures(raw)}
    assert set(failed) == {str(f) for f in files} and all(r["settings"] for r in failed.values())
    assert scan_checkpoints(load_config(raw), failed).all_skipped  # nothing changed: skipped

    for change in ({"checkpoint_key": "teacher"}, {"strip_prefixes": ["backbone."]}, {"input_size": 48},
                   {"layers": ["pre_logits", "block1"]}, {"arch": "resnet18"}):
        edited = copy.deepcopy(raw)
        edited["checkpoints"][0].update(change)
        scan = scan_checkpoints(load_config(edited), failed)
        assert sorted(f.path for f in scan.taken) == sorted(map(str, files)) and not scan.skipped, change
    extract = copy.deepcopy(raw)
    extract["extract"]["dtype"] = "float16"  # how it is evaluated: a change too
    assert len(scan_checkpoints(load_config(extract), failed).taken) == 2

    fixed = copy.deepcopy(raw)
    fixed["checkpoints"][0]["checkpoint_key"] = "teacher"
    plan = make_plan(load_config(fixed))  # the fix is evaluated, not "skipped: failed before and unchanged"
    assert [e.name for e in plan.config.encoders] == ["checkpoint0001", "checkpoint0002"]
    assert not plan.scan.skipped and not plan.checkpoint_failures

    t = time.time() - 100  # the file rewritten (same settings): taken again too
    os.utime(files[0], (t, t))
    scan = scan_checkpoints(load_config(raw), failed)
    assert [f.path for f in scan.taken] == [str(files[0])] and len(scan.skipped) == 1
    old = {p: {k: v for k, v in r.items() if k != "settings"} for p, r in failed.items()}  # an older run's record
    assert len(scan_checkpoints(load_config(raw), old).taken) == 2
    enc = load_config(fixed).checkpoints[0]
    assert reading_settings(plan.config.encoders[0], load_config(fixed)) != reading_settings(
        plan.config.encoders[0], load_config(extract)) and enc.checkpoint_key == "teacher"


def test_a_run_whose_every_folder_file_was_skipped_says_so_and_exits_3(tmp_path: Path, capsys) -> None:
    _dino(tmp_path / "ck" / "checkpoint0001.pth", seed=1, epoch=2)
    raw = _config(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    Run(load_config(config), scheduled=True).plan()  # as a nightly scan recorded it
    assert Run(config).ledger_answer() is None  # never the quick "nothing to do"
    assert main(["run", str(config)]) == 3
    err = capsys.readouterr().err
    assert "NOTHING EVALUATED FROM THE CHECKPOINT FOLDERS" in err and "checkpoint0001.pth" in err
    assert "checkpoint_key: teacher" in err and "--retry-failed" in err and "exit code 3" in err
    assert main(["run", str(config), "--allow-failures"]) == 0
    raw["checkpoints"][0]["checkpoint_key"] = "teacher"
    config.write_text(yaml.safe_dump(raw))
    plan = list_work(load_config(config))
    assert not plan.scan.all_skipped and [e.name for e in plan.config.encoders] == ["checkpoint0001"]


class _Namespace:  # pickled under argparse's name, called with arguments (no real Namespace does that)
    def __reduce__(self):
        import argparse

        return (argparse.Namespace, (1, 2))


def test_a_file_whose_reader_raises_anything_fails_alone_named(tmp_path: Path) -> None:
    good = _plain(tmp_path / "ck" / "good.pth")
    bad = tmp_path / "ck" / "bad.pth"
    with open(bad, "wb") as f:  # a legacy pickle of plain values holding a malformed "safe" record
        pickle.dump({"args": _Namespace(), "epoch": 3}, f, protocol=2)
    raw = _config(tmp_path)
    plan = make_plan(load_config(raw))  # no TypeError out of the scan or the check
    assert [e.name for e in plan.config.encoders] == ["good"]
    (refused,) = plan.checkpoint_failures
    assert refused["file"] == str(bad) and "bad.pth" in refused["reason"] and "\n" not in refused["reason"]
    assert [r["file"] for r in _failures(raw)] == [str(bad)]
    assert str(good) not in {r["file"] for r in _failures(raw)}
