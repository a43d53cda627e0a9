"""Training code's aliases in a checkpoint folder: DINO's ``checkpoint.pth`` (saved again
under its own name, so its bytes differ), Lightning's ``last.ckpt``, timm's hard-linked
``last.pth.tar`` and a ``latest`` link are recognised as the numbered file's weights: one
encoder, at the numbered file's step, named in one line. A file equal to no numbered one
stays an encoder. Real timm checkpoints written here."""

from __future__ import annotations

import os
import time
from pathlib import Path

import timm
import torch

from jobs.config import load_config
from jobs.config.checkpoint_folders import alias_line, numbered, scan_checkpoints
from jobs.run.plan import make_plan
from jobs.run.plan_store import plan_notes
from pipeline.encoders.checkpoints.aliases import content_fingerprint, same_weights, sizes_close
from tests.helpers.configs import tiny_config

ARCH = "test_resnet"


def _state(seed: int) -> dict:
    torch.manual_seed(seed)
    return timm.create_model(ARCH, num_classes=0).state_dict()


def _dino_save(path: Path, seed: int, epoch: int) -> Path:
    """What DINO's train loop saves: teacher, student, the epoch (epoch + 1 of the file's number)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sd = _state(seed)
    torch.save({"teacher": {f"backbone.{k}": v for k, v in sd.items()},
                "student": {f"backbone.{k}": v for k, v in sd.items()}, "epoch": epoch, "optimizer": {}}, path)
    return path


def _config(tmp_path: Path, **scan) -> dict:
    raw = tiny_config(tmp_path)
    raw["encoders"] = []
    raw["checkpoints"] = [{"path": str(tmp_path / "ck"), "arch": ARCH, "input_size": 32, "settle_seconds": 0,
                           "pattern": "*.pth", "checkpoint_key": "teacher", **scan}]
    return raw


def _dino_folder(folder: Path) -> None:
    for n in (1, 2, 3):  # checkpoint0001..0003.pth, each saved with epoch = n + 1
        _dino_save(folder / f"checkpoint000{n}.pth", seed=n, epoch=n + 1)
    _dino_save(folder / "checkpoint.pth", seed=3, epoch=4)  # rewritten every epoch: now the newest's state
    (folder / "latest.pth").symlink_to(folder / "checkpoint0002.pth")


def test_dino_checkpoint_pth_and_a_latest_link_are_the_numbered_files(tmp_path: Path) -> None:
    _dino_folder(tmp_path / "ck")
    ck = tmp_path / "ck"
    assert (ck / "checkpoint.pth").read_bytes() != (ck / "checkpoint0003.pth").read_bytes()  # bytes differ
    assert same_weights(ck / "checkpoint.pth", ck / "checkpoint0003.pth")
    assert not same_weights(ck / "checkpoint.pth", ck / "checkpoint0002.pth")
    for scan in ({}, {"step_pattern": "checkpoint{step}"}):  # the epoch inside, or the number in the name
        plan = make_plan(load_config(_config(tmp_path, **scan)))
        encoders = {e.name: e.step for e in plan.config.encoders}
        assert sorted(encoders) == ["checkpoint0001", "checkpoint0002", "checkpoint0003"], scan
        assert encoders["checkpoint0003"] == (4 if not scan else 3)
        aliases = {Path(a["file"]).name: (a["as"], a["how"], a["step"]) for a in plan.scan.aliases}
        assert aliases == {"checkpoint.pth": ("checkpoint0003", "copy", encoders["checkpoint0003"]),
                           "latest.pth": ("checkpoint0002", "link", encoders["checkpoint0002"])}
        assert not plan.checkpoint_failures and {u.encoder.name for u in plan.units} == set(encoders)
    line = alias_line(plan.scan.aliases[0])
    assert line == (f"alias: {ck / 'checkpoint.pth'} is a copy of checkpoint0003.pth (the same weights): "
                    "evaluated once, as checkpoint0003")
    assert line in plan_notes(plan)["scan_notes"]  # in the run's summary and the report

    _dino_save(ck / "checkpoint.pth", seed=4, epoch=5)  # the next epoch, not saved numbered: an encoder of its own
    t = time.time() - 60  # newer than the numbered files, and settled (not still being written)
    os.utime(ck / "checkpoint0003.pth", (t - 60, t - 60))
    os.utime(ck / "checkpoint.pth", (t, t))
    names = [f.encoder.name for f in scan_checkpoints(load_config(_config(tmp_path))).taken]
    assert names == ["checkpoint", "checkpoint0001", "checkpoint0002", "checkpoint0003"]


def test_lightning_last_ckpt_and_timm_hard_links_are_their_numbered_files(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    for step, seed in ((10, 1), (20, 2)):
        torch.save({"state_dict": {f"model.{k}": v for k, v in _state(seed).items()}, "global_step": step},
                   ck / f"epoch={step // 10 - 1}-step={step}.ckpt")
    torch.save({"state_dict": {f"model.{k}": v for k, v in _state(2).items()}, "global_step": 20}, ck / "last.ckpt")
    os.link(ck / "epoch=0-step=10.ckpt", ck / "best.ckpt")  # timm keeps last/best as hard links
    raw = _config(tmp_path, pattern="*.ckpt", checkpoint_key=None, step_pattern="epoch=*-step={step}")
    scan = scan_checkpoints(load_config(raw))
    assert [(f.encoder.name, f.encoder.step) for f in scan.taken] == [("epoch=0-step=10", 10),
                                                                       ("epoch=1-step=20", 20)]
    assert {Path(a["file"]).name: (a["as"], a["how"]) for a in scan.aliases} == {
        "best.ckpt": ("epoch=0-step=10", "link"), "last.ckpt": ("epoch=1-step=20", "copy")}


def test_an_unreadable_or_other_file_is_never_an_alias(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    _dino_save(ck / "checkpoint0001.pth", seed=1, epoch=2)
    (ck / "checkpoint.pth").write_bytes((ck / "checkpoint0001.pth").read_bytes()[:1000])  # torn
    raw = _config(tmp_path)
    plan = make_plan(load_config(raw))
    assert plan.scan.aliases == [] and [e.name for e in plan.config.encoders] == ["checkpoint0001"]
    assert [Path(r["file"]).name for r in plan.checkpoint_failures] == ["checkpoint.pth"]  # refused alone, named
    assert not sizes_close(10**6, 2 * 10**6) and sizes_close(1529077, 1529461)
    assert content_fingerprint(ck / "checkpoint0001.pth") == content_fingerprint(ck / "checkpoint0001.pth")
    assert numbered(load_config(raw).checkpoints[0], "x/checkpoint0001.pth")
    assert not numbered(load_config(raw).checkpoints[0], "x/last.pth")
