"""A storage a pickle declares must be in the file (issue 30, item 1).

torch allocates each storage a pickle declares before it reads a byte: a few-KB legacy file
(``_use_new_zipfile_serialization=False``) declaring 100 GB made torch allocate 100 GB. An
archive's storage is its ``data/<key>`` record; one declared larger was read, memory-mapped,
from the bytes after the record (the next records, the zip directory) as weights, with no
error. Each is refused, naming the file, the bytes declared and the bytes held. torch's
allocations are not seen by tracemalloc: the cost is measured in a fresh process, by its
traced peak and by the growth of its peak resident size (``ru_maxrss``), generously.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from pipeline.encoders.checkpoints.reading import read_checkpoint
from pipeline.errors import CheckpointError
from tests.helpers.cli import REPO, cli_env

HUGE = 25_000_000_000  # float32 elements: 100 GB
NUMEL_4 = b"K\x04"  # BININT1 4: the four elements the small tensor's storage declares


def _long1(n: int) -> bytes:
    return b"\x8a\x05" + n.to_bytes(5, "little")  # LONG1, five bytes


def _legacy(path: Path, numel: bytes) -> Path:
    """A legacy torch.save of four floats whose storage declares ``numel`` (opcodes) elements."""
    torch.save({"w": torch.arange(4.0)}, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    assert data.count(NUMEL_4 + b"N") == 1  # the storage's numel, then its view (None)
    path.write_bytes(data.replace(NUMEL_4 + b"N", numel + b"N"))
    return path


def _archive(path: Path, numel: bytes, shape: bytes = NUMEL_4) -> Path:
    """A torch.save archive of four floats whose storage declares ``numel`` and whose tensor ``shape``."""
    torch.save({"w": torch.arange(4.0)}, path)
    with zipfile.ZipFile(path) as src:
        members = [(info, src.read(info)) for info in src.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for info, data in members:
            if info.filename.endswith("data.pkl"):
                assert data.count(NUMEL_4 + b"t") == 1 and data.count(NUMEL_4 + b"\x85") == 1
                data = data.replace(NUMEL_4 + b"t", numel + b"t").replace(NUMEL_4 + b"\x85", shape + b"\x85")
            out.writestr(info, data)
    return path


_MEASURE = """
import json, resource, sys, tracemalloc
from pipeline.encoders.checkpoints.reading import read_checkpoint
from pipeline.errors import CheckpointError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
try:
    read_checkpoint(sys.argv[1])
    message = None
except CheckpointError as exc:
    message = str(exc)
peak = tracemalloc.get_traced_memory()[1]
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024  # KiB on Linux
print(json.dumps({"message": message, "peak": peak, "grown": grown}))
"""


def _cost_in_a_fresh_process(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, check=True,
                          env=cli_env(), cwd=REPO, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_legacy_file_declaring_100_gb_is_refused_before_torch_allocates(tmp_path):
    path = _legacy(tmp_path / "huge.pth", _long1(HUGE))
    size = path.stat().st_size
    assert size < 1000
    cost = _cost_in_a_fresh_process(path)
    message = cost["message"]
    assert message is not None, "read as if it were right"
    assert "'huge.pth'" in message and "100,000,000,000 bytes" in message and f"{size:,} bytes" in message, message
    assert cost["peak"] < 50 << 20 and cost["grown"] < 200 << 20, cost


@pytest.mark.parametrize("numel, shape", [(_long1(HUGE), NUMEL_4), (b"Kd", b"Kd")], ids=["100-gb", "past-record"])
def test_an_archive_storage_unlike_its_record_is_refused_cheaply(tmp_path, numel, shape):
    # past-record: 100 floats declared for a 16-byte record; memory-mapped, torch read the
    # 384 bytes after it (the next records, the zip directory) as the tensor's values
    path = _archive(tmp_path / "crafted.pth", numel, shape)
    cost = _cost_in_a_fresh_process(path)
    message = cost["message"]
    assert message is not None, "read as if it were right"
    assert "'crafted.pth'" in message and "storage '0'" in message and "holds 16 bytes" in message, message
    assert cost["peak"] < 50 << 20 and cost["grown"] < 200 << 20, cost


def test_a_storage_size_not_written_as_a_number_is_refused(tmp_path):
    path = _legacy(tmp_path / "odd.pth", b")")  # an empty tuple where the number of elements goes
    with pytest.raises(CheckpointError, match="'odd.pth'.*not written as a plain value"):
        read_checkpoint(path)


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "archive"])
def test_shared_views_and_every_element_size_still_read_exactly(tmp_path, legacy):
    base = torch.arange(10.0)
    saved = {"all": base, "part": base[2:5], "grid": base.view(2, 5), "half": torch.ones(3, dtype=torch.bfloat16),
             "long": torch.arange(2), "flag": torch.ones(1) > 0}
    if not legacy:  # an untyped storage (torch's legacy reader cannot read those back)
        saved["f8"] = torch.zeros(3, dtype=torch.float8_e4m3fn)
    path = tmp_path / "views.pth"
    torch.save(saved, path, _use_new_zipfile_serialization=not legacy)
    got = read_checkpoint(path)
    assert got.keys() == saved.keys()
    for name, tensor in saved.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name].float(), tensor.float()), name
    assert got["part"].untyped_storage().data_ptr() == got["all"].untyped_storage().data_ptr()  # still shared


def test_a_legacy_file_torch_cannot_read_back_is_named_not_a_traceback(tmp_path):
    # torch.save writes a float8 tensor's untyped storage in the legacy format, and its own
    # legacy reader fails on it (an AttributeError, which escaped as a traceback)
    path = tmp_path / "f8.pth"
    torch.save({"w": torch.zeros(3, dtype=torch.float8_e4m3fn)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="Cannot read checkpoint 'f8.pth': .*UntypedStorage"):
        read_checkpoint(path)
