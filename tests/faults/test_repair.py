"""Damaged chunks: `repeval verify` names them, `repeval repair` recomputes exactly them.

The array is extracted from a checkpoint file, so repair must find that file again by its
recorded path and check its weights fingerprint before it writes anything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from jobs.extraction.extract import extract
from jobs.extraction.repair import repair
from pipeline.encoders import EncoderSpec, load_encoder
from storage_schema import FeatureStore
from tests.helpers.children import SPEC, SPLIT, extract_config, textures
from tests.helpers.cli import REPO, cli_env

GROUP = "features/r18/textures/train"
DAMAGE = {f"{GROUP}/pre_logits": 2, f"{GROUP}/block3": 5, "datasets/textures/train/labels": 0}


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """128 images in 8 chunks of 2 batches, from a checkpoint; every chunk file's bytes."""
    tmp = tmp_path_factory.mktemp("repair")
    ckpt = tmp / "r18.safetensors"
    save_file({k: v.contiguous() for k, v in load_encoder(SPEC, device="cpu").model.state_dict().items()}, str(ckpt))
    spec = EncoderSpec(name="r18", arch="resnet18", weights=str(ckpt), layers=SPEC.layers, input_size=32)
    url = tmp / "store"
    extract(FeatureStore(str(url)), spec, textures(), SPLIT, extract_config(chunk_batches=2, device="cpu"))
    return url, ckpt, _chunk_files(url)


def _chunk_path(key: str, chunk: int) -> str:
    return f"{key}/c/{chunk}" + ("" if key.endswith("/labels") else "/0")  # labels are 1-D


def _chunk_files(url: Path) -> dict[str, bytes]:
    return {str(p.relative_to(url)): p.read_bytes() for p in sorted(url.rglob("*"))
            if p.is_file() and "/c/" in str(p.relative_to(url))}


def _damaged_copy(original, tmp_path: Path, damage: dict[str, int]) -> Path:
    url = tmp_path / "store"
    shutil.copytree(original[0], url)
    for key, chunk in damage.items():
        path = url / _chunk_path(key, chunk)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte, as a failing disk would leave it
        path.write_bytes(bytes(data))
    return url


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=300)


@pytest.mark.slow
def test_verify_names_damaged_chunks_and_repair_recomputes_exactly_them(original, tmp_path):
    url = _damaged_copy(original, tmp_path, DAMAGE)
    untouched = {p: (url / p).stat().st_mtime_ns for p in original[2]
                 if p not in {_chunk_path(k, c) for k, c in DAMAGE.items()}}
    found = _cli("verify", "--store", str(url))
    assert found.returncode == 1
    for key, chunk in DAMAGE.items():
        assert f"damaged    {key}: chunk(s) [{chunk}] fail their checksum" in found.stdout
    fixed = _cli("repair", "--store", str(url), "--json")
    assert fixed.returncode == 0, fixed.stderr
    summary = json.loads(fixed.stdout.strip().splitlines()[-1])
    assert {r["key"]: r["chunks"] for r in summary["repaired"]} == {k: [c] for k, c in DAMAGE.items()}
    # two damaged feature chunks (one per layer): 2 chunks x 2 batches; labels need no forward pass
    assert summary["forward_batches"] == 4 and summary["images"] == 32 and not summary["failed"]
    assert _chunk_files(url) == original[2]  # every chunk file bitwise as first written
    assert all((url / p).stat().st_mtime_ns == t for p, t in untouched.items())  # and no other rewritten
    assert _cli("verify", "--store", str(url)).returncode == 0
    print(f"\nrepair: verify found {len(DAMAGE)} damaged chunks (2 feature, 1 labels); repair recomputed exactly "
          f"them with {summary['forward_batches']} forward batches ({summary['images']} of 128 images); "
          f"all {len(original[2])} chunk files bitwise equal to the original")


@pytest.mark.parametrize("checkpoint", ["gone", "other-weights", "moved"])
def test_repair_refuses_a_checkpoint_that_is_gone_or_changed(original, tmp_path, checkpoint):
    url = _damaged_copy(original, tmp_path, {f"{GROUP}/pre_logits": 1})
    ckpt, kept = original[1], tmp_path / "kept.safetensors"
    shutil.move(ckpt, kept)
    try:
        weights = None
        if checkpoint == "other-weights":  # same path, other tensors
            state = {k: v.clone() for k, v in load_encoder(SPEC, device="cpu").model.state_dict().items()}
            state["layer4.1.bn2.bias"] += 1.0
            save_file(state, str(ckpt))
        elif checkpoint == "moved":
            weights = str(kept)
        summary = repair(FeatureStore(str(url)), weights=weights)
    finally:
        shutil.move(kept, ckpt)
    store = FeatureStore(str(url), read_only=True)
    if checkpoint == "moved":  # the moved file holds the recorded weights: repaired
        assert summary.chunks == 1 and summary.forward_batches == 2 and not summary.failed
        assert _chunk_files(url) == original[2]
        return
    expected = {"gone": "does not exist", "other-weights": "now holds other weights"}[checkpoint]
    assert len(summary.failed) == 1 and expected in summary.failed[0] and str(ckpt) in summary.failed[0]
    assert summary.forward_batches == 0 and store.damaged_chunks(f"{GROUP}/pre_logits") == [1]
