"""Token features: a layer stored with its tokens, (n, T, d) in float16, read by the
attentive probe, and only by the protocols that read tokens.

The science check: images whose class is the tint of one bright patch at a random place
among darker random-coloured patches. A tiny random ViT's block-0 tokens keep that patch
apart, so the attentive probe finds it; averaging the tokens drowns it in the others,
so the linear probe on the mean-pooled tokens stays near chance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from jobs.config import load_config
from jobs.evaluation.evaluate import Cell, evaluate_cell
from jobs.extraction.extract import ExtractConfig, extract
from jobs.run.plan import check_plan, evaluation_cells
from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec, load_encoder
from pipeline.errors import ConfigError, DataValidationError, UnknownNameError
from pipeline.protocols.registry import EvalData, get_protocol
from storage_schema import FeatureStore

CFG = ExtractConfig(batch_size=8, chunk_batches=2, progress=False)
TINTS = np.array([[0.9, 0.1, 0.1], [0.1, 0.9, 0.1], [0.1, 0.1, 0.9], [0.9, 0.9, 0.1]])
SIZE = 64  # 4 x 4 patches of 16 pixels, plus the class token: 17 tokens


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():  # small problems: on shared cores a torch thread pool only adds waiting
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny():
    return make_dataset("textures", n_per_class={"train": 4, "test": 4})


@pytest.fixture(scope="module")
def marked(tmp_path_factory):
    """image_folder: per image one bright patch, tinted by its class, among dark random ones."""
    root = tmp_path_factory.mktemp("marked")
    for split, per_class, seed in (("train", 80, 0), ("test", 40, 1)):
        rng = np.random.default_rng(seed)
        for k in range(len(TINTS)):
            (root / split / f"c{k}").mkdir(parents=True)
            for i in range(per_class):
                image = np.empty((SIZE, SIZE, 3))
                marker = rng.integers(16)
                for q in range(16):
                    r, c = divmod(q, 4)
                    image[r * 16:(r + 1) * 16, c * 16:(c + 1) * 16] = (
                        0.8 + 0.15 * (TINTS[k] - 0.5) if q == marker else rng.uniform(0, 0.6, 3))
                image += rng.normal(0, 0.02, image.shape)
                Image.fromarray((np.clip(image, 0, 1) * 255).astype(np.uint8)).save(
                    root / split / f"c{k}" / f"{i:03d}.png")
    return make_dataset("image_folder", root=str(root), name="marked")


def test_vit_token_layer_is_stored_as_float16_tokens_of_the_forward_pass(tmp_path, tiny):
    encoder = load_encoder(EncoderSpec(name="vit", arch="vit_tiny_patch16_224", layers=("block1", "block1.tokens"),
                                       input_size=32))
    store = FeatureStore(str(tmp_path / "s"))
    report = extract(store, encoder, tiny, "test", ExtractConfig(batch_size=8, chunk_batches=2, progress=False,
                                                                  dtype="float32"))
    assert report.forward_batches == 2  # both layers from one forward pass per batch
    tokens = store.features("vit", "textures", "test", "block1.tokens")
    pooled = store.features("vit", "textures", "test", "block1")
    assert tokens.shape == (16, 5, 192) and tokens.read().dtype == np.float16  # class token + 2 x 2 patches
    assert pooled.read().dtype == np.float32  # the extraction's dtype: only tokens are float16
    assert tokens.attrs["pooling"] == "tokens: class token and patch tokens" and tokens.attrs["dtype"] == "float16"
    assert tokens.fingerprint != pooled.fingerprint
    # the reference: timm's own intermediates, prefix tokens first, patches row-major
    tf = encoder.transform()
    images = torch.stack([tf(tiny.load_image("test", i)) for i in range(16)])
    with torch.inference_mode():
        (spatial, prefix), = encoder.model.forward_intermediates(images, indices=[1], intermediates_only=True,
                                                                return_prefix_tokens=True, output_fmt="NLC")
    expected = torch.cat([prefix, spatial], dim=1).numpy()
    np.testing.assert_allclose(tokens.read().astype(np.float32), expected, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(tokens.read()[:, 0].astype(np.float32), pooled.read(), rtol=2e-3, atol=2e-3)


def test_cnn_token_layer_is_its_spatial_map_whose_mean_is_the_pooled_layer(tiny):
    encoder = load_encoder(EncoderSpec(name="r18", arch="resnet18", layers=("block3", "block3.tokens"),
                                       input_size=64))
    assert encoder.feature_shapes() == {"block3": (256,), "block3.tokens": (16, 256)}  # a 4 x 4 map
    assert encoder.pooling("block3.tokens") == "tokens: spatial positions"
    images = torch.stack([encoder.transform()(tiny.load_image("test", i)) for i in range(4)])
    out = encoder.forward(images)
    np.testing.assert_allclose(out["block3.tokens"].mean(axis=1), out["block3"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layers, error, message", [
    (("pre_logits.tokens",), ConfigError, "'pre_logits.tokens' is not 'pre_logits', 'block<i>'"),
    (("block1.token",), ConfigError, r"'block<i>.tokens' \(that block's tokens\)"),
    (("block99.tokens",), UnknownNameError, "block99"),
])
def test_bad_token_layers_are_refused_before_any_work(layers, error, message):
    with pytest.raises(error, match=message):
        load_encoder(EncoderSpec(name="vit", arch="vit_tiny_patch16_224", layers=layers, input_size=32))


def _config(tmp_path, protocols, layers=("pre_logits", "block11.tokens")) -> dict:
    return {
        "store": str(tmp_path / "store"),
        "encoders": [{"name": "vit", "arch": "vit_tiny_patch16_224", "input_size": 32, "layers": list(layers)}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 8, "test": 4}}}],
        "protocols": protocols,
        "report": {"path": str(tmp_path / "report.html")},
    }


def test_token_layers_pair_only_with_token_protocols(tmp_path):
    cfg = load_config(_config(tmp_path, [{"name": "knn", "protocol": "knn"},
                                         {"name": "att", "protocol": "attentive"}]))
    check_plan(cfg)
    assert {(c.layer, c.setting) for c in evaluation_cells(cfg)} == {("pre_logits", "knn"),
                                                                   ("block11.tokens", "att")}


def test_a_layer_mapping_with_tokens_true_is_the_token_layer(tmp_path):
    layers = ("pre_logits", {"layer": "block11", "tokens": True}, {"layer": "block3", "tokens": False})
    cfg = load_config(_config(tmp_path, [{"name": "att", "protocol": "attentive"}], layers))
    assert cfg.encoders[0].layers == ["pre_logits", "block11.tokens", "block3"]
    with pytest.raises(ConfigError, match=r"encoders\[0\].layers\[1\]: \{'layer': 'block11', 'token': True\}; "
                                          "a layer is a name"):
        load_config(_config(tmp_path, [], ("pre_logits", {"layer": "block11", "token": True})))


@pytest.mark.parametrize("protocols, layers, message", [
    ([{"name": "att", "protocol": "attentive"}], ("pre_logits",),
     r"protocols\[0\] \(att\): protocol 'attentive' reads token features, but no encoder extracts a token layer"),
    ([{"name": "att", "protocol": "attentive", "layers": ["pre_logits"]}], ("pre_logits", "block11.tokens"),
     r"protocols\[0\].layers: 'pre_logits' is a pooled layer, which protocol 'attentive' \(att\) cannot read"),
    ([{"name": "knn", "protocol": "knn", "layers": ["block11.tokens"]}], ("pre_logits", "block11.tokens"),
     r"protocols\[0\].layers: 'block11.tokens' is a token layer, which protocol 'knn' \(knn\) cannot read"),
])
def test_token_protocols_without_token_layers_are_refused_at_load(tmp_path, protocols, layers, message):
    with pytest.raises(ConfigError, match=message):
        check_plan(load_config(_config(tmp_path, protocols, layers)))


def test_token_features_attentive_probe_beats_the_mean_pooled_linear_probe(tmp_path, marked):
    store = FeatureStore(str(tmp_path / "s"))
    spec = EncoderSpec(name="vit", arch="vit_tiny_patch16_224", layers=("block0.tokens",), input_size=SIZE)
    encoder = load_encoder(spec, device="cpu")
    for split in ("train", "test"):
        extract(store, encoder, marked, split, CFG)
    settings = {"num_heads": 4, "learning_rates": [0.003, 0.03], "weight_decays": [0.0], "max_epochs": 40,
                "patience": 10, "device": "cpu"}
    rec = evaluate_cell(store, Cell("vit", "marked", "block0.tokens", "att", "attentive", settings)).record
    assert rec["n_tokens"] == 17 and rec["dim"] == 192 and rec["diagnostics"]["n_tokens"] == 17

    def mean_pooled(split):
        return store.features("vit", "marked", split, "block0.tokens").read().astype(np.float32).mean(axis=1)

    y_train, y_test = store.labels("marked", "train").read(), store.labels("marked", "test").read()
    pooled = EvalData(y_train=y_train, X_test=mean_pooled("test"), y_test=y_test, n_classes=4,
                      X_train=mean_pooled("train"))
    linear = get_protocol("logistic")(pooled, {"device": "cpu"}).metrics["score"]
    attentive = rec["metrics"]["score"]
    assert attentive >= 0.9 and linear <= 0.6 and attentive - linear >= 0.3, (attentive, linear)
    # a pooled-feature protocol on the token layer: refused, naming the shapes and who reads tokens
    with pytest.raises(DataValidationError, match=r"token features, which protocol 'knn' cannot take.*attentive"):
        evaluate_cell(store, Cell("vit", "marked", "block0.tokens", "knn", "knn"), record=False)


def test_a_damaged_token_chunk_is_repaired_bitwise_beside_its_pooled_layer(tmp_path, tiny):
    from jobs.extraction.repair import repair

    spec = EncoderSpec(name="vit", arch="vit_tiny_patch16_224", layers=("block1", "block1.tokens"), input_size=32)
    store = FeatureStore(str(tmp_path / "s"))
    extract(store, spec, tiny, "test", ExtractConfig(batch_size=4, chunk_batches=1, progress=False, device="cpu"))
    key = "features/vit/textures/test/block1.tokens"
    before = store.features("vit", "textures", "test", "block1.tokens").read()
    chunk = tmp_path / "s" / key / "c" / "1" / "0" / "0"  # row chunk 1 of a (rows, T, d) array
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    summary = repair(store, device="cpu")
    assert {r.key: r.chunks for r in summary.repaired} == {key: [1]} and not summary.failed
    after = store.features("vit", "textures", "test", "block1.tokens").read()
    assert after.dtype == np.float16 and after.tobytes() == before.tobytes()
