"""Hostile and broken checkpoints cost a bounded amount and are refused by name (issue 30).

Each case of the issue: a few-KB file whose pickle is a self-referencing dict, one whose
``epoch`` is a list shared into 8 million strings, a 300 MB torn ``.pth.tar`` (a sparse file:
no disk used), and the rerun that must not read an unchanged file that failed. Costs are
Python memory at its peak and CPU seconds (tests/helpers/cost.py), with bounds far above
what each costs here and far below what it cost before (gigabytes, minutes). The budgets
are listed in tests/security/README.md.
"""

from __future__ import annotations

import io
import lzma
import os
import pickle
import tarfile
from pathlib import Path

import pytest
import torch

from jobs.config import load_config
from jobs.config.checkpoint_folders import scan_checkpoints
from jobs.run.failures import checkpoint_failure
from pipeline.analysis.series.steps import checkpoint_step
from pipeline.encoders.checkpoints import pickle_budget
from pipeline.encoders.checkpoints.reading import read_checkpoint
from pipeline.errors import CheckpointError, UnsafeCheckpointError
from tests.helpers.configs import tiny_config
from tests.helpers.cost import MB, measured

CPU_S = 5.0  # generous: each case takes milliseconds here, and took 28 s to minutes before
PEAK = 16 * MB  # beyond the tensors (which are a few bytes here): the cases cost well under 1 MB


def _self_referencing(path: Path, keys: int = 20) -> Path:
    d: dict = {}
    d.update({f"k{i}": d for i in range(keys)})
    torch.save({"state_dict": {"w": torch.zeros(2)}, "meta": d}, path)
    return path


def _huge_epoch(path: Path, n: int = 200) -> Path:
    torch.save({"state_dict": {"w": torch.zeros(2)}, "epoch": [[["A" * 100] * n] * n] * n}, path)
    return path


def _sparse(path: Path, size: int = 300 * MB) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # `truncate -s 300M`: a hole, no block written
    return path


@pytest.mark.parametrize("keys", [20, 80])
def test_a_self_referencing_dict_is_refused_at_once(tmp_path, keys):
    path = _self_referencing(tmp_path / "selfref.pth", keys)
    assert path.stat().st_size < 4000
    with measured() as cost, pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert "'selfref.pth'" in str(info.value) and "holds itself" in str(info.value)
    assert cost.cpu < CPU_S and cost.peak < PEAK, cost


def test_a_shared_nested_epoch_is_refused_by_its_budget_and_quoted_short(tmp_path):
    path = _huge_epoch(tmp_path / "epoch.pth")
    assert path.stat().st_size < 4000
    with measured() as cost, pytest.raises(CheckpointError) as info:
        checkpoint_step(path)  # how a scan reads a series' step
    message = str(info.value)
    assert "'epoch.pth'" in message and f"at most {pickle_budget.MAX_VALUES:,}" in message
    assert "values counted as often as they are referenced" in message and len(message) < 300
    assert cost.cpu < CPU_S and cost.peak < PEAK, cost
    # within the budget (40,000 strings), the step's message quotes the value cut short
    path = _huge_epoch(tmp_path / "epoch_small.pth", 20)
    with measured() as cost, pytest.raises(CheckpointError, match="must be a whole number") as info:
        checkpoint_step(path)
    assert "'epoch_small.pth'" in str(info.value) and len(str(info.value)) < 300
    assert cost.peak < PEAK, cost


@pytest.mark.parametrize("header", ["zeros", "tar"])
def test_a_300_mb_torn_tar_is_told_from_its_first_block(tmp_path, header):
    path = _sparse(tmp_path / "torn.pth.tar")
    if header == "tar":  # a real tar header, then nothing: PyTorch's legacy tar format, cut short
        block = io.BytesIO()
        with tarfile.open(fileobj=block, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(tarfile.TarInfo("sys_info"), io.BytesIO(b""))
        with open(path, "r+b") as f:
            f.write(block.getvalue()[:512])
    with measured() as cost, pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    message = str(info.value)
    assert "'torn.pth.tar'" in message
    if header == "tar":
        assert isinstance(info.value, UnsafeCheckpointError) and "legacy tar format" in message
    else:
        assert "is not a checkpoint" in message
    assert cost.cpu < CPU_S and cost.peak < PEAK, cost


def test_a_compressed_file_is_named_as_such_without_decompressing_it(tmp_path):
    inner = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, inner)
    path = tmp_path / "model.pth.tar"
    path.write_bytes(lzma.compress(inner.getvalue()))
    with pytest.raises(CheckpointError, match=r"'model.pth.tar' is a xz-compressed file, not a checkpoint"):
        read_checkpoint(path)


def test_an_unchanged_failed_file_is_not_read_again_on_a_rerun(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    torn = _sparse(folder / "torn.pth.tar")
    raw = tiny_config(tmp_path)
    raw["checkpoints"] = [{"path": str(folder), "arch": "resnet18", "input_size": 32, "settle_seconds": 0,
                           "pattern": "*"}]
    cfg = load_config(raw)
    with measured() as first:
        [taken] = scan_checkpoints(cfg).taken  # a first run offers it; its own check refuses it, named
    assert str(torn) in first.opened  # control: the scan reads a file it has not seen fail
    assert first.cpu < CPU_S and first.peak < PEAK, first
    st = torn.stat()
    record = checkpoint_failure(str(torn), st.st_size, st.st_mtime_ns, taken.encoder.name, "resnet18",
                                "not a checkpoint", settings=taken.settings)
    with measured() as rerun:
        scan = scan_checkpoints(cfg, {str(torn): record})
    assert scan.skipped == [record] and not scan.taken
    assert str(torn) not in rerun.opened, rerun.opened  # a stat, and nothing read
    os.utime(torn, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # changed: taken (and read) again
    assert [f.path for f in scan_checkpoints(cfg, {str(torn): record}).taken] == [str(torn)]


def test_the_budget_lets_a_real_training_record_through(tmp_path):
    """A control: a whole training record (weights, SGD momentum state, epoch, args) is read
    unchanged, its pickle replayed in well under the bounds."""
    import argparse

    import timm

    model = timm.create_model("resnet18", num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.zeros(2, 3, 32, 32)).sum().backward()
    opt.step()
    path = tmp_path / "checkpoint_0009.pth.tar"
    torch.save({"state_dict": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 10,
                "args": argparse.Namespace(arch="resnet18", lr=0.1), "classes": [f"c{i}" for i in range(1000)]},
               path)
    with measured() as cost:
        pickle_budget.check_pickle_budget(path, "torch-zip")
    assert cost.cpu < CPU_S and cost.peak < PEAK, cost
    raw = read_checkpoint(path)
    assert raw["epoch"] == 10 and len(raw["classes"]) == 1000
    assert torch.equal(raw["state_dict"]["fc.weight"], model.state_dict()["fc.weight"])


@pytest.mark.parametrize("case", ["depth", "string", "ops", "shared", "memo-cycle", "legacy"])
def test_each_budget_is_refused_by_name(tmp_path, case, monkeypatch):
    """Every budget of pipeline.encoders.checkpoints.pickle_budget, passed by a small pickle
    (the larger budgets lowered for the test, the same code counting)."""
    path = tmp_path / "hostile.pth"
    if case == "depth":
        deep: list = []
        for _ in range(pickle_budget.MAX_DEPTH + 5):
            deep = [deep]
        torch.save({"w": torch.zeros(1), "deep": deep}, path)
        expected = "levels deep"
    elif case == "string":
        monkeypatch.setattr(pickle_budget, "MAX_STRING", 1000)
        torch.save({"w": torch.zeros(1), "note": "x" * 2000}, path)
        expected = "a string of 2,000 bytes (at most 1,000)"
    elif case == "ops":
        monkeypatch.setattr(pickle_budget, "MAX_OPS", 500)
        torch.save({"w": torch.zeros(1), "ints": list(range(1000))}, path)
        expected = "more than 500 pickle operations"
    elif case == "shared":
        monkeypatch.setattr(pickle_budget, "MAX_SHARED", 100)
        s = "shared"
        torch.save({"w": torch.zeros(1), "s": [s] * 500}, path)
        expected = "more than 100 shared references"
    elif case == "memo-cycle":
        x: list = []
        x.append(x)
        torch.save({"w": torch.zeros(1), "x": x}, path)
        expected = "holds itself"
    else:  # the old torch.save format, a pickle stream, same budgets
        d: dict = {}
        d["self"] = d
        torch.save({"w": torch.zeros(1), "d": d}, path, _use_new_zipfile_serialization=False)
        expected = "holds itself"
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert "'hostile.pth'" in str(info.value) and expected in str(info.value), str(info.value)


def test_a_torn_pickle_is_damaged_not_unsafe(tmp_path):
    path = tmp_path / "torn.pt"
    torch.save({"w": torch.zeros(4), "epoch": 3}, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert not isinstance(info.value, UnsafeCheckpointError) and "'torn.pt'" in str(info.value)
    path.write_bytes(pickle.dumps(1, protocol=2)[:-1] + b"\xff")  # an opcode that does not exist
    with pytest.raises(CheckpointError, match="invalid load key"):
        read_checkpoint(path)


@pytest.mark.parametrize("case", ["selfref", "epoch"])
def test_extract_refuses_the_issue_files_by_name_and_writes_nothing(tmp_path, case):
    """The issue's entry point: ``extract`` took 28 s and 1 GB on the self-referencing dict."""
    from jobs.extraction.extract import ExtractConfig, extract
    from pipeline.datasets import make_dataset
    from pipeline.encoders import EncoderSpec
    from storage_schema import FeatureStore
    from tests.helpers.tally import tree

    path = (_self_referencing if case == "selfref" else _huge_epoch)(tmp_path / f"{case}.pth")
    store_dir = tmp_path / "store"
    store = FeatureStore(str(store_dir))
    before = tree(store_dir)
    spec = EncoderSpec(name="x", arch="resnet18", weights=str(path), input_size=32)
    dataset = make_dataset("textures", n_per_class={"train": 4, "test": 4})
    with measured() as cost, pytest.raises(CheckpointError) as info:
        extract(store, spec, dataset, "test", ExtractConfig(batch_size=4, progress=False))
    assert f"'{case}.pth'" in str(info.value) and "Refusing checkpoint" in str(info.value)
    assert cost.cpu < CPU_S, cost
    assert tree(store_dir) == before
