"""Saliency and attentive diffusion, feature inversion, colour errors, the perceptual
distance and the PNG pictures: direct formulas and hand-made inputs, then tiny random-init
timm models on CPU."""

from __future__ import annotations

import io

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from pipeline.datasets import make_dataset
from pipeline.protocols.diagnostics import (
    InversionSettings,
    PerceptualNet,
    SaliencySettings,
    attentive_diffusion,
    attentive_diffusion_per_image,
    colour_detail_study,
    colour_errors,
    gradient_saliency,
    invert_features,
    occlusion_saliency,
    perceptual_distance,
    render_reconstructions_png,
    render_saliency_png,
    saliency_study,
    total_variation,
)
from pipeline.protocols.diagnostics.images import feature_function, load_images
from pipeline.encoders import EncoderSpec, load_encoder
from pipeline.errors import CheckpointError, ConfigError, DataValidationError

SPEC = EncoderSpec(name="tiny", arch="test_resnet", input_size=32)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def encoder():
    return load_encoder(SPEC, device="cpu")


@pytest.fixture(scope="module")
def textures():
    return make_dataset("textures", n_per_class={"train": 2, "test": 3})


# -- attentive diffusion -------------------------------------------------------------------

def test_attentive_diffusion_of_hand_made_maps():
    one_hot = np.zeros((4, 4))
    one_hot[1, 2] = 5.0  # 1 pixel of 16 above the mean
    half = np.array([[0.0, 0.0], [1.0, 1.0]])  # mean 0.5: 2 of 4 above
    ramp = np.arange(10.0).reshape(2, 5)  # mean 4.5: 5, 6, 7, 8, 9 above
    at_mean = np.array([[1.0, 3.0], [2.0, 2.0]])  # mean 2: only 3 is strictly above
    assert attentive_diffusion(one_hot) == 6.25
    assert attentive_diffusion_per_image(np.stack([half, 1 - half])).tolist() == [50.0, 50.0]
    assert attentive_diffusion(ramp) == 50.0
    assert attentive_diffusion(at_mean) == 25.0
    assert attentive_diffusion(np.full((3, 3), 7.0)) == 0.0
    assert attentive_diffusion(np.stack([one_hot, np.ones((4, 4)) - one_hot])) == pytest.approx((6.25 + 93.75) / 2)


def test_attentive_diffusion_matches_the_direct_formula():
    maps = np.random.default_rng(0).gamma(2.0, size=(7, 9, 11))
    expected = np.mean([100.0 * np.count_nonzero(m > m.mean()) / m.size for m in maps])
    assert attentive_diffusion(maps) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize(("maps", "fragment"), [
    (np.zeros(5), "must be \\(H, W\\) or \\(n, H, W\\)"),
    (np.zeros((0, 3, 3)), "non-empty"),
    (np.array([[[0.0, np.nan]], [[1.0, 2.0]]]), "saliency map\\(s\\) \\[0\\] hold NaN"),
])
def test_bad_maps_are_refused(maps, fragment):
    with pytest.raises(DataValidationError, match=fragment):
        attentive_diffusion(maps)


# -- saliency ----------------------------------------------------------------------------------

def test_gradient_saliency_of_a_linear_map_matches_the_closed_form():
    """f(x) = W vec(x): d||f|| / dx = W^T f / ||f||, reshaped; saliency = max |.| over channels."""
    rng = np.random.default_rng(1)
    W = torch.tensor(rng.normal(size=(5, 3 * 4 * 6)))
    x = torch.tensor(rng.uniform(size=(2, 3, 4, 6)))
    got = gradient_saliency(lambda t: t.flatten(1) @ W.T, x)
    f = x.flatten(1) @ W.T
    grad = (f / f.norm(dim=1, keepdim=True)) @ W
    expected = grad.reshape(2, 3, 4, 6).abs().amax(dim=1)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


def test_occlusion_saliency_matches_a_brute_force_loop():
    """With f = identity the feature change of a square is ||x_square - mean colour||."""
    rng = np.random.default_rng(2)
    x = torch.tensor(rng.uniform(size=(2, 3, 5, 6)))
    patch, stride = 2, 2  # squares at 0, 2, 3 (the last one covers the edge) and 0, 2, 4
    got = occlusion_saliency(lambda t: t.flatten(1), x, patch, stride, batch_size=4)
    expected = np.zeros((2, 5, 6))
    for k in range(2):
        img = x[k].numpy()
        fill = img.mean(axis=(1, 2))
        credit, count = np.zeros((5, 6)), np.zeros((5, 6))
        for i in (0, 2, 3):
            for j in (0, 2, 4):
                occluded = img.copy()
                occluded[:, i:i + patch, j:j + patch] = fill[:, None, None]
                credit[i:i + patch, j:j + patch] += np.linalg.norm(occluded - img)
                count[i:i + patch, j:j + patch] += 1
        expected[k] = credit / count
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    with pytest.raises(ConfigError, match="occlusion patch must be in \\[1, 5\\]"):
        occlusion_saliency(lambda t: t.flatten(1), x, patch=6, stride=1)


def test_gradient_saliency_of_a_tiny_model_is_per_image(encoder, textures):
    images = load_images(textures, "test", np.arange(3), encoder.data_config)
    features = feature_function(encoder)
    maps = gradient_saliency(features, images)
    assert maps.shape == (3, 32, 32) and bool((maps >= 0).all()) and bool(torch.isfinite(maps).all())
    alone = gradient_saliency(features, images[1:2])
    torch.testing.assert_close(maps[1:2], alone, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("method", ["gradient", "occlusion"])
def test_saliency_study_record(encoder, textures, method):
    settings = SaliencySettings(method=method, n_images=5, batch_size=2, patch=8, stride=8, n_examples=2)
    out = saliency_study(encoder, textures, "test", settings)
    d = out["diagnostics"]
    assert d["n_images"] == 5 and len(d["sample_indices"]) == 5 and d["image_size"] == [32, 32]
    assert out["metrics"]["attentive_diffusion"] == pytest.approx(np.mean(d["per_image"]), rel=1e-12)
    assert 0.0 < out["metrics"]["attentive_diffusion"] < 100.0
    assert out["examples"]["images"].shape == (2, 32, 32, 3) and out["examples"]["images"].dtype == np.uint8
    assert d["per_image"][:2] == attentive_diffusion_per_image(out["examples"]["maps"]).tolist()
    assert saliency_study(encoder, textures, "test", settings)["diagnostics"]["per_image"] == d["per_image"]


def test_saliency_settings_and_inputs_are_checked(encoder, textures):
    with pytest.raises(ConfigError, match="saliency method 'smoothgrad' is not one of gradient, occlusion"):
        SaliencySettings(method="smoothgrad")
    with pytest.raises(ConfigError, match="n_images must be an integer >= 1"):
        SaliencySettings(n_images=0)
    with pytest.raises(ValueError, match="Unknown split"):
        saliency_study(encoder, textures, "val")
    with pytest.raises(ConfigError, match="loaded on cpu, not on device='meta'"):
        saliency_study(encoder, textures, "test", device="meta")


# -- inversion and colour ------------------------------------------------------------------

def test_total_variation_matches_the_direct_formula():
    x = np.random.default_rng(3).uniform(size=(2, 3, 4, 5))
    per_image = [((img[:, :, 1:] - img[:, :, :-1]) ** 2).mean() + ((img[:, 1:] - img[:, :-1]) ** 2).mean()
                 for img in x]
    assert float(total_variation(torch.tensor(x))) == pytest.approx(np.mean(per_image), rel=1e-14)


def test_colour_errors_match_the_direct_formula():
    rng = np.random.default_rng(4)
    a, b = rng.uniform(size=(3, 3, 5, 4)), rng.uniform(size=(3, 3, 5, 4))
    b[:, 2] = a[:, 2]  # blue reconstructed exactly
    out = colour_errors(torch.tensor(a), b)
    for c, name in enumerate(("red", "green", "blue")):
        direct = sum((a[i, c, y, x] - b[i, c, y, x]) ** 2 for i in range(3) for y in range(5) for x in range(4)) / 60
        assert out[name] == pytest.approx(direct, rel=1e-12)
    assert out["blue"] == 0.0 and out["mean"] == pytest.approx((out["red"] + out["green"]) / 3, rel=1e-12)
    with pytest.raises(DataValidationError, match="two \\(n, 3, H, W\\) arrays of one shape"):
        colour_errors(a, b[:2])


def test_inversion_lowers_the_feature_loss(encoder, textures):
    originals = load_images(textures, "test", np.arange(2), encoder.data_config)
    recon, info = invert_features(feature_function(encoder), originals,
                                  InversionSettings(steps=25, lr=0.05, tv_weight=0.01))
    assert recon.shape == originals.shape and float(recon.min()) >= 0.0 and float(recon.max()) <= 1.0
    assert info["feature_loss_final"] < 0.5 * info["feature_loss_initial"]


def test_inversion_settings_are_checked():
    with pytest.raises(ConfigError, match="lr must be a finite number > 0, got 0"):
        InversionSettings(lr=0)
    with pytest.raises(ConfigError, match="tv_weight must be a finite number >= 0"):
        InversionSettings(tv_weight=-1.0)


# -- perceptual distance -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def perceptual_file(tmp_path_factory):
    torch.manual_seed(7)
    model = timm.create_model("test_resnet", num_classes=0)
    path = tmp_path_factory.mktemp("perceptual") / "percept.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return path


def test_perceptual_distance_matches_the_direct_formula(perceptual_file):
    import torchvision.transforms.functional as TF

    net = load_encoder(PerceptualNet("test_resnet", str(perceptual_file), input_size=32).spec(), device="cpu")
    rng = torch.Generator().manual_seed(0)
    x, y = torch.rand((2, 3, 32, 32), generator=rng), torch.rand((2, 3, 32, 32), generator=rng)
    got = perceptual_distance(net, x, y, layers=(1, 3))
    norm = lambda t: TF.normalize(t, list(net.data_config["mean"]), list(net.data_config["std"]))  # noqa: E731
    with torch.no_grad():
        fx = net.model.forward_intermediates(norm(x), indices=[1, 3], intermediates_only=True)
        fy = net.model.forward_intermediates(norm(y), indices=[1, 3], intermediates_only=True)
    expected = torch.zeros(2)
    for a, b in zip(fx, fy):
        for i in range(2):
            ua = a[i] / a[i].norm(dim=0, keepdim=True)
            ub = b[i] / b[i].norm(dim=0, keepdim=True)
            expected[i] += ((ua - ub) ** 2).sum(dim=0).mean() / 2
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    assert float(perceptual_distance(net, x, x).abs().max()) == 0.0
    with pytest.raises(ConfigError, match="perceptual layers \\[9\\] must be non-empty indices in \\[0, 4\\]"):
        perceptual_distance(net, x, y, layers=(9,))


def test_perceptual_network_only_from_a_local_file(tmp_path, encoder, textures):
    with pytest.raises(ConfigError, match="must be a local checkpoint file, got 'random'"):
        PerceptualNet("test_resnet", "random").spec()
    with pytest.raises(ConfigError, match="must be a local checkpoint file, got 'pretrained'"):
        colour_detail_study(encoder, textures, perceptual=PerceptualNet("test_resnet", "pretrained"))
    with pytest.raises(CheckpointError, match="does not exist"):
        colour_detail_study(encoder, textures, perceptual=PerceptualNet("test_resnet", str(tmp_path / "no.pth")))


def test_colour_detail_study_record(encoder, textures, perceptual_file):
    settings = InversionSettings(steps=5, n_images=3, batch_size=2, n_examples=2)
    out = colour_detail_study(encoder, textures, "test", settings,
                              perceptual=PerceptualNet("test_resnet", str(perceptual_file), layers=(0, 2)))
    m, d = out["metrics"], out["diagnostics"]
    assert set(m) == {"colour_mse_red", "colour_mse_green", "colour_mse_blue", "colour_mse_mean",
                      "perceptual_distance"}
    assert m["colour_mse_mean"] == pytest.approx(np.mean([m[f"colour_mse_{c}"] for c in ("red", "green", "blue")]))
    assert m["perceptual_distance"] > 0.0 and d["n_images"] == 3
    assert d["perceptual"] == {"arch": "test_resnet", "file": "percept.safetensors", "layers": [0, 2]}
    assert d["feature_loss_final"] < d["feature_loss_initial"]
    assert out["examples"]["originals"].shape == out["examples"]["reconstructions"].shape == (2, 32, 32, 3)
    plain = colour_detail_study(encoder, textures, "test", settings)
    assert plain["metrics"]["perceptual_distance"] is None and plain["diagnostics"]["perceptual"] is None
    assert plain["metrics"]["colour_mse_red"] == m["colour_mse_red"]  # seeded: the same reconstructions


# -- pictures --------------------------------------------------------------------------------------

def test_pngs_decode_with_the_expected_layout():
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, size=(3, 16, 16, 3), dtype=np.uint8)
    png = render_saliency_png(images, rng.uniform(size=(3, 16, 16)), dpi=50)
    with Image.open(io.BytesIO(png)) as img:
        assert img.format == "PNG" and img.size == (3 * 80, 2 * 80)  # 1.6 in tiles at 50 dpi
    png = render_reconstructions_png(images, images[::-1] / 255.0, dpi=50)
    with Image.open(io.BytesIO(png)) as img:
        assert img.size == (240, 160)
    with pytest.raises(DataValidationError, match="maps must be \\(k, H, W\\) = \\(3, 16, 16\\)"):
        render_saliency_png(images, np.zeros((3, 8, 8)))
    with pytest.raises(DataValidationError, match="images must be a non-empty \\(k, H, W, 3\\) array"):
        render_saliency_png(images[..., 0], np.zeros((3, 16, 16)))
