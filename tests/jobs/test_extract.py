"""The extraction job on real timm models and a real Zarr store."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from jobs.extraction.extract import ExtractConfig, extract
from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec, load_encoder
from pipeline.errors import (
    CheckpointError, ConfigError, CorruptImageError, InvalidNameError, UnknownNameError,
    UnsafeCheckpointError,
)
from storage_schema import FeatureStore, feature_key, keys
from tests.helpers.cli import REPO, cli_command, cli_env, extract_here, run_cli

CFG = ExtractConfig(batch_size=8, chunk_batches=2, progress=False)
KEY = "features/r18/textures/train/pre_logits"


@pytest.fixture(scope="module")
def textures():
    return make_dataset("textures", n_per_class={"train": 64, "test": 16})


@pytest.fixture(scope="module")
def tiny():
    """16 test images: two batches of 8, one chunk."""
    return make_dataset("textures", n_per_class={"train": 4, "test": 4})


@pytest.fixture(scope="module")
def encoder():
    return load_encoder(EncoderSpec(name="r18", arch="resnet18", layers=("pre_logits", "block3"), input_size=32))


def _arrays(store: FeatureStore, model="r18", dataset="textures", split="train"):
    return {layer: store.features(model, dataset, split, layer).read() for layer in ("pre_logits", "block3")}


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_features_equal_a_direct_forward_pass(tmp_path, textures, encoder):
    store = FeatureStore(str(tmp_path / "s"))
    report = extract(store, encoder, textures, "test", CFG)
    assert report.status == "extracted" and report.forward_batches == 8 and report.images == 64
    tf = encoder.transform()
    images = torch.stack([tf(textures.load_image("test", i)) for i in range(64)])
    direct = encoder.forward(images)
    stored = store.features("r18", "textures", "test", "pre_logits")
    np.testing.assert_array_equal(stored.read(), direct["pre_logits"])
    np.testing.assert_array_equal(store.features("r18", "textures", "test", "block3").read(), direct["block3"])
    np.testing.assert_array_equal(store.labels("textures", "test").read(), textures.labels("test"))
    prov = stored.attrs
    assert prov["encoder"]["arch"] == "resnet18" and prov["encoder"]["weights_fingerprint"]
    assert prov["encoder"]["data_config"]["input_size"] == [3, 32, 32]
    assert prov["dataset_fingerprint"] == textures.fingerprint("test")
    assert prov["chunk_rows"] == 16 and prov["pooling"] and prov["libraries"]["torch"]


def test_rerun_of_complete_extraction_does_no_forward_pass(tmp_path, textures, encoder):
    store = FeatureStore(str(tmp_path / "s"))
    extract(store, encoder, textures, "test", CFG)
    again = extract(store, encoder, textures, "test", CFG)
    assert again.status == "cached" and again.forward_batches == 0


def test_digits_extraction_with_a_vit(tmp_path):
    digits = make_dataset("digits")
    vit = load_encoder(EncoderSpec(name="vit", arch="vit_tiny_patch16_224", input_size=32, layers=("pre_logits", "block11")))
    store = FeatureStore(str(tmp_path / "s"))
    report = extract(store, vit, digits, "test", ExtractConfig(batch_size=64, progress=False))
    assert report.rows == digits.num_samples("test") == 450
    x = store.features("vit", "digits", "test", "pre_logits").read()
    assert x.shape == (450, 192) and np.isfinite(x).all()
    assert store.features("vit", "digits", "test", "block11").attrs["pooling"]


def test_adding_a_layer_keeps_the_stored_one(tmp_path, textures):
    store = FeatureStore(str(tmp_path / "s"))
    one = load_encoder(EncoderSpec(name="r18", arch="resnet18", layers=("pre_logits",), input_size=32))
    extract(store, one, textures, "test", CFG)
    created = store.features("r18", "textures", "test", "pre_logits").attrs["created"]
    two = load_encoder(EncoderSpec(name="r18", arch="resnet18", layers=("pre_logits", "block2"), input_size=32))
    report = extract(store, two, textures, "test", CFG)
    assert report.status == "extracted" and report.forward_batches == 8
    assert store.features("r18", "textures", "test", "pre_logits").attrs["created"] == created


def test_float16_storage(tmp_path, textures, encoder):
    store = FeatureStore(str(tmp_path / "s"))
    extract(store, encoder, textures, "test", ExtractConfig(batch_size=8, dtype="float16", progress=False))
    assert store.features("r18", "textures", "test", "pre_logits").read().dtype == np.float16


@pytest.mark.slow
def test_sigkilled_cli_extraction_resumes_bitwise_equal(tmp_path):
    """The `repeval extract` command killed mid-run; tests/faults/test_kill_extraction.py
    kills an extraction at 20 seeded random moments."""
    reference = FeatureStore(str(tmp_path / "ref"))
    extract_here(str(tmp_path / "ref"))  # the uninterrupted run (the bytes are the claim, not how it starts)
    expected = _arrays(reference)
    n_chunks = reference.status(KEY).n_chunks
    for kill_after in (6,):
        url = str(tmp_path / f"killed{kill_after}")
        proc = subprocess.Popen(cli_command(url), env=cli_env(), cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # block3 is written after pre_logits in each chunk: count its chunk-done markers
        markers = keys.chunk_markers_key(KEY.replace("pre_logits", "block3"), "*")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            done = list(Path(url).glob(f"{markers}/*"))  # chunk-done markers
            if len(done) >= kill_after:
                proc.kill()
                break
            time.sleep(0.02)
        proc.wait()
        killed = FeatureStore(url)
        st = killed.status(KEY)
        assert proc.returncode == -9, "the extraction finished before it could be killed"
        assert not st.complete and kill_after <= len(st.done_chunks) < n_chunks
        # The layers of one chunk are written one after another, so a kill can fall between
        # them: the resume recomputes exactly the chunks some layer still misses.
        missing = set()
        for layer in expected:
            layer_st = killed.status(KEY.replace("pre_logits", layer))
            missing |= set(range(n_chunks)) - set(layer_st.done_chunks if layer_st else ())
        report = run_cli(url)
        assert report["status"] == "resumed"
        assert report["forward_batches"] == 2 * len(missing)
        assert len(missing) <= n_chunks - kill_after  # started at the first missing chunk
        resumed = _arrays(FeatureStore(url))
        for layer in expected:
            assert resumed[layer].tobytes() == expected[layer].tobytes()


@pytest.mark.slow
def test_two_processes_extract_one_array_with_one_forward_pass(tmp_path):
    url = str(tmp_path / "shared")
    FeatureStore(url)
    procs = [subprocess.Popen(cli_command(url), env=cli_env(), cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["status"] for r in reports) == ["cached", "extracted"]
    assert sum(r["forward_batches"] for r in reports) == 32  # 256 images in batches of 8, once
    ref = FeatureStore(str(tmp_path / "ref"))
    extract_here(str(tmp_path / "ref"))
    for layer, arr in _arrays(FeatureStore(url)).items():
        np.testing.assert_array_equal(arr, _arrays(ref)[layer])


def _save_backbone(model: torch.nn.Module, path: Path) -> None:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))


def test_checkpoint_fingerprint_drives_reuse(tmp_path, textures, encoder):
    store = FeatureStore(str(tmp_path / "s"))
    ckpt = tmp_path / "a.safetensors"
    _save_backbone(encoder.model, ckpt)
    spec = EncoderSpec(name="ck", arch="resnet18", weights=str(ckpt), input_size=32)
    first = extract(store, spec, textures, "test", CFG)
    assert first.status == "extracted"
    copy = tmp_path / "renamed-copy.safetensors"
    copy.write_bytes(ckpt.read_bytes())
    same = extract(store, EncoderSpec(name="ck", arch="resnet18", weights=str(copy), input_size=32),
                   textures, "test", CFG)
    assert same.status == "cached" and same.forward_batches == 0
    state = {k: v.clone() for k, v in encoder.model.state_dict().items()}
    state["layer4.1.bn2.bias"][0] += 1.0  # a tensor that reaches pre_logits at random init
    changed = tmp_path / "changed.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(changed))
    old = store.features("ck", "textures", "test", "pre_logits").read()
    new_report = extract(store, EncoderSpec(name="ck", arch="resnet18", weights=str(changed), input_size=32),
                         textures, "test", CFG)
    assert new_report.status == "extracted"
    assert new_report.fingerprints["pre_logits"] != first.fingerprints["pre_logits"]
    new = store.features("ck", "textures", "test", "pre_logits", fingerprint=new_report.fingerprints["pre_logits"])
    assert not np.array_equal(old, new.read())


def test_identical_weights_under_another_name_share_one_forward_pass(tmp_path, tiny, encoder):
    """mine-ep2 (.safetensors) and mine-ep2-pth (.pth) hold the same tensors: the second
    extraction records an alias instead of running the model; both names read the same rows,
    each with its own provenance."""
    store = FeatureStore(str(tmp_path / "s"))
    st_file, pth_file = tmp_path / "mine-ep2.safetensors", tmp_path / "mine-ep2.pth"
    _save_backbone(encoder.model, st_file)
    torch.save(encoder.model.state_dict(), pth_file)
    layers = ("pre_logits", "block3")
    first = extract(store, EncoderSpec("mine-ep2", "resnet18", weights=str(st_file), layers=layers, input_size=32),
                    tiny, "test", CFG)
    assert first.status == "extracted" and first.forward_batches == 2
    second_spec = EncoderSpec("mine-ep2-pth", "resnet18", weights=str(pth_file), layers=layers, input_size=32)
    second = extract(store, second_spec, tiny, "test", CFG)
    assert second.status == "aliased" and second.forward_batches == 0 and second.images == 0
    assert second.fingerprints == first.fingerprints
    assert second.aliases == {layer: first.keys[layer] for layer in layers}
    for layer in layers:
        a = store.features("mine-ep2", "textures", "test", layer)
        b = store.features("mine-ep2-pth", "textures", "test", layer, fingerprint=first.fingerprints[layer])
        np.testing.assert_array_equal(a.read(), b.read())
        assert b.key == second.keys[layer] and b.attrs["alias_of"] == a.key
        assert b.attrs["model"] == "mine-ep2-pth" and a.attrs["model"] == "mine-ep2"
        assert b.attrs["encoder"]["name"] == "mine-ep2-pth"
        assert b.attrs["encoder"]["weights"]["file"] == "mine-ep2.pth"
        assert b.attrs["encoder_spec"]["weights"] == str(pth_file.resolve())
        assert a.attrs["encoder"]["weights"]["file"] == "mine-ep2.safetensors"
    listed = {st.key: st for st in store.list_arrays()}
    assert {second.keys[layer] for layer in layers} <= set(listed)
    assert all(listed[second.keys[layer]].complete for layer in layers)
    assert store.damaged_chunks(second.keys["pre_logits"]) == []
    again = extract(store, second_spec, tiny, "test", CFG)
    assert again.status == "cached" and again.forward_batches == 0


def test_an_alias_whose_array_was_replaced_is_extracted_itself(tmp_path, tiny, encoder):
    store = FeatureStore(str(tmp_path / "s"))
    ckpt = tmp_path / "a.safetensors"
    _save_backbone(encoder.model, ckpt)
    original = extract(store, EncoderSpec("a", "resnet18", weights=str(ckpt), input_size=32), tiny, "test", CFG)
    copy = tmp_path / "b.safetensors"
    copy.write_bytes(ckpt.read_bytes())
    b_spec = EncoderSpec("b", "resnet18", weights=str(copy), input_size=32)
    assert extract(store, b_spec, tiny, "test", CFG).status == "aliased"
    rows = store.features("b", "textures", "test", "pre_logits").read()
    state = {k: v.clone() for k, v in encoder.model.state_dict().items()}
    state["layer4.1.bn2.bias"][0] += 1.0
    save_file({k: v.contiguous() for k, v in state.items()}, str(ckpt))  # "a" now names other weights
    assert extract(store, EncoderSpec("a", "resnet18", weights=str(ckpt), input_size=32),
                   tiny, "test", CFG).status == "extracted"
    assert store.status(original.keys["pre_logits"].replace("/a/", "/b/")) is None  # its rows are gone
    rebuilt = extract(store, b_spec, tiny, "test", CFG)
    assert rebuilt.status == "extracted" and rebuilt.forward_batches == 2
    b = store.features("b", "textures", "test", "pre_logits")
    assert b.attrs.get("alias_of") is None
    np.testing.assert_array_equal(b.read(), rows)


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED_BY_PICKLE",))


@pytest.mark.parametrize("case", ["bad-name", "unknown-arch", "pickle-code", "mismatched-keys", "corrupt-image",
                                  "bad-dtype", "bad-split"])
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, textures, case, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = tmp_path / "s"
    store = FeatureStore(str(url))
    before = _tree(url)
    dataset, split, config, expected = textures, "test", CFG, None
    if case == "bad-name":
        spec, expected = EncoderSpec.__new__(EncoderSpec), InvalidNameError
        with pytest.raises(InvalidNameError, match="path-like"):
            EncoderSpec(name="../escape", arch="resnet18")
        return
    if case == "unknown-arch":
        spec, expected = EncoderSpec(name="x", arch="resnt18"), UnknownNameError
    elif case == "pickle-code":
        path = tmp_path / "evil.pth"
        torch.save({"state_dict": _Evil()}, path)
        spec, expected = EncoderSpec(name="x", arch="resnet18", weights=str(path), input_size=32), UnsafeCheckpointError
    elif case == "mismatched-keys":
        path = tmp_path / "wrong.safetensors"
        save_file({"not.a.resnet.key": torch.zeros(3)}, str(path))
        spec, expected = EncoderSpec(name="x", arch="resnet18", weights=str(path), input_size=32), CheckpointError
    elif case == "corrupt-image":
        root = tmp_path / "imgs"
        for cls in ("a", "b"):
            (root / "test" / cls).mkdir(parents=True)
            for i in range(3):
                textures.load_image("test", i).save(root / "test" / cls / f"{i}.png")
        (root / "test" / "b" / "broken.png").write_bytes(b"\x89PNG not really")
        dataset = make_dataset("image_folder", name="folder", root=str(root))
        spec, expected = EncoderSpec(name="x", arch="resnet18", input_size=32), CorruptImageError
    elif case == "bad-dtype":
        spec, config, expected = EncoderSpec(name="x", arch="resnet18", input_size=32), \
            ExtractConfig(dtype="int8"), ConfigError
    else:
        spec, split, expected = EncoderSpec(name="x", arch="resnet18", input_size=32), "validation", Exception
    with pytest.raises(expected) as info:
        extract(store, spec, dataset, split, config)
    message = str(info.value)
    assert message and len(message) < 2000
    if case == "corrupt-image":
        assert "broken.png" in message
        # the failed extraction leaves no complete array and no held lease
        st = store.status(feature_key("x", "folder", "test", "pre_logits"))
        assert st is None or not st.complete
        assert store.lease("features/x/folder/test").try_acquire()
    else:
        assert _tree(url) == before
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()


def test_dataloader_worker_processes_give_the_same_features(tmp_path, textures, encoder):
    a, b = FeatureStore(str(tmp_path / "a")), FeatureStore(str(tmp_path / "b"))
    extract(a, encoder, textures, "test", CFG)
    extract(b, encoder, textures, "test", ExtractConfig(batch_size=8, chunk_batches=2, num_workers=2, progress=False))
    np.testing.assert_array_equal(_arrays(a, split="test")["pre_logits"], _arrays(b, split="test")["pre_logits"])


def test_partial_array_with_other_chunking_is_restarted(tmp_path, textures, encoder):
    store = FeatureStore(str(tmp_path / "s"))
    report = extract(store, encoder, textures, "test", CFG)
    key = report.keys["pre_logits"]
    # make it partial: drop the completion record and the last chunk's marker
    fp = report.fingerprints["pre_logits"]
    (tmp_path / "s" / keys.completion_key(key, fp)).unlink()
    (tmp_path / "s" / keys.chunk_marker_key(key, fp, 3)).unlink()
    other = ExtractConfig(batch_size=16, chunk_batches=2, progress=False)  # 32-row chunks now
    again = extract(store, encoder, textures, "test", other)
    assert again.status == "extracted" and again.forward_batches == 4
    assert store.status(key).chunk_rows == 32 and store.status(key).complete
