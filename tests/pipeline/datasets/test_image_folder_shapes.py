"""The folder shapes labs already have: a root of class folders without split folders, an
empty class or one only a split has, hidden class folders, an undecodable JPEG seen by
``repeval datasets show`` with or without ``skip_bad``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from flows.cli.main import main
from pipeline.datasets import make_dataset
from pipeline.datasets.inspection import dataset_notes
from pipeline.errors import ConfigError, DatasetError
from tests.pipeline.datasets.layouts import freeze_times, write_image


def _class_root(root: Path, counts: dict[str, int]) -> Path:
    """``root/<class>/<i>.png``: no split folders."""
    for cls, n in counts.items():
        for i in range(n):
            write_image(root / cls / f"{i:02d}.png", 10 * i + len(cls))
    freeze_times(root)
    return root


def test_a_root_of_class_folders_says_what_was_found_and_splits_on_request(tmp_path: Path) -> None:
    root = _class_root(tmp_path / "mine", {"a": 8, "b": 4, "c": 2, "d": 1})
    with pytest.raises(DatasetError) as info:
        make_dataset("image_folder", root=str(root))
    msg = str(info.value)
    assert "class folders with images directly inside (a, b, c, d)" in msg
    # the line that works, in a config and on the command line
    assert "set `test_fraction: 0.25` in the dataset's params" in msg and "--param test_fraction=0.25" in msg
    assert "no class folders under" not in msg  # the classes are not taken for splits

    ds = make_dataset("image_folder", root=str(root), test_fraction=0.25, seed=3)
    assert ds.splits == ("train", "test") and ds.class_names == ["a", "b", "c", "d"]
    test = Counter(ds.class_names[k] for k in ds.labels("test"))
    train = Counter(ds.class_names[k] for k in ds.labels("train"))
    # stratified: round(0.25 n) per class, at least one and never all; one image stays in train
    assert test == {"a": 2, "b": 1, "c": 1} and train == {"a": 6, "b": 3, "c": 1, "d": 1}
    assert not set(ds.sample_ids("train")) & set(ds.sample_ids("test"))
    assert all(i.startswith(f"{ds.class_names[k]}/") for i, k in zip(ds.sample_ids("test"), ds.labels("test")))
    ds.load_image("test", 0)

    again = make_dataset("image_folder", root=str(root), test_fraction=0.25, seed=3)
    assert again.sample_ids("test") == ds.sample_ids("test") and again.fingerprint("test") == ds.fingerprint("test")
    other_seed = make_dataset("image_folder", root=str(root), test_fraction=0.25, seed=4)
    assert other_seed.sample_ids("test") != ds.sample_ids("test")
    # the split's parameters are in the fingerprint, even where they pick the same images
    same_images = make_dataset("image_folder", root=str(root), test_fraction=0.2, seed=3)
    assert Counter(same_images.labels("test")) == Counter(ds.labels("test"))
    assert same_images.fingerprint("train") != ds.fingerprint("train")
    rebuilt = make_dataset("image_folder", name=ds.name, **{k: v for k, v in ds.describe().items()
                                                            if k in ("root", "test_fraction", "seed")})
    assert rebuilt.fingerprint("test") == ds.fingerprint("test")
    notes = {n["kind"]: n for n in dataset_notes(ds)}
    assert notes["empty_classes"]["items"] == ["d"] and notes["empty_classes"]["where"] == "mine/test"


def test_test_fraction_refuses_a_root_with_split_folders_and_bad_values(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for split in ("train", "test"):
        write_image(root / split / "a" / "1.png", 5)
    with pytest.raises(DatasetError, match=r"has split folders \(test, train\)"):
        make_dataset("image_folder", root=str(root), test_fraction=0.3)
    with pytest.raises(ConfigError, match=r"test_fraction must be in \(0, 1\), got 1.5"):
        make_dataset("image_folder", root=str(root), test_fraction=1.5)
    with pytest.raises(ConfigError, match="give one of them"):
        make_dataset("image_folder", root=str(root), test_fraction=0.3, splits=["train"])


def test_an_empty_class_and_a_class_only_one_split_has_are_named(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for split, cls, n in (("train", "cat", 2), ("test", "cat", 1), ("test", "dog", 2), ("train", "bird", 1),
                          ("test", "bird", 1)):
        for i in range(n):
            write_image(root / split / cls / f"{i}.png", i + 1)
    (root / "train" / "dog").mkdir()  # the class folder exists in train, but holds nothing
    ds = make_dataset("image_folder", root=str(root))
    notes = dataset_notes(ds)
    assert notes == [{"where": "tree/train", "kind": "empty_classes", "items": ["dog"],
                      "what": "1 class(es) without any image in split 'train'"}]


def test_hidden_class_folders_are_left_out_and_listed(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for split in ("train", "test"):
        write_image(root / split / "a" / "1.png", 5)
        write_image(root / split / "..evil" / "1.png", 9)
    write_image(root / "train" / "a" / ".ipynb_checkpoints" / "1.png", 7)
    ds = make_dataset("image_folder", root=str(root))
    assert ds.class_names == ["a"] and ds.num_samples("train") == 1
    hidden = next(n for n in dataset_notes(ds) if n["kind"] == "hidden_folders")
    assert hidden["items"] == ["test/..evil", "train/..evil", "train/a/.ipynb_checkpoints"]


@pytest.mark.parametrize("skip_bad", [False, True])
def test_datasets_show_decodes_and_names_every_undecodable_file(tmp_path: Path, capsys, skip_bad: bool) -> None:
    root = tmp_path / "tree"
    for split in ("train", "test"):
        for i in range(2):
            write_image(root / split / "a" / f"{i}.png", i + 1)
    good = (root / "train" / "a" / "0.png").read_bytes()
    (root / "train" / "a" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "test" / "a" / "cut.png").write_bytes(good[: len(good) // 2])
    write_image(root / "test" / ".hidden" / "x.png", 3)
    argv = ["datasets", "show", "image_folder", "--param", f"root={root}", f"skip_bad={str(skip_bad).lower()}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    if skip_bad:  # left out at construction, and named as skipped
        assert "skipped in train: a/bad.jpg" in out and "skipped in test: a/cut.png" in out
        assert "every image: all decode" in out and "skip_bad: true" not in out
    else:  # every one named, not "0 skipped", with the line that leaves them out
        assert "undecodable in train: a/bad.jpg" in out and "undecodable in test: a/cut.png" in out
        assert "every image: 2 undecodable" in out
        assert "`skip_bad: true` in the dataset's params (--param skip_bad=true) leaves them out" in out
    assert "warning: tree: 1 hidden folder(s) left out (names starting with '.'): test/.hidden" in out
    assert main(argv + ["--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["undecodable"] == ({"train": [], "test": []} if skip_bad else
                                      {"train": ["a/bad.jpg"], "test": ["a/cut.png"]})
    assert main(argv + ["--no-decode"]) == 0
    assert "decoded      no" in capsys.readouterr().out
