"""Checkpoints as training code writes them load with no option or with ``checkpoint_key``,
their features equal timm's forward pass on the same weights, and provenance says what
was done (tests/helpers/zoo.py writes the zoo)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.encoders import EncoderSpec, check_checkpoint_fits, load_encoder
from storage_schema.provenance import weights_summary
from pipeline.errors import CheckpointError
from tests.helpers.zoo import EVAL_SIZE, ZooEntry, reference_features, write_zoo

NAMES = ["moco", "dino", "lightning", "lightning_link", "timm_train_ema", "torchvision_model_ema", "byol",
         "mae_224_at_64", "timm_safetensors", "hf_bin", "torchvision"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ZooEntry]:
    entries = {e.name: e for e in write_zoo(tmp_path_factory.mktemp("zoo"))}
    assert sorted(entries) == sorted(NAMES)
    return entries


@pytest.fixture(scope="module")
def batch() -> torch.Tensor:
    return torch.randn(3, 3, EVAL_SIZE, EVAL_SIZE, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", NAMES)
def test_zoo_checkpoint_gives_timms_features_and_says_what_was_done(zoo, batch, name: str) -> None:
    entry = zoo[name]
    spec = EncoderSpec(name, **entry.spec_kwargs())
    checked = check_checkpoint_fits(spec)  # the config-time check, from the file's header: it agrees
    enc = load_encoder(spec, device="cpu")
    np.testing.assert_allclose(enc.forward(batch)["pre_logits"], reference_features(entry, batch),
                               rtol=1e-5, atol=1e-5)
    weights = enc.provenance()["weights"]
    assert weights["file"] == entry.path.name  # a link keeps the name it was given
    assert {k: v for k, v in checked.record().items()} == {k: v for k, v in weights.items()
                                                          if k not in ("source", "file")}
    expect = entry.expect
    assert weights["checkpoint_key"] == expect.get("checkpoint_key")
    assert weights["checkpoint_key_from"] == ("config" if entry.checkpoint_key else "found")
    assert weights["prefix_stripped"] == expect.get("prefix_stripped")
    assert weights["dropped"]["groups"] == expect.get("dropped_groups", {})
    assert weights["dropped"]["count"] == sum(expect.get("dropped_groups", {}).values())
    assert [r["tensor"] for r in weights["resampled"]] == expect.get("resampled", [])
    if expect.get("resampled"):
        assert weights["converted_by"] == "timm.models.vision_transformer.checkpoint_filter_fn"
        assert weights["resampled"][0]["from"][1] == 197 and weights["resampled"][0]["to"][1] == 17
    line = weights_summary(weights)
    for part in (expect.get("prefix_stripped"), expect.get("checkpoint_key"), *expect.get("dropped_groups", {})):
        assert part is None or part in line


@pytest.mark.parametrize("name", ["dino", "timm_train_ema", "torchvision_model_ema"])
def test_several_fitting_state_dicts_are_listed_with_counts_and_the_line_that_picks_one(zoo, name: str) -> None:
    entry = zoo[name]
    with pytest.raises(CheckpointError) as info:
        check_checkpoint_fits(EncoderSpec(name, **entry.spec_kwargs(with_key=False)))
    msg = str(info.value)
    assert "\n" not in msg and "several state dicts that fit" in msg
    counts = re.findall(r"'([\w/]+)' \((\d+) of (\d+) tensors", msg)
    assert len(counts) == 2 and all(a == b for _, a, b in counts), msg
    assert entry.checkpoint_key in {w for w, _, _ in counts}
    key = re.search(r"`checkpoint_key: (\w+)`", msg).group(1)
    check_checkpoint_fits(EncoderSpec(name, **{**entry.spec_kwargs(with_key=False), "checkpoint_key": key}))


def test_a_checkpoint_key_that_is_not_there_lists_what_is(zoo) -> None:
    entry = zoo["dino"]
    with pytest.raises(CheckpointError, match=r"no tensors under checkpoint_key 'techer'.*'teacher' \("):
        check_checkpoint_fits(EncoderSpec("d", **{**entry.spec_kwargs(), "checkpoint_key": "techer"}))


def test_missing_backbone_tensors_are_refused_by_name(zoo, tmp_path: Path) -> None:
    raw = torch.load(zoo["moco"].path, weights_only=True)
    del raw["state_dict"]["module.encoder_q.layer1.0.conv1.weight"]
    path = tmp_path / "torn_moco.pth.tar"
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match=r"1 missing keys: layer1\.0\.conv1\.weight"):
        load_encoder(EncoderSpec("m", **{**zoo["moco"].spec_kwargs(), "weights": str(path)}), device="cpu")


def test_other_shape_mismatches_are_refused_with_advice(zoo, tmp_path: Path) -> None:
    raw = torch.load(zoo["mae_224_at_64"].path, weights_only=True)
    raw["model"]["pos_embed"] = raw["model"]["pos_embed"][:, :14]  # 13 patches: no square grid to resample
    path = tmp_path / "odd_grid.pth"
    torch.save(raw, path)
    with pytest.raises(CheckpointError) as info:
        check_checkpoint_fits(EncoderSpec("v", **{**zoo["mae_224_at_64"].spec_kwargs(), "weights": str(path)}))
    msg = str(info.value)
    assert "1 shape mismatches: pos_embed (checkpoint (1, 14, 64), model (1, 17, 64))" in msg
    assert "timm's converter could not resample it: set `input_size:` to its training size" in msg
    sd = dict(zoo["timm_safetensors"].reference.state_dict())
    sd["layer1.0.conv1.weight"] = torch.zeros(3, 3, 3, 3)
    torch.save(sd, tmp_path / "wider.pth")
    with pytest.raises(CheckpointError, match=r"layer1\.0\.conv1\.weight \(checkpoint \(3, 3, 3, 3\).*check `arch:`"):
        load_encoder(EncoderSpec("r", "test_resnet", weights=str(tmp_path / "wider.pth"), input_size=EVAL_SIZE), "cpu")
