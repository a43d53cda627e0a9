"""The seed's normals readout: PSPNet's pyramid pooling head and classification over
clustered normals (Goyal et al.'s code, used by Ericsson et al.), each piece against a
direct computation, and the whole protocol learning, resuming bitwise and fitting its
memory estimate; the other formulation (regression of unit normals) stays available."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import pairwise_distances_argmin

from pipeline.protocols import get_protocol, resolve_settings
from pipeline.protocols.dense.codebook import codebook_loss, decode_normals, nearest_centre, normal_codebook
from pipeline.protocols.dense.heads import HEADS, POOL_SCALES, PyramidPooling, make_head
from tests.helpers.protocols import CHEAP, dense_data

PSP = {**CHEAP["normals"], "head": "pspnet", "hidden_units": 8, "learning_rate": 1.0, "epochs": 6}
# the cosine loss moves the tiny pyramid more slowly than cross-entropy over the centres does
SLOWER = {"classification": {}, "regression": {"learning_rate": 0.2, "epochs": 24}}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():  # tiny arrays: a torch thread pool only adds waiting on shared cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(data, **settings):
    return get_protocol("normals")(data, resolve_settings("normals", {**PSP, **settings}))


def test_the_defaults_are_the_seed_s():
    s = resolve_settings("normals", {})
    assert (s["head"], s["formulation"], s["clusters"], s["hidden_units"]) == ("pspnet", "classification", 40, 512)
    assert (s["epochs"], s["batch_size"], s["momentum"], s["power"], s["learning_rate"]) == (150, 4, 0.9, 0.9, 0.02)
    assert get_protocol("normals").version == 2
    assert set(get_protocol("normals").choices["head"]) == set(HEADS)


def test_the_pyramid_head_is_the_pspnet_formula():
    torch.manual_seed(0)
    head = PyramidPooling(5, 3, 4, seed=0).eval()
    x = torch.randn(2, 5, 6, 6)
    with torch.no_grad():
        for module in head.modules():  # running statistics away from (0, 1), to be exercised
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
        out = head(x)
        # written out: pool, 1x1 conv, BN, ReLU, upsample per scale; concat; 3x3 conv, BN, ReLU; 1x1 conv
        parts = [x]
        for scale, branch in zip(POOL_SCALES, head.branches):
            conv, bn = branch[1], branch[2]
            p = torch.nn.functional.adaptive_avg_pool2d(x, scale)
            p = torch.nn.functional.conv2d(p, conv.weight)
            p = (p - bn.running_mean[None, :, None, None]) / torch.sqrt(bn.running_var[None, :, None, None] + bn.eps)
            p = torch.relu(p * bn.weight[None, :, None, None] + bn.bias[None, :, None, None])
            parts.append(torch.nn.functional.interpolate(p, size=(6, 6), mode="bilinear", align_corners=False))
        conv, bn, last = head.fuse[0], head.fuse[1], head.fuse[4]
        y = torch.nn.functional.conv2d(torch.cat(parts, 1), conv.weight, padding=1)
        y = (y - bn.running_mean[None, :, None, None]) / torch.sqrt(bn.running_var[None, :, None, None] + bn.eps)
        y = torch.relu(y * bn.weight[None, :, None, None] + bn.bias[None, :, None, None])
        expected = torch.nn.functional.conv2d(y, last.weight, last.bias)
    assert out.shape == (2, 3, 6, 6)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    head.train()
    head(torch.randn(1, 5, 6, 6))  # one image: the 1x1 branch's batch norm has one value per channel
    assert int(head.fuse[3].calls) == 1


def test_dropout_masks_are_seeded_not_global():
    mean, std = torch.zeros(5), torch.ones(5)
    outs = []
    for noise in (0, 1):
        head = make_head("pspnet", 5, 3, 4, mean, std, seed=3).train()
        torch.manual_seed(noise)  # the process-wide generator moves; the head's masks do not
        torch.rand(7)
        outs.append(head(torch.ones(2, 6, 6, 5)).detach())
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_nearest_centre_and_decoding_are_the_direct_formulas():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(7, 3))
    normals = rng.normal(size=(2, 4, 5, 3))
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    normals[0, 0] = 0.0  # invalid pixels
    labels = nearest_centre(torch.from_numpy(normals), torch.from_numpy(centres).float()).numpy()
    valid = np.abs(normals).sum(-1) > 0
    assert np.array_equal(labels[valid], pairwise_distances_argmin(normals[valid], centres))
    assert np.all(labels[~valid] == -100)
    logits = rng.normal(size=(2, 7, 4, 5)).astype(np.float32)
    got = decode_normals(centres)(torch.from_numpy(logits)).numpy()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    mixed = np.einsum("bkhw,kc->bhwc", p, centres)
    np.testing.assert_allclose(got, mixed / np.linalg.norm(mixed, axis=-1, keepdims=True), atol=2e-3)  # float16
    loss = codebook_loss(centres)(torch.from_numpy(logits), torch.from_numpy(normals)).item()
    logp = np.log(p).transpose(0, 2, 3, 1)[valid]
    assert loss == pytest.approx(-np.mean(logp[np.arange(valid.sum()), labels[valid]]), rel=1e-5)


def test_the_codebook_is_k_means_of_the_training_normals():
    data = dense_data("normals")
    rows = [np.arange(len(data.y_train))]
    # four distinct axis normals in the targets: K falls to 4 and the centres are those normals
    book = normal_codebook([data.y_train], rows, 40, seed=0)
    axes = {(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (-1.0, 0.0, 0.0)}
    assert book.shape == (4, 3) and {tuple(np.round(c, 6) + 0.0) for c in book} == axes
    rng = np.random.default_rng(1)
    normals = rng.normal(size=(3, 10, 10, 3))
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    book = normal_codebook([normals], [np.arange(3)], 5, seed=2, sample=300)  # every pixel: the sample is all
    points = normals.reshape(-1, 3)
    # a k-means solution: every centre is the mean of the points nearest to it (Lloyd's fixed point)
    nearest = pairwise_distances_argmin(points, book)
    assert book.shape == (5, 3) and len(np.unique(nearest)) == 5
    np.testing.assert_allclose(book, [points[nearest == k].mean(axis=0) for k in range(5)], atol=1e-6)
    # and no worse than scikit-learn's own run on the points in stored order
    direct = KMeans(n_clusters=5, n_init=1, random_state=2).fit(points)
    assert np.min(((points[:, None] - book[None]) ** 2).sum(-1), axis=1).sum() <= direct.inertia_ * 1.1


@pytest.mark.parametrize("formulation", ["classification", "regression"])
def test_the_pspnet_head_learns_in_either_formulation(formulation):
    good = _run(dense_data("normals"), formulation=formulation, **SLOWER[formulation])
    noise = _run(dense_data("normals", informative=False), formulation=formulation, **SLOWER[formulation])
    assert good.metrics["within_30"] > 0.55 > 0.3 > noise.metrics["within_30"], (good.metrics, noise.metrics)
    assert good.diagnostics["head"] == "pspnet" and good.diagnostics["formulation"] == formulation
    if formulation == "classification":
        assert good.diagnostics["clusters"] == 4 and len(good.diagnostics["codebook"]) == 4


class Interrupted(Exception):
    pass


def test_an_interrupted_pspnet_training_resumes_bitwise(tmp_path):
    data = dense_data("normals")
    reference = _run(dataclasses.replace(data, scratch_dir=tmp_path / "ref"), save_every=2)

    def stop(run, steps):
        if steps == 5:
            raise Interrupted

    victim = dataclasses.replace(data, scratch_dir=tmp_path / "victim", on_step=stop)
    with pytest.raises(Interrupted):
        _run(victim, save_every=2)
    resumed = _run(dataclasses.replace(victim, on_step=None), save_every=2)
    assert resumed.diagnostics["train"]["resumed_from"] == 4
    assert resumed.metrics == reference.metrics  # dropout masks and batch-norm statistics resumed too
    np.testing.assert_array_equal(resumed.maps, reference.maps)


def test_memory_estimate_counts_the_pyramid_and_the_logits():
    proto = get_protocol("normals")
    shape = dict(n_val=0, dim=256, n_classes=3, itemsize=2, n_tokens=14 * 14, target_pixels=224 * 224)
    psp = proto.memory_bytes(795, 654, **shape, settings=resolve_settings("normals", {}))
    conv = proto.memory_bytes(795, 654, **shape, settings=resolve_settings("normals", {"head": "conv"}))
    regression = proto.memory_bytes(795, 654, **shape, settings=resolve_settings(
        "normals", {"formulation": "regression"}))
    params = (4 * 256 * 512 + 9 * (256 + 4 * 512) * 512 + 512 * 40) * 4
    assert psp - conv > 3 * params  # weights, gradients, momentum at least
    logits = 4 * 40 * 224 * 224 * 4  # one batch's upsampled logits over 40 centres
    assert psp - regression > 3 * logits
