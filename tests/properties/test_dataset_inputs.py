"""Bad dataset inputs: CSV manifests, precomputed feature files, and damaged publisher layouts
(split files, VOC annotations, cut tar shards). Every one is refused with a repeval error
naming the file (or the value), and importing writes nothing to the store."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from jobs.extraction.import_features import import_features
from pipeline.datasets import make_dataset
from pipeline.datasets.adapters.voc import VOC_CLASSES
from storage_schema import FeatureStore
from tests.pipeline.datasets import layouts as L
from tests.pipeline.datasets import layouts_more as M

FIXTURE_HEALTH = [HealthCheck.function_scoped_fixture]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Two real images the manifests may point at, and a store to import into."""
    root = tmp_path_factory.mktemp("datasets")
    for name in ("a.png", "b.png"):
        Image.new("RGB", (4, 4), (10, 200, 30)).save(root / name)
    FeatureStore(str(root / "store"))
    return root


# -- CSV manifests ----------------------------------------------------------------------------
GOOD_ROWS = [("a.png", "cat", "train"), ("b.png", "dog", "train"), ("a.png", "cat", "test")]


@st.composite
def bad_manifest(draw):
    """(kind, CSV text, class_names, what the message must name besides the file)."""
    kind = draw(st.sampled_from(["missing column", "bad path", "bad label", "empty", "empty cell", "duplicate",
                                 "bad split", "not utf-8", "nul byte", "huge field", "class_names"]))
    header, rows, class_names, names = ["path", "label", "split"], [list(r) for r in GOOD_ROWS], None, []
    if kind == "missing column":
        dropped = draw(st.sampled_from(header))
        header = [h if h != dropped else draw(st.sampled_from(["Path", "lbl", "", "spl it", dropped + "s"]))
                  for h in header]
        names = [dropped]
    elif kind == "bad path":
        bad = draw(st.sampled_from(["missing.png", "../outside.png", "/nonexistent/x.png", "sub/../../x.png",
                                    "a.png/..", "", " "]) | st.text("abc./", min_size=1, max_size=8))
        rows[1][0] = bad
        names = [Path(bad.strip()).as_posix() if bad.strip() else "empty path"]  # ids are normalised paths
    elif kind == "bad label":
        rows = [[p, lab, s] for (p, _, s), lab in zip(GOOD_ROWS, ["0", "1", "0"])]
        bad = draw(st.sampled_from(["-1", "1.5", "1e3", "x", "٣", "0x1"]) | st.text("0123456789.-", min_size=1,
                                                                                      max_size=4).filter(
            lambda v: not (v.strip().isdigit() and int(v) < 2)))  # 0 and 1 are valid indices
        rows[2][1] = bad
        class_names = ["zero", "one"]
        names = [repr(bad.strip()), "empty label"]
    elif kind == "empty":
        rows = draw(st.sampled_from([[], None]))
        names = ["no rows", "lacks column"]
    elif kind == "empty cell":
        col = draw(st.integers(0, 2))
        rows[0][col] = ""
        names = [["path", "label", "split"][col]]
    elif kind == "duplicate":
        rows.append(list(rows[0]))
        names = ["listed twice"]
    elif kind == "bad split":
        bad = draw(st.sampled_from(["..", "a/b", ".hidden", "-x", "tr ain", "\u00e9t\u00e9"]))
        rows[0][2] = bad
        names = [repr(bad)]
    elif kind == "class_names":
        class_names = draw(st.sampled_from([["cat", "cat", "dog"], ["cat"], []]))
        names = ["class_names", "'dog'", "neither a class name"]
    return kind, header, rows, class_names, names


def _write_manifest(path: Path, kind: str, header: list[str], rows: list | None) -> None:
    buf = io.StringIO()
    if rows is not None:
        writer = csv.writer(buf)
        writer.writerow(header)
        writer.writerows(rows)
    data = buf.getvalue().encode()
    if kind == "not utf-8":
        data = data.replace(b"dog", b"d\xffg")
    elif kind == "nul byte":
        data = data.replace(b"dog", b"d\x00g")
    elif kind == "huge field":
        data = data.replace(b"dog", b"d" * 200_000)
    path.write_bytes(data)


@settings(max_examples=120, deadline=None, suppress_health_check=FIXTURE_HEALTH)
@given(case=bad_manifest())
def test_bad_manifest_is_refused_naming_the_file(tally, folder, case):
    kind, header, rows, class_names, names = case
    path = folder / "pets_manifest.csv"
    _write_manifest(path, kind, header, rows)
    file_named = ("pets_manifest.csv",)
    expect = [file_named + (n,) for n in names] if names else [file_named]
    if kind == "bad split":  # named by the dataset, whose name is the file's stem
        expect = [("pets_manifest", n) for n in names]
    if kind in ("not utf-8", "nul byte", "huge field"):
        expect = [file_named]
    tally.expect_error("dataset manifests (csv_manifest)",
                       lambda: make_dataset("csv_manifest", csv_path=str(path), class_names=class_names),
                       expect, folder / "store", kind=kind)


def test_missing_manifest_file_is_named(tally, folder):
    tally.expect_error("dataset manifests (csv_manifest)",
                       lambda: make_dataset("csv_manifest", csv_path=str(folder / "nope.csv")), ["nope.csv"],
                       folder / "store", kind="no file")


# -- precomputed features (.npz) through import_features ---------------------------------------
def _good_arrays(rng) -> dict[str, np.ndarray]:
    return {"train_features": rng.normal(size=(8, 3)).astype(np.float32), "train_labels": np.arange(8) % 2,
            "test_features": rng.normal(size=(4, 3)).astype(np.float32), "test_labels": np.arange(4) % 2}


@st.composite
def bad_feature_arrays(draw):
    rng = np.random.default_rng(draw(st.integers(0, 100)))
    arrays = _good_arrays(rng)
    split = draw(st.sampled_from(["train", "test"]))
    f, lab = f"{split}_features", f"{split}_labels"
    kind = draw(st.sampled_from(["nan/inf", "1-D", "3-D", "no rows", "no columns", "label count", "float labels",
                                 "2-D labels", "negative label", "string features", "complex", "object array",
                                 "width differs", "no labels", "extra array", "class_names", "no features"]))
    names = [f]
    if kind == "nan/inf":
        bad = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        rows = draw(st.lists(st.integers(0, arrays[f].shape[0] - 1), min_size=1, max_size=3))
        arrays[f][rows, draw(st.integers(0, 2))] = bad
    elif kind == "1-D":
        arrays[f] = arrays[f][:, 0]
    elif kind == "3-D":
        arrays[f] = arrays[f][:, :, None]
    elif kind == "no rows":
        arrays[f], arrays[lab] = arrays[f][:0], arrays[lab][:0]
    elif kind == "no columns":
        arrays[f] = arrays[f][:, :0]
    elif kind == "label count":
        arrays[lab] = arrays[lab][: draw(st.integers(0, len(arrays[lab]) - 1))] if draw(st.booleans()) else \
            np.concatenate([arrays[lab], [0]])
        names = [lab]
    elif kind == "float labels":
        arrays[lab] = arrays[lab] + draw(st.sampled_from([0.0, 0.5]))
        names = [lab]
    elif kind == "2-D labels":
        arrays[lab] = arrays[lab][:, None]
        names = [lab]
    elif kind == "negative label":
        arrays[lab][0] = -draw(st.integers(1, 5))
        names = [lab]
    elif kind == "string features":
        arrays[f] = arrays[f].astype(str)
    elif kind == "complex":
        arrays[f] = arrays[f] + 1j
    elif kind == "object array":
        arrays[f] = np.array([None] * len(arrays[lab]), dtype=object)
        names = ["pickle", "Cannot read"]
    elif kind == "width differs":
        arrays[f] = np.hstack([arrays[f], arrays[f]])
        names = ["widths differ"]
    elif kind == "no labels":
        del arrays[lab]
        names = [lab]
    elif kind == "extra array":
        arrays[draw(st.sampled_from(["train_feature", "weights", "val_labels"]))] = np.zeros(3)
        names = ["unexpected array"]
    elif kind == "class_names":
        arrays["class_names"] = draw(st.sampled_from([np.array(["only one"]), np.array([[1, 2]]), np.zeros(2)]))
        names = ["class_names"]
    elif kind == "no features":
        arrays = {k: v for k, v in arrays.items() if not k.endswith("_features")}
        names = ["unexpected array", "no <split>_features"]
    return kind, arrays, names


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **arrays)  # allow_pickle defaults to True when saving: object arrays are written


@settings(max_examples=120, deadline=None, suppress_health_check=FIXTURE_HEALTH)
@given(case=bad_feature_arrays())
def test_bad_feature_file_is_refused_and_nothing_is_imported(tally, folder, case):
    kind, arrays, names = case
    path = folder / "emb.npz"
    _save_npz(path, arrays)

    def load_and_import():
        dataset = make_dataset("features", path=str(path))
        for split in dataset.splits:
            import_features(FeatureStore(str(folder / "store")), "m", dataset, split)

    tally.expect_error("feature files (import_features)", load_and_import, [("emb.npz", n) for n in names],
                       folder / "store", kind=kind)


def test_valid_feature_file_imports(folder, tmp_path):
    """Control: the arrays the bad cases start from import fine (into another store)."""
    path = tmp_path / "ok.npz"
    _save_npz(path, _good_arrays(np.random.default_rng(0)))
    report = import_features(FeatureStore(str(tmp_path / "s")), "m", make_dataset("features", path=str(path)), "train")
    assert report.status == "imported" and report.rows == 8


# -- publisher layouts: damaged split files, annotations and tar shards -------------------------

@pytest.fixture(scope="module")
def shard_copy(tmp_path_factory) -> tuple[Path, bytes, int]:
    """A webdataset copy, the bytes of its train/0.tar, and where its end-of-archive block starts."""
    import tarfile

    root = L.webdataset(tmp_path_factory.mktemp("wds")).root
    shard = root / "train" / "0.tar"
    with tarfile.open(shard) as tar:
        last = tar.getmembers()[-1]
    return root, shard.read_bytes(), last.offset_data + -(-last.size // 512) * 512


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE_HEALTH)
@given(cut=st.floats(0.0, 1.0, exclude_max=True))
def test_cut_tar_shard_is_named_or_read_whole(tally, shard_copy, cut):
    root, data, end = shard_copy
    shard = root / "train" / "0.tar"
    keep = int(cut * len(data))
    shard.write_bytes(data[:keep])
    try:
        if keep >= end + 512:  # the cut falls in the zero padding after the end block: nothing lost
            ds = make_dataset("webdataset", root=str(root))
            assert ds.num_samples("train") == 5
            tally.counts["tar shards (webdataset)"]["ran"] += 1
        else:
            tally.expect_error("tar shards (webdataset)", lambda: make_dataset("webdataset", root=str(root)),
                               [str(shard)], kind="cut")
    finally:
        shard.write_bytes(data)


@pytest.fixture(scope="module")
def voc_copy(tmp_path_factory) -> Path:
    return M.voc2007(tmp_path_factory.mktemp("voc")).root


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURE_HEALTH)
@given(name=st.text(min_size=0, max_size=12).filter(lambda t: t.strip() not in VOC_CLASSES))
def test_bad_voc_annotation_is_named(tally, voc_copy, name):
    xml = voc_copy / "VOCdevkit" / "VOC2007" / "Annotations" / "000019.xml"
    original = xml.read_bytes()
    # an unknown class, or (with <, & ...) XML that does not parse: either way the file is named
    xml.write_text(f"<annotation><object><name>{name}</name><difficult>0</difficult></object></annotation>",
                   encoding="utf-8")
    try:
        tally.expect_error("annotations (voc2007)", lambda: make_dataset("voc2007", root=str(voc_copy)),
                           [str(xml)], kind="object name")
    finally:
        xml.write_bytes(original)


@pytest.fixture(scope="module")
def aircraft_copy(tmp_path_factory) -> Path:
    return L.aircraft(tmp_path_factory.mktemp("aircraft")).root


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURE_HEALTH)
@given(line=st.text(min_size=1, max_size=30).filter(lambda t: t.strip() and "\n" not in t and "\r" not in t))
def test_bad_split_file_line_is_named(tally, aircraft_copy, line):
    split_file = aircraft_copy / "data" / "images_variant_train.txt"
    original = split_file.read_bytes()
    split_file.write_bytes(original + line.encode("utf-8") + b"\n")
    try:
        tally.expect_error("split files (aircraft)", lambda: make_dataset("aircraft", root=str(aircraft_copy)),
                           [str(split_file)], kind="extra line")
    finally:
        split_file.write_bytes(original)
