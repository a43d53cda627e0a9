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
