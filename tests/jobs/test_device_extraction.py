"""Extraction as it runs on a GPU worker, exercised on the CPU through the same code:
images decoded and resized on the device (vs PIL's pixels), autocast precisions and
channels-last recorded in provenance and fingerprints, DataLoader settings, and the
default CPU extraction unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from jobs.config import ExtractConfig, load_config
from jobs.extraction.extract import extract
from jobs.extraction.forward import loader_settings
from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec, load_encoder
from pipeline.encoders.device_preprocess import DevicePreprocess
from pipeline.errors import ConfigError, CorruptImageError
from storage_schema import FeatureStore, array_fingerprint
from storage_schema.provenance import FEATURE_CODE_VERSION, stable_hash

SIZES = [(300, 400), (97, 131), (512, 256), (40, 40)]


def _image_folder(root: Path, per_class: int = 4) -> Path:
    """Noisy smooth images as JPEGs of several sizes, a grayscale JPEG and a PNG per class."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("a", "b"):
            folder = root / split / c
            folder.mkdir(parents=True)
            for k, (h, w) in enumerate(SIZES[:per_class]):
                yy, xx = np.mgrid[0:h, 0:w]
                img = np.stack([np.sin(xx / (7 + k)) * 127 + 128, np.cos(yy / (5 + k)) * 127 + 128, (xx + yy) % 256], -1)
                img = np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8)
                Image.fromarray(img).save(folder / f"{k}.jpg", quality=90)
            Image.fromarray(img[..., 0]).save(folder / "gray.jpg", quality=85)
            Image.fromarray(img).save(folder / "png.png")
    return root


def _encoded(dataset, split):
    n = dataset.num_samples(split)
    return [torch.frombuffer(bytearray(dataset.encoded_image(split, i)), dtype=torch.uint8) for i in range(n)]


@pytest.mark.parametrize("arch,size", [("resnet50", None), ("resnet18", 32)])
def test_device_decoding_on_the_cpu_gives_pils_pixels_within_rounding(tmp_path, arch, size):
    dataset = make_dataset("image_folder", name="files", root=str(_image_folder(tmp_path)))
    encoder = load_encoder(EncoderSpec(name="e", arch=arch, input_size=size), device="cpu")
    n = dataset.num_samples("train")
    pil = torch.stack([encoder.transform()(dataset.load_image("train", i)) for i in range(n)])
    pre = DevicePreprocess(encoder.data_config, torch.device("cpu"), lambda i: dataset.load_image("train", i))
    # decoding alone: libjpeg in both, the same pixels
    for data, i in zip(_encoded(dataset, "train"), range(n)):
        decoded = pre.decode([data], [i])[0].permute(1, 2, 0).numpy()
        assert np.abs(decoded.astype(int) - np.asarray(dataset.load_image("train", i), dtype=int)).max() <= 1
    ours = pre(_encoded(dataset, "train"), list(range(n)))
    assert ours.shape == pil.shape and ours.dtype == pil.dtype == torch.float32
    levels = (ours - pil).abs() * torch.tensor(encoder.data_config["std"]).view(1, 3, 1, 1) * 255
    # bicubic resizing rounds differently on tensors: a fifth of a grey level on average
    assert levels.mean() < 0.5 and levels.max() <= 8 and (levels > 2).float().mean() < 0.01


def test_a_corrupt_file_decoded_on_the_device_is_named(tmp_path):
    root = _image_folder(tmp_path / "imgs", per_class=1)
    bad = root / "train" / "a" / "0.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # a torn JPEG
    dataset = make_dataset("image_folder", name="files", root=str(root))
    encoder = load_encoder(EncoderSpec(name="e", arch="resnet18", input_size=32), device="cpu")
    pre = DevicePreprocess(encoder.data_config, torch.device("cpu"), lambda i: dataset.load_image("train", i))
    with pytest.raises(CorruptImageError, match="0.jpg"):
        pre(_encoded(dataset, "train"), list(range(dataset.num_samples("train"))))


def _extract(store, dataset, name, **settings):
    spec = EncoderSpec(name=name, arch="resnet18", input_size=32, layers=("pre_logits", "block3"))
    return extract(store, spec, dataset, "train", ExtractConfig(batch_size=4, chunk_batches=2, progress=False,
                                                                device="cpu", **settings))


def test_extraction_settings_are_recorded_and_fingerprinted_and_stay_close(tmp_path):
    dataset = make_dataset("image_folder", name="files", root=str(_image_folder(tmp_path / "imgs")))
    store = FeatureStore(str(tmp_path / "store"))
    base = _extract(store, dataset, "base")
    runs = {"decode": _extract(store, dataset, "decode", decode="device"),
            "bf16": _extract(store, dataset, "bf16", precision="bfloat16", channels_last=True),
            "fp16": _extract(store, dataset, "fp16", precision="float16")}
    reference = store.features("base", "files", "train", "pre_logits")
    assert reference.attrs["decode"] == "pil" and reference.attrs["encoder"]["compute_precision"] == "float32"
    expected = {"decode": ("float32", "device"), "bf16": ("bfloat16-autocast+channels_last", "pil"),
                "fp16": ("float16-autocast", "pil")}
    for name, report in runs.items():
        stored = store.features(name, "files", "train", "pre_logits")
        precision, decode = expected[name]
        assert stored.attrs["encoder"]["compute_precision"] == precision and stored.attrs["decode"] == decode
        assert report.fingerprints["pre_logits"] != base.fingerprints["pre_logits"]
        x, ref = stored.read(), reference.read()
        assert np.linalg.norm(x - ref) / np.linalg.norm(ref) < 0.05  # the same features, rounded otherwise
    bf16 = store.features("bf16", "files", "train", "pre_logits").attrs["encoder"]
    assert bf16["autocast_dtype"] == "bfloat16" and bf16["channels_last"] is True


def test_default_cpu_extraction_keeps_its_fingerprint_and_is_deterministic(tmp_path):
    dataset = make_dataset("image_folder", name="files", root=str(_image_folder(tmp_path / "imgs")))
    store = FeatureStore(str(tmp_path / "store"))
    report = _extract(store, dataset, "a")
    encoder = load_encoder(EncoderSpec(name="a", arch="resnet18", input_size=32, layers=("pre_logits", "block3")),
                           device="cpu")
    assert not encoder.autocast and not encoder.channels_last  # auto on the CPU: as before
    before = stable_hash({  # the fingerprint as it was computed before these settings existed
        "code": FEATURE_CODE_VERSION, "weights": encoder.weights_fingerprint, "arch": "resnet18",
        "data_config": encoder.data_config, "layer": "pre_logits", "pooling": encoder.pooling("pre_logits"),
        "dataset": dataset.fingerprint("train"), "split": "train", "dtype": "float32", "precision": "float32"})
    assert report.fingerprints["pre_logits"] == before == array_fingerprint(
        weights_fingerprint=encoder.weights_fingerprint, data_config=encoder.data_config, layer="pre_logits",
        pooling=encoder.pooling("pre_logits"), dataset_fingerprint=dataset.fingerprint("train"), split="train",
        dtype="float32", arch="resnet18")
    direct = np.concatenate([encoder(torch.stack([encoder.transform()(dataset.load_image("train", i))
                                                  for i in range(s, min(s + 4, 12))]))["pre_logits"]
                             for s in range(0, 12, 4)])
    np.testing.assert_array_equal(store.features("a", "files", "train", "pre_logits").read(), direct)


def test_loader_settings_and_bad_values():
    assert loader_settings("auto", "auto", torch.device("cpu")) == (0, False)
    workers, pin = loader_settings("auto", "auto", torch.device("cuda"))
    assert pin is True and 1 <= workers <= 16
    assert loader_settings(3, False, torch.device("cuda")) == (3, False)
    base = {"encoders": [{"name": "a", "arch": "resnet18"}], "datasets": [{"name": "d", "adapter": "digits"}],
            "protocols": [{"name": "k", "protocol": "knn"}]}
    for field, value in (("precision", "float8"), ("decode", "gpu"), ("num_workers", -1), ("channels_last", "yes")):
        with pytest.raises(ConfigError, match=field):
            load_config({**base, "extract": {field: value}})
    assert load_config({**base, "extract": {"num_workers": "auto", "precision": "bfloat16"}}).extract.num_workers == "auto"


def test_cli_extract_takes_the_device_settings_and_refuses_bad_ones(tmp_path, capsys):
    from flows.cli.main import main

    root = str(_image_folder(tmp_path / "imgs", per_class=1))
    store = str(tmp_path / "store")
    common = ["extract", "--store", store, "--arch", "resnet18", "--input-size", "32", "--dataset", "image_folder",
              "--dataset-name", "files", "--param", f"root={root}", "--split", "train", "--device", "cpu", "--quiet"]
    assert main([*common, "--precision", "float8"]) == 2
    assert "precision 'float8' is not one of auto, float32" in capsys.readouterr().err
    assert main([*common, "--workers", "many"]) == 2
    assert "num_workers must be an integer >= 0 or 'auto'" in capsys.readouterr().err
    assert not Path(store).exists()  # refused before the store was touched
    assert main([*common, "--precision", "bfloat16", "--decode", "device", "--workers", "1", "--batch-size", "2"]) == 0
    attrs = FeatureStore(store).features("resnet18", "files", "train", "pre_logits").attrs
    assert attrs["decode"] == "device" and attrs["encoder"]["compute_precision"] == "bfloat16-autocast"
