"""Files from elsewhere never run code: pickles with a payload in every place repeval reads
files (checkpoints under any extension, precomputed features, the CLI), and names that
would leave the store.

Already covered elsewhere, not repeated here: a ``.pth``/``.pt`` pickle whose payload calls
os.system is refused by load_state_dict and load_encoder (tests/pipeline/test_checkpoints.py
::test_pickle_with_code_is_refused, with a control that the payload is live) and by extract
(tests/jobs/test_extract.py::test_bad_input_is_a_clear_error_and_writes_nothing
[pickle-code]); simple path-like names are refused by the key functions
(tests/storage_schema/test_store.py::test_bad_names_rejected_before_any_write); the CLI's
one-line exit-2 errors (tests/flows/test_cli.py::test_errors_are_one_line_and_exit_2).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.encoders.checkpoints.reading import load_state_dict
from pipeline.datasets import make_dataset
from pipeline.errors import CheckpointError, DatasetError, InvalidNameError, UnsafeCheckpointError
from storage_schema import FeatureStore
from tests.helpers.tally import tree


class WritesMarker:
    """Unpickling this runs Python code that creates ``marker``: what a malicious file does."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def test_control_the_payload_runs_under_a_plain_unpickler(tmp_path):
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(WritesMarker(marker)))
    assert marker.read_text() == "pwned"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("name, writer", [
    ("model.bin", "torch"),  # the third pickle extension, not covered by the existing tests
    ("model.pth", "nested"),  # the payload deep inside an otherwise valid state dict
    ("model.safetensors", "pickle"),  # a pickle renamed to look safe
    ("model.safetensors", "torch"),
])
def test_checkpoint_payload_never_runs(tmp_path, name, writer):
    marker, path = tmp_path / "pwned", tmp_path / name
    payload = WritesMarker(marker)
    if writer == "torch":
        torch.save({"state_dict": {"w": torch.zeros(2)}, "extra": payload}, path)
    elif writer == "nested":
        torch.save({"model": {"w": torch.zeros(2), "b": [torch.ones(1), {"x": payload}]}}, path)
    else:
        path.write_bytes(pickle.dumps({"w": payload}))
    with pytest.raises(CheckpointError) as info:  # UnsafeCheckpointError for pickles, a read error for safetensors
        load_state_dict(path)
    assert path.name in str(info.value)
    if name.endswith(".safetensors"):
        assert not isinstance(info.value, UnsafeCheckpointError)  # read as safetensors, never unpickled
    assert not marker.exists()


def test_features_file_with_a_pickled_object_array_never_runs(tmp_path):
    """np.save/np.savez pickle object arrays; the features adapter loads with allow_pickle=False."""
    marker = tmp_path / "pwned"
    evil = np.array([WritesMarker(marker)] * 4, dtype=object)
    npz, folder = tmp_path / "emb.npz", tmp_path / "npy"
    np.savez(npz, train_features=evil, train_labels=np.zeros(4, dtype=np.int64))
    folder.mkdir()
    np.save(folder / "train_features.npy", evil)
    np.save(folder / "train_labels.npy", np.zeros(4, dtype=np.int64))
    for path in (npz, folder):
        with pytest.raises(DatasetError, match="pickle"):
            make_dataset("features", path=str(path))
    assert not marker.exists()


@pytest.mark.parametrize("name", ["../x", "..", "/abs", "~root", "a/../../b", "C:\\x", "\u2215etc", "x\x00",
                                  "\uff0e\uff0e", "%2e%2e"])
def test_escaping_names_never_reach_a_path(tmp_path, name):
    """Through every public entry that turns a name into a key: refused before any I/O."""
    from jobs.extraction.import_features import import_features

    store_dir = tmp_path / "store"
    store = FeatureStore(str(store_dir))
    npz = tmp_path / "emb.npz"
    np.savez(npz, train_features=np.ones((4, 2), np.float32), train_labels=np.arange(4) % 2)
    before, outside = tree(store_dir), tree(tmp_path)
    dataset = make_dataset("features", path=str(npz))
    for call in (lambda: import_features(store, name, dataset, "train"),
                 lambda: import_features(store, "m", dataset, "train", layer=name),
                 lambda: make_dataset("features", path=str(npz), name=name),
                 lambda: store.features(name, "emb", "train", "pre_logits"),
                 lambda: store.labels("emb", name)):
        with pytest.raises(InvalidNameError):
            call()
    assert tree(store_dir) == before and tree(tmp_path) == outside


def test_a_symlink_planted_in_a_local_store_cannot_redirect_writes_outside(tmp_path):
    """Valid names, but someone with access to the folder linked features/m elsewhere."""
    from jobs.extraction.import_features import import_features
    from pipeline.errors import StoreError

    store_dir, outside = tmp_path / "store", tmp_path / "outside"
    store = FeatureStore(str(store_dir))
    outside.mkdir()
    (store_dir / "features").mkdir(exist_ok=True)
    (store_dir / "features" / "m").symlink_to(outside, target_is_directory=True)
    npz = tmp_path / "emb.npz"
    np.savez(npz, train_features=np.ones((4, 2), np.float32), train_labels=np.arange(4) % 2)
    with pytest.raises(StoreError, match="outside store"):
        import_features(store, "m", make_dataset("features", path=str(npz)), "train")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("where", ["namespace", "ckpt"])
def test_plain_records_read_as_stand_ins_never_carry_a_payload(tmp_path, where):
    """argparse.Namespace and the other plain records are read as inert stand-ins
    (pipeline.encoders.checkpoints.reading); a payload inside one is still refused, and never runs."""
    import argparse

    from pipeline.encoders.checkpoints.reading import ArgsRecord, read_checkpoint

    marker = tmp_path / "pwned"
    path = tmp_path / ("args.pth" if where == "namespace" else "last.ckpt")
    torch.save({"state_dict": {"w": torch.zeros(2)}, "args": argparse.Namespace(lr=0.1, hook=WritesMarker(marker))},
               path)
    with pytest.raises(UnsafeCheckpointError, match="needs builtins.exec"):
        read_checkpoint(path)
    assert not marker.exists()
    torch.save({"state_dict": {"w": torch.zeros(2)}, "args": argparse.Namespace(lr=0.1, arch="r18")}, path)
    args = read_checkpoint(path)["args"]
    assert type(args) is ArgsRecord and vars(args) == {"lr": 0.1, "arch": "r18"}
