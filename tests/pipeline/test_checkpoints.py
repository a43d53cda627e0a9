"""Checkpoint reading, fingerprints and strict encoder loading from local files."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from pipeline.encoders.checkpoints.names import CHECKPOINT_EXTENSIONS
from pipeline.encoders.checkpoints.reading import load_state_dict, weights_fingerprint
from pipeline.encoders import EncoderSpec, check_checkpoint_fits, load_encoder
from pipeline.errors import CheckpointError, UnsafeCheckpointError

ARCH = "mobilenetv3_small_050"  # ~0.6 M backbone parameters: fast to save and load
SIZE = 32


def _model(num_classes: int = 0, seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(ARCH, pretrained=False, num_classes=num_classes).eval()


@pytest.fixture(scope="module")
def source() -> torch.nn.Module:
    """A backbone whose weights differ from the encoder's own seeded init."""
    model = _model(seed=123)
    with torch.no_grad():  # make BN statistics non-trivial so a missed buffer would show
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.uniform_(-0.1, 0.1)
    return model


@pytest.fixture(scope="module")
def batch() -> torch.Tensor:
    return torch.randn(3, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def files(source: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One checkpoint of the same weights in each supported layout."""
    root = tmp_path_factory.mktemp("ckpts")
    sd = {k: v.clone() for k, v in source.state_dict().items()}
    out = {
        "safetensors": root / "plain.safetensors",
        "pth": root / "plain.pth",
        "pt_state_dict": root / "nested_sd.pt",
        "bin_model": root / "nested_model.bin",
        "module_prefix": root / "ddp.pth",
    }
    save_file(sd, out["safetensors"])
    torch.save(sd, out["pth"])
    torch.save({"state_dict": sd, "epoch": 7}, out["pt_state_dict"])
    torch.save({"model": sd, "optimizer": {"lr": 0.1}, "epoch": 7}, out["bin_model"])
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, out["module_prefix"])
    return out


def test_every_layout_reads_the_same_tensors(source: torch.nn.Module, files: dict[str, Path]) -> None:
    expected = source.state_dict()
    for path in files.values():
        sd = load_state_dict(path)
        assert sorted(sd) == sorted(expected), path.name
        for k, v in expected.items():
            assert torch.equal(sd[k], v), (path.name, k)


def test_every_layout_gives_identical_features(
    source: torch.nn.Module, files: dict[str, Path], batch: torch.Tensor
) -> None:
    with torch.no_grad():
        reference = source.forward_head(source.forward_features(batch), pre_logits=True).numpy()
    fingerprints = set()
    for path in files.values():
        enc = load_encoder(EncoderSpec("ckpt", ARCH, weights=str(path), input_size=SIZE), device="cpu")
        out = enc.forward(batch)["pre_logits"]
        np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-6, err_msg=path.name)
        fingerprints.add(enc.weights_fingerprint)
    assert len(fingerprints) == 1
    assert fingerprints == {weights_fingerprint(source)}


def test_fingerprint_ignores_file_name_and_mtime(files: dict[str, Path], tmp_path: Path) -> None:
    original = files["safetensors"]
    copy = tmp_path / "renamed_copy.safetensors"
    shutil.copyfile(original, copy)
    os.utime(copy, (1_000_000, 1_000_000))
    assert weights_fingerprint(load_state_dict(copy)) == weights_fingerprint(load_state_dict(original))


def test_fingerprint_changes_with_one_element(source: torch.nn.Module) -> None:
    sd = {k: v.clone() for k, v in source.state_dict().items()}
    before = weights_fingerprint(sd)
    name = sorted(k for k in sd if sd[k].is_floating_point())[5]
    sd[name].view(-1)[0] += 1e-3
    assert weights_fingerprint(sd) != before
    # Same bytes under another dtype, shape or name are different weights too.
    t = torch.arange(6, dtype=torch.float32)
    base = weights_fingerprint({"a": t})
    assert weights_fingerprint({"a": t.reshape(2, 3)}) != base
    assert weights_fingerprint({"b": t}) != base
    assert weights_fingerprint({"a": t.view(torch.int32)}) != base
    assert weights_fingerprint({"a": t.clone()}) == base
    assert weights_fingerprint({"a": t.to(torch.bfloat16)}) != base  # bfloat16 is hashable


def test_fingerprint_of_model_equals_its_state_dict(source: torch.nn.Module) -> None:
    assert weights_fingerprint(source) == weights_fingerprint(source.state_dict())


def test_missing_and_unexpected_keys_are_listed(source: torch.nn.Module, tmp_path: Path) -> None:
    sd = dict(source.state_dict())
    dropped = "conv_stem.weight"
    del sd[dropped]
    sd["blocks.9.0.conv.weight"] = torch.zeros(3)  # inside the backbone's own `blocks`: a deeper model's
    path = tmp_path / "bad_keys.safetensors"
    save_file(sd, path)
    with pytest.raises(CheckpointError) as info:
        load_encoder(EncoderSpec("bad", ARCH, weights=str(path)), device="cpu")
    msg = str(info.value)
    assert dropped in msg and "blocks.9.0.conv.weight" in msg
    assert "1 missing keys" in msg and "1 unexpected keys" in msg


def test_tensors_of_parts_the_backbone_lacks_are_dropped_and_recorded(source: torch.nn.Module,
                                                                     tmp_path: Path, batch: torch.Tensor) -> None:
    sd = dict(source.state_dict())
    sd.update({"decoder.0.weight": torch.zeros(3), "mask_token": torch.zeros(1, 4), "classifier.weight": torch.zeros(5, 8)})
    path = tmp_path / "mae_like.safetensors"
    save_file(sd, path)
    enc = load_encoder(EncoderSpec("d", ARCH, weights=str(path), input_size=SIZE), device="cpu")
    assert enc.weights_fingerprint == weights_fingerprint(source)
    dropped = enc.provenance()["weights"]["dropped"]
    assert dropped["count"] == 3 and dropped["groups"] == {"classifier.": 1, "decoder.": 1, "mask_token": 1}


def test_shape_mismatch_is_listed(source: torch.nn.Module, tmp_path: Path) -> None:
    sd = dict(source.state_dict())
    sd["conv_stem.weight"] = torch.zeros(1, 3, 3, 3)
    path = tmp_path / "bad_shape.safetensors"
    save_file(sd, path)
    with pytest.raises(CheckpointError, match=r"conv_stem\.weight \(checkpoint \(1, 3, 3, 3\)"):
        load_encoder(EncoderSpec("bad", ARCH, weights=str(path)), device="cpu")


def test_long_key_lists_are_truncated_with_counts(tmp_path: Path) -> None:
    path = tmp_path / "empty_ish.safetensors"
    save_file({"unrelated.weight": torch.zeros(1)}, path)
    with pytest.raises(CheckpointError, match=r"\d+ missing keys: .*\(\d+ more\)"):
        load_encoder(EncoderSpec("bad", ARCH, weights=str(path)), device="cpu")


def test_usual_prefixes_are_found_and_an_unusual_one_is_named_with_a_line_that_works(
        source: torch.nn.Module, tmp_path: Path) -> None:
    path = tmp_path / "detector.pth"
    torch.save({f"module.backbone.{k}": v for k, v in source.state_dict().items()}, path)
    enc = load_encoder(EncoderSpec("bb", ARCH, weights=str(path)), device="cpu")
    assert enc.weights_fingerprint == weights_fingerprint(source)
    assert enc.provenance()["weights"]["prefix_stripped"] == "module.backbone."
    odd = tmp_path / "odd.pth"
    torch.save({f"module.trunk_v2.{k}": v for k, v in source.state_dict().items()}, odd)
    with pytest.raises(CheckpointError) as info:
        check_checkpoint_fits(EncoderSpec("bb", ARCH, weights=str(odd)))
    line = re.search(r"set `strip_prefixes: \[(.*?)\]`", str(info.value))
    assert line and line.group(1) == "module.trunk_v2."
    # the override adds to the usual parts: `trunk_v2.` alone composes with `module.`
    spec = EncoderSpec("bb", ARCH, weights=str(odd), strip_prefixes=("trunk_v2.",))
    check_checkpoint_fits(spec)
    assert load_encoder(spec, device="cpu").weights_fingerprint == weights_fingerprint(source)


def test_the_line_offered_for_several_fits_names_the_usual_choice_whatever_the_file_order(
        source: torch.nn.Module) -> None:
    from pipeline.encoders.checkpoints.fitting import fit_checkpoint

    backbone = {f"backbone.{k}": v for k, v in source.state_dict().items()}
    model = _model()
    # DINO's main_dino.py saves the student first; the teacher is the network it evaluates
    dino = {"student": dict(backbone), "teacher": dict(backbone), "epoch": 100}
    timm_train = {"state_dict_ema": dict(source.state_dict()), "state_dict": dict(source.state_dict())}
    for raw, key in ((dino, "teacher"), (timm_train, "state_dict")):
        with pytest.raises(CheckpointError) as info:
            fit_checkpoint(raw, model, "ck.pth", ARCH)
        assert f"`checkpoint_key: {key}` (repeval extract: --checkpoint-key {key})" in str(info.value)
        assert fit_checkpoint(raw, model, "ck.pth", ARCH, checkpoint_key=key).location == key


def test_a_file_of_another_architecture_says_to_check_arch() -> None:
    from pipeline.encoders.building import build_on_meta
    from pipeline.encoders.checkpoints.fitting import fit_checkpoint

    def meta(arch: str) -> torch.nn.Module:
        return build_on_meta(EncoderSpec("m", arch, input_size=SIZE))

    vit = {"model": meta("vit_tiny_patch16_224").state_dict(), "epoch": 3}  # no name in common with a ResNet
    with pytest.raises(CheckpointError) as info:
        fit_checkpoint(vit, meta("resnet18"), "vit.pth", "resnet18")
    n = len(vit["model"])
    assert f"; none of its {n} tensors has a name resnet18 has: a file of another architecture? check `arch:`" in str(
        info.value)
    deeper = meta("resnet18").state_dict()  # the names of resnet50's stages, other shapes and fewer blocks
    with pytest.raises(CheckpointError) as info:
        fit_checkpoint(deeper, meta("resnet50"), "r18.pth", "resnet50")
    msg = str(info.value)
    assert "missing keys" in msg and "shape mismatches" in msg
    assert msg.endswith("; its tensors are of another architecture: check `arch:`")


def test_prefix_is_stripped_only_when_every_key_has_it(tmp_path: Path) -> None:
    path = tmp_path / "mixed.safetensors"
    save_file({"module.a": torch.zeros(1), "b": torch.ones(1)}, path)
    assert sorted(load_state_dict(path)) == ["b", "module.a"]


@pytest.mark.parametrize("num_classes", [0, 5, 1000])
def test_checkpoint_with_any_head_loads(num_classes: int, tmp_path: Path, batch: torch.Tensor) -> None:
    model = _model(num_classes=num_classes, seed=9)
    path = tmp_path / f"head{num_classes}.safetensors"
    save_file(model.state_dict(), path)
    enc = load_encoder(EncoderSpec("h", ARCH, weights=str(path), input_size=SIZE), device="cpu")
    with torch.no_grad():
        expected = model.forward_head(model.forward_features(batch), pre_logits=True).numpy()
    np.testing.assert_allclose(enc.forward(batch)["pre_logits"], expected, rtol=1e-5, atol=1e-6)
    # The head never reaches the encoder, so its size does not change the fingerprint.
    backbone = {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}
    assert enc.weights_fingerprint == weights_fingerprint(backbone)


class _Payload:
    """Pickles to a call of os.system: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("writer", ["torch_save", "raw_pickle"])
def test_pickle_with_code_is_refused(writer: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / ("evil.pth" if writer == "torch_save" else "evil.pt")
    obj = {"state_dict": {"w": torch.zeros(1)}, "hook": _Payload(marker)}
    if writer == "torch_save":
        torch.save(obj, path)
    else:
        with open(path, "wb") as fh:
            pickle.dump(obj, fh)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_state_dict(path)
    assert not marker.exists()
    msg = str(info.value)
    assert path.name in msg and "safetensors" in msg and "state dict" in msg
    with pytest.raises(UnsafeCheckpointError):
        load_encoder(EncoderSpec("evil", ARCH, weights=str(path)), device="cpu")
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("archive", [True, False], ids=["archive", "legacy"])
def test_a_state_dict_saved_with_pickle_protocol_4_is_named_as_such_not_as_code(archive: bool, tmp_path: Path) -> None:
    """torch's safe loader lacks protocol 4's opcodes: the file names no code, and the message says what to do."""
    marker = tmp_path / "pwned"
    plain, evil = tmp_path / "plain.pth", tmp_path / "evil.pth"
    torch.save({"w": torch.zeros(3), "epoch": 7}, plain, pickle_protocol=4, _use_new_zipfile_serialization=archive)
    torch.save({"w": torch.zeros(3), "hook": _Payload(marker)}, evil, pickle_protocol=4,
               _use_new_zipfile_serialization=archive)
    with pytest.raises(CheckpointError, match="pickle protocol 4 or 5") as info:
        load_state_dict(plain)
    assert not isinstance(info.value, UnsafeCheckpointError)
    assert "names no code" in str(info.value) and "torch.save's default protocol" in str(info.value)
    with pytest.raises(UnsafeCheckpointError, match=r"it needs (os|posix)\.system"):
        load_state_dict(evil)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_protocol_4_training_record_names_no_code_but_an_unknown_class_does(tmp_path: Path) -> None:
    """What a training script saves besides weights (its args, a numpy metric, a dtype) names no
    code; a class of the script's own does, and the message names it."""
    import argparse
    import collections

    from pipeline.encoders.checkpoints.named_globals import globals_naming_code
    from pipeline.encoders.checkpoints.storage_sizes import Global

    record = tmp_path / "record.pth"
    torch.save({"model": collections.OrderedDict(w=torch.zeros(2, dtype=torch.float16)),
                "args": argparse.Namespace(lr=0.1), "acc": np.float64(0.5), "size": torch.Size([2])},
               record, pickle_protocol=4)
    with pytest.raises(CheckpointError, match="names no code") as info:
        load_state_dict(record)
    assert not isinstance(info.value, UnsafeCheckpointError)
    named = frozenset({Global("torch._utils", "_rebuild_tensor_v2"), Global("torch", "HalfStorage"),
                       Global("torch", "bfloat16"), Global("train", "Trainer"), Global("torch", "load")})
    assert globals_naming_code(named) == ["torch.load", "train.Trainer"]
    assert globals_naming_code(None) is None


def test_torchs_protocol_advice_stays_off_the_terminal(tmp_path: Path) -> None:
    """A protocol 4 file prints repeval's one message, not torch's "please file an issue" warning
    before it (in a process of its own: pytest resets warning filters around each test)."""
    import subprocess
    import sys

    from tests.helpers.cli import REPO, cli_env

    script = ("import sys, torch\n"
              "from pipeline.encoders.checkpoints.reading import load_state_dict\n"
              "torch.save({'w': torch.zeros(2)}, sys.argv[1], pickle_protocol=4)\n"
              "for _ in range(2):\n"
              "    try:\n"
              "        load_state_dict(sys.argv[1])\n"
              "    except Exception as exc:\n"
              "        print(type(exc).__name__)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "p4.pth")], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=300, check=True)
    assert done.stdout.split() == ["CheckpointError", "CheckpointError"]
    assert "Detected pickle protocol" not in done.stderr, done.stderr


def test_payload_is_live_so_the_refusal_test_means_something(tmp_path: Path) -> None:
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(marker)))  # an ordinary unpickler runs it
    assert marker.exists()


def test_unknown_extension_lists_valid_ones(tmp_path: Path) -> None:
    path = tmp_path / "weights.npz"
    path.write_bytes(b"x")
    with pytest.raises(CheckpointError) as info:
        load_state_dict(path)
    for ext in CHECKPOINT_EXTENSIONS:
        assert ext in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_state_dict(tmp_path / "nope.safetensors")
    with pytest.raises(CheckpointError, match="nope.pth"):
        load_encoder(EncoderSpec("m", ARCH, weights=str(tmp_path / "nope.pth")), device="cpu")


def test_corrupt_files_and_non_tensor_entries(tmp_path: Path) -> None:
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 5)
    with pytest.raises(CheckpointError, match="broken.safetensors"):
        load_state_dict(broken)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CheckpointError, match="truncated.pth"):
        load_state_dict(truncated)
    odd = tmp_path / "odd.pth"
    torch.save({"note": "hello", "epoch": 3}, odd)
    with pytest.raises(CheckpointError, match="holds no tensors"):
        load_state_dict(odd)
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"garbage")  # 7 bytes: not a checkpoint at all, not an unsafe pickle
    with pytest.raises(CheckpointError, match=r"'junk.pth' is not a checkpoint: its 7 bytes") as info:
        load_state_dict(junk)
    assert not isinstance(info.value, UnsafeCheckpointError)


def test_torch_archive_cut_short_says_truncated(source: torch.nn.Module, tmp_path: Path) -> None:
    whole = tmp_path / "whole.pth"
    torch.save({"state_dict": source.state_dict(), "epoch": 3}, whole)
    cut = tmp_path / "cut.pth"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])  # a copy or a save interrupted
    with pytest.raises(CheckpointError) as info:
        load_state_dict(cut)
    msg = str(info.value)
    assert msg.startswith(f"'cut.pth' is a truncated PyTorch archive: its {cut.stat().st_size} bytes end before")
    assert "miniz" not in msg and "\n" not in msg
    assert load_state_dict(whole, strip_prefixes=()).keys() == source.state_dict().keys()



def test_safetensors_cut_inside_its_header_says_truncated(source: torch.nn.Module, tmp_path: Path) -> None:
    whole = tmp_path / "whole.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(whole))
    header = int.from_bytes(whole.read_bytes()[:8], "little")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(whole.read_bytes()[: header // 2])  # shorter than the header it starts with
    with pytest.raises(CheckpointError, match=r"'cut.safetensors' is truncated: its header describes"):
        load_state_dict(cut)

# --- fitting a checkpoint to an architecture without loading it -----------------------------

def test_fitting_checkpoints_pass_in_every_layout(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    def no_tensor_reads(*args, **kwargs):
        raise AssertionError("check_checkpoint_fits read the tensors")

    monkeypatch.setattr(safetensors.torch, "load_file", no_tensor_reads)  # only the header may be read
    for path in files.values():
        check_checkpoint_fits(EncoderSpec("ok", ARCH, weights=str(path), input_size=SIZE))


def test_checkpoint_with_a_head_fits(tmp_path: Path) -> None:
    path = tmp_path / "head.safetensors"
    save_file(_model(num_classes=1000).state_dict(), path)
    check_checkpoint_fits(EncoderSpec("h", ARCH, weights=str(path)))


def test_checkpoint_of_another_width_is_refused_in_one_line_naming_the_fit(tmp_path: Path) -> None:
    torch.manual_seed(0)
    wider = timm.create_model("mobilenetv3_small_075", num_classes=0)
    path = tmp_path / "ckpt.safetensors"
    save_file(wider.state_dict(), path)
    with pytest.raises(CheckpointError) as info:
        check_checkpoint_fits(EncoderSpec("m", ARCH, weights=str(path)))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"'ckpt.safetensors' does not fit {ARCH}: ")
    assert re.search(r": \d+ shape mismatches: blocks\.0\.0\.bn2\.bias \(checkpoint \(16,\), model \(8,\)\)", msg)
    assert "looks like mobilenetv3_small_075" in msg
    with pytest.raises(CheckpointError, match=f"does not fit {ARCH}"):  # loading agrees
        load_encoder(EncoderSpec("m", ARCH, weights=str(path)), device="cpu")


def test_pth_of_a_deeper_resnet_lists_missing_keys(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "r18.pth"
    torch.save({"state_dict": timm.create_model("resnet18", num_classes=10).state_dict(), "epoch": 3}, path)
    with pytest.raises(CheckpointError) as info:
        check_checkpoint_fits(EncoderSpec("r", "resnet34", weights=str(path)))
    msg = str(info.value)
    assert msg.startswith("'r18.pth' (under 'state_dict') does not fit resnet34: ") and "missing keys: layer1.2." in msg
    assert "looks like resnet18" in msg and "\n" not in msg


def test_checkpoint_fit_check_refuses_bad_files_and_passes_other_weights(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        check_checkpoint_fits(EncoderSpec("m", ARCH, weights=str(tmp_path / "nope.safetensors")))
    with pytest.raises(CheckpointError, match="extension"):
        check_checkpoint_fits(EncoderSpec("m", ARCH, weights="weights.npz"))
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 5)
    with pytest.raises(CheckpointError, match="broken.safetensors"):
        check_checkpoint_fits(EncoderSpec("m", ARCH, weights=str(broken)))
    check_checkpoint_fits(EncoderSpec("m", ARCH))  # random init: nothing to check
