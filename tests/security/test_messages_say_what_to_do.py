"""No message points at a way of loading that could run code (issue 30, item 4).

torch's refusals suggest re-running ``torch.load`` with ``weights_only=False`` (or
allowlisting the global it refused); repeval passes on what went wrong, never that advice,
and says what to do in its own terms: save the weights again as a state dict or safetensors.
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import zipfile

import pytest
import torch

from pipeline.encoders.checkpoints.reading import load_state_dict, read_checkpoint
from pipeline.errors import CheckpointError, UnsafeCheckpointError

UNSAFE_ADVICE = ("weights_only", "weights only", "add_safe_globals", "safe_globals", "pickle_module", "trust")


class RunsCode:
    """Unpickled by an unrestricted reader, this would call os.system."""

    def __reduce__(self):
        return (os.system, ("true",))


def _legacy_tar(path):
    """PyTorch's oldest torch.save format: a tar of sys_info, pickle, storages and tensors."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, obj in [("sys_info", {"protocol_version": 1001}), ("pickle", {"w": 1}), ("storages", 0),
                          ("tensors", 0)]:
            data = pickle.dumps(obj, protocol=2)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _write(path, case):
    if case == "code-archive":
        torch.save({"w": torch.zeros(2), "hook": RunsCode()}, path)
    elif case == "code-legacy":
        torch.save({"w": torch.zeros(2), "hook": RunsCode()}, path, _use_new_zipfile_serialization=False)
    elif case == "legacy-tar":
        _legacy_tar(path)
    elif case == "archive-without-pickle":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/version", "3\n")
    elif case == "torn-archive":
        buf = io.BytesIO()
        torch.save({"w": torch.zeros(64)}, buf)
        path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    else:  # a torn legacy file
        buf = io.BytesIO()
        torch.save({"w": torch.zeros(64)}, buf, _use_new_zipfile_serialization=False)
        path.write_bytes(buf.getvalue()[:40])


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("case", ["code-archive", "code-legacy", "legacy-tar", "archive-without-pickle",
                                  "torn-archive", "torn-legacy"])
def test_no_refusal_suggests_an_unsafe_way_to_load(tmp_path, case):
    path = tmp_path / ("model.pth.tar" if case == "legacy-tar" else "model.pth")
    _write(path, case)
    for read in (read_checkpoint, load_state_dict):
        with pytest.raises(CheckpointError) as info:
            read(path)
        message = str(info.value)
        assert "'model.pth" in message, message
        assert not [w for w in UNSAFE_ADVICE if w in message.lower()], message
    if isinstance(info.value, UnsafeCheckpointError):  # what to do instead, in repeval's terms
        assert "torch.save(model.state_dict(), 'weights.pth')" in message and "safetensors" in message
    if case.startswith("code-"):
        assert "posix.system" in message  # what it needs, as torch found it
    assert case not in ("code-archive", "code-legacy", "legacy-tar") or isinstance(info.value, UnsafeCheckpointError)


MB = 1 << 20


def _long_key_cases(state: dict) -> dict:
    """What a checkpoint could hold under 1 MB keys (the budget lets a string be 16 MiB), by the message it meets."""
    long, dotted = "k" * MB, "module." * (MB // 7)  # a wrapper's prefix, repeated: each dot is a place to cut
    one = next(iter(state.values()))
    return {
        "unexpected-key": {**state, "layer1." + long: one},  # under a part the model has: listed as unexpected
        "dotted-key": {dotted + "x": one, "y." + dotted: one},
        "under-a-long-key": {long: {"bogus": one}, "other": {"bogus": one}},
        "under-a-long-prefix": {"state_dict": {f"{long}.{k}": v for k, v in state.items()}},
        "several-fit": {long: dict(state), long + "2": dict(state)},
    }


@pytest.mark.parametrize("case", ["unexpected-key", "dotted-key", "under-a-long-key", "under-a-long-prefix",
                                  "several-fit", "checkpoint-key", "state-dict"])
def test_a_1_mb_key_is_quoted_short(tmp_path, case):
    from pipeline.encoders.building import build_on_meta
    from pipeline.encoders.checkpoints.fitting import fit_checkpoint
    from pipeline.encoders.spec import EncoderSpec

    model = build_on_meta(EncoderSpec("m", "resnet18", input_size=32))
    cases = _long_key_cases(model.state_dict())
    with pytest.raises(CheckpointError) as info:
        if case == "checkpoint-key":
            fit_checkpoint(cases["several-fit"], model, "long.pth", "resnet18", checkpoint_key="teacher")
        elif case == "state-dict":  # read from a file, without an architecture
            path = tmp_path / "long.pth"
            torch.save({"k" * MB: {"w": torch.zeros(1)}, "k" * MB + "2": {"w": torch.zeros(1)}}, path)
            load_state_dict(path)
        else:
            fit_checkpoint(cases[case], model, "long.pth", "resnet18")
    message = str(info.value)
    assert "'long.pth'" in message and len(message) < 1000, (len(message), message[:2000])
