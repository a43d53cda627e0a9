"""Encoder specs, loading, one-pass multi-layer features and provenance."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from pipeline.encoders import (
    Encoder, EncoderSpec, check_architecture, check_layers_available, list_architectures, load_encoder,
)
from pipeline.errors import ConfigError, HubUnavailableError, InvalidNameError, UnknownNameError
from pipeline.plain import to_plain

SIZE = 32
RESNET_BLOCKS = ("block0", "block1", "block2", "block3", "block4")  # stem + 4 stages


def _batch(n: int = 2, size: int = SIZE) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def resnet() -> Encoder:
    return load_encoder(EncoderSpec("r18", "resnet18", layers=("pre_logits",) + RESNET_BLOCKS, input_size=SIZE), "cpu")


@pytest.fixture(scope="module")
def vit() -> Encoder:
    spec = EncoderSpec("vit", "vit_tiny_patch16_224", layers=("pre_logits", "block0", "block5", "block11"), input_size=SIZE)
    return load_encoder(spec, "cpu")


class _CallCounter:
    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        module.register_forward_hook(self._hook)

    def _hook(self, *_: object) -> None:
        self.calls += 1


# --- spec ---------------------------------------------------------------------------

def test_spec_round_trips_through_json() -> None:
    spec = EncoderSpec("r18", "resnet18", weights="/tmp/x.safetensors", seed=3, layers=("pre_logits", "block2"), input_size=64)
    again = EncoderSpec.from_dict(json.loads(json.dumps(to_plain(spec))))
    assert again == spec and isinstance(again.layers, tuple)


def test_spec_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigError, match="colour.*valid fields"):
        EncoderSpec.from_dict({"name": "a", "arch": "resnet18", "colour": 1})


def test_unknown_arch_suggests_close_names() -> None:
    spec = EncoderSpec("r", "resnt18")  # the spec checks syntax only: no timm import
    for check in (check_architecture, check_layers_available, lambda s: load_encoder(s, "cpu")):
        with pytest.raises(UnknownNameError, match="resnt18.*resnet18"):
            check(spec)


def test_spec_module_imports_neither_torch_nor_timm() -> None:
    """A config is read and its syntax checked without the heavy libraries (fast CLI)."""
    code = ("import sys; from pipeline.encoders import EncoderSpec, PRE_LOGITS; "
            "EncoderSpec('r', 'resnet18', layers=[PRE_LOGITS, 'block2'], weights='x.pth'); "
            "print(sorted(m for m in ('torch', 'timm', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("bad", ["", "../up", "a/b", ".hidden", "x\ny"])
def test_bad_encoder_names_rejected(bad: str) -> None:
    with pytest.raises(InvalidNameError):
        EncoderSpec(bad, "resnet18")


@pytest.mark.parametrize(
    "kwargs",
    [{"weights": "timm:"}, {"layers": "pre_logits"}, {"layers": ()}, {"layers": ("fc",)}, {"layers": ("block01",)}, {"layers": ("block1", "block1")}, {"input_size": 0}, {"seed": 1.5}],
)
def test_bad_spec_fields_rejected(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        EncoderSpec("r", "resnet18", **kwargs)


def test_layer_out_of_range_lists_available() -> None:
    with pytest.raises(UnknownNameError, match="block9.*block4"):
        load_encoder(EncoderSpec("r", "resnet18", layers=("block9",), input_size=SIZE), "cpu")


def test_list_architectures() -> None:
    assert "resnet18" in list_architectures("resnet1*")
    assert all(name.startswith("vit_tiny") for name in list_architectures("vit_tiny*"))


# --- weights --------------------------------------------------------------------------

def test_random_init_is_deterministic_per_seed() -> None:
    make = lambda seed: load_encoder(EncoderSpec("m", "mobilenetv3_small_050", seed=seed, input_size=SIZE), "cpu")
    a, b, c = make(0), make(0), make(1)
    assert a.weights_fingerprint == b.weights_fingerprint != c.weights_fingerprint
    x = _batch()
    np.testing.assert_array_equal(a.forward(x)["pre_logits"], b.forward(x)["pre_logits"])
    assert not np.allclose(a.forward(x)["pre_logits"], c.forward(x)["pre_logits"])


def test_pretrained_without_cache_says_how_to_use_a_local_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    old_hub_dir = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / "torch_hub"))
    try:
        for weights in ("pretrained", "timm:a1_in1k"):
            with pytest.raises(HubUnavailableError, match=r"`weights: /path/to/ckpt\.safetensors`"):
                load_encoder(EncoderSpec("r", "resnet18", weights=weights), "cpu")
    finally:
        torch.hub.set_dir(old_hub_dir)


def test_pretrained_loads_offline_from_the_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    # Lay out a hub cache entry by hand, as a download would have left it.
    torch.manual_seed(5)
    published = timm.create_model("mobilenetv3_small_050", pretrained=False)  # 1000-class head, as released
    repo = tmp_path / "hf" / "models--timm--mobilenetv3_small_050.lamb_in1k"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    save_file(published.state_dict(), repo / "snapshots" / commit / "model.safetensors")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))

    enc = load_encoder(EncoderSpec("mnv3", "mobilenetv3_small_050", weights="pretrained", input_size=SIZE), "cpu")
    x = _batch()
    with torch.no_grad():
        expected = published.eval().forward_head(published.forward_features(x), pre_logits=True).numpy()
    np.testing.assert_allclose(enc.forward(x)["pre_logits"], expected, rtol=1e-5, atol=1e-6)
    weights = enc.provenance()["weights"]
    assert weights["source"] == "timm-pretrained" and weights["hf_hub_id"] == "timm/mobilenetv3_small_050.lamb_in1k"


def test_unknown_pretrained_tag_lists_tags() -> None:
    with pytest.raises(UnknownNameError, match="a1_in1k"):
        load_encoder(EncoderSpec("r", "resnet18", weights="timm:a1_in1kk"), "cpu")


def test_weights_that_are_not_a_checkpoint_path() -> None:
    from pipeline.errors import CheckpointError

    with pytest.raises(CheckpointError, match="random.*pretrained"):
        load_encoder(EncoderSpec("r", "resnet18", weights="imagenet"), "cpu")


# --- features ---------------------------------------------------------------------------

def test_all_layers_from_one_forward_pass(resnet: Encoder, vit: Encoder) -> None:
    for enc, first in ((resnet, resnet.model.conv1), (vit, vit.model.patch_embed)):
        counter = _CallCounter(first)
        out = enc.forward(_batch())
        assert counter.calls == 1
        assert list(out) == list(enc.layers)


def test_resnet_shapes_and_values_match_timm(resnet: Encoder) -> None:
    x = _batch()
    out = resnet.forward(x)
    dims = {"pre_logits": 512, "block0": 64, "block1": 64, "block2": 128, "block3": 256, "block4": 512}
    assert {k: v.shape for k, v in out.items()} == {k: (2, d) for k, d in dims.items()}
    assert all(v.dtype == np.float32 for v in out.values())
    # Same seed, built directly with timm: the encoder adds nothing to timm's own features.
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=0).eval()
    with torch.no_grad():
        np.testing.assert_allclose(out["pre_logits"], model.forward_head(model.forward_features(x), pre_logits=True).numpy(), rtol=1e-5, atol=1e-5)
        maps = model.forward_intermediates(x, intermediates_only=True)
    for i, fmap in enumerate(maps):
        np.testing.assert_allclose(out[f"block{i}"], fmap.mean(dim=(2, 3)).numpy(), rtol=1e-5, atol=1e-5)
    assert resnet.available_layers == ("pre_logits",) + RESNET_BLOCKS
    assert resnet.pooling("block2") == "global_avg_pool"


def _block_outputs(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    outputs: list[torch.Tensor] = []
    handles = [blk.register_forward_hook(lambda _m, _i, o: outputs.append(o)) for blk in model.blocks]
    with torch.no_grad():
        model.forward_features(x)
    for h in handles:
        h.remove()
    return outputs


def test_vit_uses_class_token_and_matches_timm(vit: Encoder) -> None:
    x = _batch()
    out = vit.forward(x)
    assert vit.data_config["input_size"] == (3, SIZE, SIZE)
    assert len(vit.available_layers) == 13  # pre_logits + 12 blocks
    assert {k: v.shape for k, v in out.items()} == {k: (2, 192) for k in vit.layers}
    blocks = _block_outputs(vit.model, x)
    for layer in ("block0", "block5", "block11"):
        np.testing.assert_allclose(out[layer], blocks[int(layer[5:])][:, 0].numpy(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        expected = vit.model.forward_head(vit.model.forward_features(x), pre_logits=True).numpy()
    np.testing.assert_allclose(out["pre_logits"], expected, rtol=1e-5, atol=1e-5)
    assert vit.pooling("block0") == "cls_token"
    assert vit.layer_pooling() == {
        "pre_logits": "forward_head(pre_logits=True), global_pool=token",
        "block0": "cls_token", "block5": "cls_token", "block11": "cls_token",
    }


def test_vit_without_class_token_averages_patch_tokens_only() -> None:
    # reg1_gap: one register token, no class token; registers must not enter the mean.
    enc = load_encoder(EncoderSpec("gap", "vit_dwee_patch16_reg1_gap_256", layers=("block1",), input_size=SIZE), "cpu")
    x = _batch()
    blocks = _block_outputs(enc.model, x)
    prefix = enc.model.num_prefix_tokens
    assert prefix == 1 and enc.model.cls_token is None
    np.testing.assert_allclose(enc.forward(x)["block1"], blocks[1][:, prefix:].mean(dim=1).numpy(), rtol=1e-5, atol=1e-5)
    assert enc.pooling("block1") == "mean_patch_tokens"


def test_blocks_only_request_stops_early(resnet: Encoder) -> None:
    enc = load_encoder(EncoderSpec("r", "resnet18", layers=("block1",), input_size=SIZE), "cpu")
    counter = _CallCounter(enc.model.layer4)
    out = enc.forward(_batch())
    assert counter.calls == 0 and out["block1"].shape == (2, 64)
    np.testing.assert_allclose(out["block1"], resnet.forward(_batch())["block1"], rtol=1e-5, atol=1e-6)


def test_feature_dims_is_cached(resnet: Encoder) -> None:
    dims = resnet.feature_dims()
    counter = _CallCounter(resnet.model.conv1)
    assert resnet.feature_dims() == dims == {"pre_logits": 512, "block0": 64, "block1": 64, "block2": 128, "block3": 256, "block4": 512}
    assert counter.calls == 0


def test_transform_is_timms_eval_transform(vit: Encoder) -> None:
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    tensor = vit.transform()(img)
    assert tensor.shape == (3, SIZE, SIZE)
    reference = timm.data.create_transform(**vit.data_config, is_training=False)(img)
    assert torch.equal(tensor, reference)


def test_model_is_frozen_in_eval_mode(resnet: Encoder) -> None:
    assert not resnet.model.training
    assert not any(p.requires_grad for p in resnet.model.parameters())
    assert resnet.device.type == "cpu" and resnet.autocast is False


# --- provenance ------------------------------------------------------------------------------

def test_provenance_is_json_and_names_only_the_checkpoint_basename(tmp_path: Path) -> None:
    torch.manual_seed(4)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10)
    secret_dir = tmp_path / "user_token_abc123"
    secret_dir.mkdir()
    path = secret_dir / "finetuned.safetensors"
    save_file(model.state_dict(), path)
    enc = load_encoder(EncoderSpec("ft", "resnet18", weights=str(path), layers=("pre_logits", "block3"), input_size=SIZE), "cpu")
    prov = json.loads(json.dumps(enc.provenance()))
    weights = prov["weights"]
    assert (weights["source"], weights["file"]) == ("checkpoint", "finetuned.safetensors")
    assert weights["dropped"] == {"count": 2, "groups": {"fc.": 2}, "examples": ["fc.bias"]}  # the 10-class head
    assert weights["checkpoint_key"] is None and weights["prefix_stripped"] is None and weights["resampled"] == []
    assert "user_token_abc123" not in json.dumps(prov)
    assert prov["weights_fingerprint"] == enc.weights_fingerprint and len(prov["weights_fingerprint"]) == 64
    assert prov["arch"] == "resnet18" and prov["name"] == "ft"
    assert prov["data_config"]["input_size"] == [3, SIZE, SIZE]
    assert prov["layers"]["block3"]["pooling"] == "global_avg_pool"
    assert prov["layers"]["pre_logits"]["pooling"].startswith("forward_head(pre_logits=True)")
    assert set(prov["versions"]) == {"torch", "timm", "repeval"}
    assert prov["device"] == "cpu" and prov["autocast"] is False


def test_provenance_of_random_weights_records_seed(resnet: Encoder) -> None:
    assert resnet.provenance()["weights"] == {"source": "random", "seed": 0}


def test_random_init_is_the_same_when_threads_load_encoders_at_once() -> None:
    # Dask workers with threads build several encoders at once; torch's RNG is per process.
    from concurrent.futures import ThreadPoolExecutor

    specs = [EncoderSpec(name=f"r{seed}", arch="resnet18", input_size=32, seed=seed) for seed in (0, 1)]
    alone = {s.seed: load_encoder(s, device="cpu").weights_fingerprint for s in specs}
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda s: (s.seed, load_encoder(s, device="cpu").weights_fingerprint), specs * 2))
    assert all(fp == alone[seed] for seed, fp in together)
