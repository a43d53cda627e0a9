"""Checkpoint folders and encoder entries with lab files: names without the checkpoint
extension, links named as given, colliding names refused together, ``checkpoint_key`` and
``strip_prefixes`` from the config, a one-shot run's wait for files still settling."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import timm
import torch

from jobs.config.checkpoint_folders import scan_checkpoints, wait_for_settled
from jobs.config import load_config
from jobs.run.plan import list_work, make_plan
from pipeline.errors import ConfigError
from tests.helpers.configs import tiny_config

ARCH = "test_resnet"


def _write(path: Path, wrap=lambda sd: sd, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    torch.save(wrap(timm.create_model(ARCH, num_classes=0).state_dict()), path)
    return path


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


def _config(tmp_path: Path, **scan) -> dict:
    raw = tiny_config(tmp_path)
    raw["encoders"] = []
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": ARCH, "input_size": 32, "settle_seconds": 0,
                           "pattern": "*", **scan}]
    return raw


def test_names_drop_the_checkpoint_extension_and_links_keep_their_own_name(tmp_path: Path) -> None:
    _write(tmp_path / "ck" / "moco_0199.pth.tar", lambda sd: {"state_dict": {f"module.encoder_q.{k}": v
                                                                               for k, v in sd.items()}})
    (tmp_path / "ck" / "moco_0199.json").write_text('{"reference_score": 0.5}')
    _write(tmp_path / "runs" / "last.ckpt", lambda sd: {"state_dict": {f"model.{k}": v for k, v in sd.items()},
                                                        "global_step": 1200})
    (tmp_path / "ck" / "last.pth").symlink_to(tmp_path / "runs" / "last.ckpt")
    plan = make_plan(load_config(_config(tmp_path)))
    encoders = {e.name: e for e in plan.config.encoders}
    assert sorted(encoders) == ["last", "moco_0199"] and not plan.checkpoint_failures
    assert encoders["last"].weights == str(tmp_path / "ck" / "last.pth")  # the link, not its target
    assert encoders["last"].series == "ck" and encoders["last"].step == 1200  # Lightning's global_step
    assert plan.config.reference.scores["moco_0199"] == 0.5


def test_two_files_giving_one_name_are_refused_together_naming_both(tmp_path: Path) -> None:
    pth, ckpt = _write(tmp_path / "ck" / "ck.pth"), _write(tmp_path / "ck" / "ck.ckpt", seed=1)
    _write(tmp_path / "ck" / "other.pth", seed=2)
    cfg = load_config(_config(tmp_path))
    plan = make_plan(cfg)
    assert [e.name for e in plan.config.encoders] == ["other"]
    refused = {r["file"]: r["reason"] for r in plan.checkpoint_failures}
    assert set(refused) == {str(pth), str(ckpt)}
    assert all(str(pth) in why and str(ckpt) in why and "'ck'" in why for why in refused.values())
    ckpt.unlink()  # the clash is gone: the unchanged file is taken, not skipped as failed before
    assert [e.name for e in make_plan(cfg).config.encoders] == ["ck", "other"]


def test_a_scanned_file_whose_name_an_entry_gives_another_file_is_refused(tmp_path: Path) -> None:
    mine, theirs = _write(tmp_path / "ck" / "r.pth"), _write(tmp_path / "elsewhere" / "r.pth", seed=1)
    raw = _config(tmp_path)
    raw["encoders"] = [{"name": "r", "arch": ARCH, "weights": str(theirs), "input_size": 32}]
    scan = scan_checkpoints(load_config(raw))
    assert not scan.taken and [c["file"] for c in scan.collisions] == [str(mine)]
    assert "already an encoders: entry" in scan.collisions[0]["reason"]
    raw["encoders"][0]["weights"] = str(mine)  # the entry names this very file: left to it, silently
    assert scan_checkpoints(load_config(raw)).collisions == []


def test_checkpoint_key_and_strip_prefixes_come_from_the_config(tmp_path: Path) -> None:
    _write(tmp_path / "ck" / "dino.pth", lambda sd: {"teacher": {f"backbone.{k}": v for k, v in sd.items()},
                                                      "student": {f"backbone.{k}": v + 1 for k, v in sd.items()},
                                                      "epoch": 3})
    raw = _config(tmp_path)
    raw["checkpoints"] = []
    raw["encoders"] = [{"name": "dino", "arch": ARCH, "weights": "ck/dino.pth", "input_size": 32}]
    (tmp_path / "config.yaml").write_text(__import__("yaml").safe_dump(raw))
    with pytest.raises(ConfigError, match=r"config\.encoders\[0\]\.weights: .*`checkpoint_key: teacher`"):
        make_plan(load_config(tmp_path / "config.yaml"))
    raw["encoders"][0]["checkpoint_key"] = "teacher"
    (tmp_path / "config.yaml").write_text(__import__("yaml").safe_dump(raw))
    cfg = load_config(tmp_path / "config.yaml")
    assert cfg.encoders[0].spec().checkpoint_key == "teacher"
    make_plan(cfg)
    folder = _config(tmp_path, checkpoint_key="teacher", strip_prefixes=["extra."])
    scanned = make_plan(load_config(folder)).config.encoders
    assert [(e.checkpoint_key, e.strip_prefixes) for e in scanned] == [("teacher", ["extra."])]
    folder["checkpoints"][0]["strip_prefixes"] = ["extra"]
    with pytest.raises(ConfigError, match=r"config\.checkpoints\[0\]\.strip_prefixes: 'extra' is not a name prefix"):
        load_config(folder)


def test_a_one_shot_run_waits_for_settling_files_up_to_settle_seconds(tmp_path: Path) -> None:
    fresh = _write(tmp_path / "ck" / "fresh.pth")
    raw = _config(tmp_path, settle_seconds=30)
    raw["checkpoints"].append({"path": str(tmp_path / "marked"), "arch": ARCH, "settle_seconds": 5,
                               "done_suffix": ".done", "pattern": "*.pth"})
    marked = _write(tmp_path / "marked" / "m.pth")
    cfg = load_config(raw)
    start = time.time()
    clock = [start]
    said: list[str] = []

    def sleep(seconds: float) -> None:  # time passes without waiting for it
        clock[0] += seconds

    left = wait_for_settled(cfg, said.append, clock=lambda: clock[0], sleep=sleep)
    assert said == ["waiting up to 30 s for 2 checkpoint(s) still being written: fresh.pth, m.pth"]
    assert left == [str(marked)]  # never marked done: named, for the run to exit 3
    assert 30 <= clock[0] - start < 30.6  # waited up to the longest settle_seconds, no longer
    assert scan_checkpoints(cfg, now=clock[0]).taken[0].path == str(fresh)  # settled meanwhile
    _age(fresh, 31)
    (tmp_path / "marked" / "m.pth.done").touch()
    assert wait_for_settled(cfg, said.append) == [] and len(said) == 1  # nothing to wait for: silent


def test_a_folder_that_gives_no_file_says_why_with_a_pattern_that_takes_its_files(tmp_path: Path) -> None:
    from jobs.report.run_summary import build_summary, summary_lines

    raw = _config(tmp_path, pattern="*.safetensors")  # the default pattern, beside a lab's .ckpt files
    (tmp_path / "ck").mkdir()
    assert scan_checkpoints(load_config(raw)).notes == [
        f"checkpoints folder {str(tmp_path / 'ck')!r}: no file matches pattern '*.safetensors' "
        "(no checkpoint file in it yet)"]
    for name in ("epoch=0-step=100.ckpt", "epoch=1-step=200.ckpt", "last.ckpt"):
        (tmp_path / "ck" / name).write_bytes(b"x")
    (tmp_path / "ck" / "metrics.json").write_text("{}")  # not a checkpoint: never offered
    plan = list_work(load_config(raw))
    assert plan.config.encoders == [] and plan.scan.notes == [
        f"checkpoints folder {str(tmp_path / 'ck')!r}: no file matches pattern '*.safetensors'; it holds 3 other "
        "checkpoint file(s) (epoch=0-step=100.ckpt, epoch=1-step=200.ckpt, last.ckpt): set `pattern: \"*.ckpt\"`"]
    (tmp_path / "ck" / "moco.pth.tar").write_bytes(b"x")  # two kinds: every checkpoint file
    assert scan_checkpoints(load_config(raw)).notes[0].endswith(": set `pattern: \"*\"`")
    missing = _config(tmp_path)
    missing["checkpoints"][0]["path"] = str(tmp_path / "typo")
    notes = scan_checkpoints(load_config(missing)).notes
    assert notes == [f"checkpoints folder {str(tmp_path / 'typo')!r} does not exist: nothing taken from it"]
    summary = build_summary(reason="run", units=0, cells=0, extractions=[], outcomes=[], failures=[], report=None,
                            correlation=None, started=0.0, scan_notes=notes)
    assert notes[0] in summary_lines(summary)  # said in the run's summary (run and serve)
    assert scan_checkpoints(load_config(_config(tmp_path))).notes == []  # files taken: nothing to say
