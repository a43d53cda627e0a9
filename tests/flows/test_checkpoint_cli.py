"""``repeval extract`` takes a lab's checkpoint with the one option its message names, and
``repeval ls`` says what was done to the file; an image it cannot decode names the option
that leaves it out."""

from __future__ import annotations

import json
from pathlib import Path

import timm
import torch

from flows.cli.main import main

ARCH = "test_resnet"
DATA = ["--dataset", "textures", "--param", 'n_per_class={"train": 4, "test": 4}', "--input-size", "32", "--quiet"]


def _dino(path: Path) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    sd = timm.create_model(ARCH, num_classes=0).state_dict()
    head = {"head.mlp.0.weight": torch.zeros(4, 4)}
    torch.save({"teacher": {**{f"backbone.{k}": v for k, v in sd.items()}, **head},
                "student": {**{f"backbone.{k}": v * 2 for k, v in sd.items()}, **head}, "epoch": 5}, path)
    return sd


def test_extract_takes_checkpoint_key_and_strip_prefixes_and_ls_says_what_was_done(tmp_path: Path, capsys) -> None:
    store = str(tmp_path / "store")
    _dino(tmp_path / "dino.pth")
    base = ["extract", "--store", store, "--arch", ARCH, "--name", "dino", "--weights", str(tmp_path / "dino.pth")]
    assert main(base + DATA) == 2
    err = capsys.readouterr().err
    assert "several state dicts that fit" in err and "--checkpoint-key teacher" in err
    assert not Path(store).exists()  # refused before the store is touched
    assert main(base + ["--checkpoint-key", "teacher"] + DATA) == 0
    capsys.readouterr()
    assert main(["ls", "--store", store]) == 0
    out = capsys.readouterr().out
    assert ("dino: checkpoint dino.pth: under 'teacher' (checkpoint_key); prefix 'backbone.' stripped; "
            "1 tensors dropped (head. 1)") in out
    assert out.count("dino: checkpoint") == 1  # once per encoder and file, not per array
    assert main(["ls", "--store", store, "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["key"].startswith("features/")]
    assert rows and all(r["checkpoint"]["checkpoint_key"] == "teacher" for r in rows)

    sd = timm.create_model(ARCH, num_classes=0).state_dict()
    torch.save({f"module.trunk_v2.{k}": v for k, v in sd.items()}, tmp_path / "odd.pt")
    odd = ["extract", "--store", store, "--arch", ARCH, "--name", "odd", "--weights", str(tmp_path / "odd.pt")]
    assert main(odd + DATA) == 2
    assert "--strip-prefixes module.trunk_v2." in capsys.readouterr().err
    assert main(odd + ["--strip-prefixes", "trunk_v2."] + DATA) == 0
    capsys.readouterr()
    (tmp_path / "teacher.pth").symlink_to(tmp_path / "dino.pth")  # the same file under a link's name
    link = ["extract", "--store", store, "--arch", ARCH, "--name", "link", "--weights", str(tmp_path / "teacher.pth"),
            "--checkpoint-key", "teacher"]
    assert main(link + DATA) == 0
    out = capsys.readouterr().out  # no forward pass, and not "0 images"
    assert "aliased   link/textures/train: 16 images already in the store (identical weights: dino's features)" in out
    assert main(link + DATA) == 0
    assert "cached    link/textures/test: 16 images already in the store" in capsys.readouterr().out


def test_extract_stopped_by_an_undecodable_image_names_the_option_that_leaves_it_out(tmp_path: Path, capsys) -> None:
    from tests.pipeline.datasets.layouts import write_image

    root = tmp_path / "mine"
    for split in ("train", "test"):
        for cls in ("a", "b"):
            write_image(root / split / cls / "0.png", 40 + len(cls))
    (root / "train" / "a" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    base = ["extract", "--store", str(tmp_path / "store"), "--arch", ARCH, "--dataset", "image_folder",
            "--split", "train", "--input-size", "32", "--quiet", "--param", f"root={root}"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "bad.jpg" in err and err.rstrip().endswith(
        "; to leave unreadable images out, add --param skip_bad=true (`repeval datasets show` names every one)")
    assert main(base + ["skip_bad=true"]) == 0
    assert "1 unreadable image(s) left out: a/bad.jpg" in capsys.readouterr().out
