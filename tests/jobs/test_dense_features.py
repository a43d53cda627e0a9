"""Spatial maps in the store and the dense cells that read them, on tiny ADE20K and NYUv2
copies in their publishers' layouts: maps stored as float16 grids of the forward pass,
targets laid over the encoder's input crop, pairing and refusals at planning, memory
estimated before extraction and an impossible cell refused, metrics equal to a direct
computation from the stored predictions, a better encoder beating a random one, paired
comparisons from the evidence, the correlation conventions and the report section."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr
from sklearn.metrics import confusion_matrix as sk_confusion

from flows.cli.main import main
from jobs.analysis.compare import compare_encoders
from jobs.config import load_config
from jobs.extraction.dense_targets import store_targets
from jobs.evaluation.evaluate import Cell, evaluate_cell
from jobs.extraction.extract import ExtractConfig, extract
from jobs.run.plan import evaluation_cells, make_plan
from pipeline.datasets import make_dataset
from pipeline.datasets.dense_geometry import resample_target, target_geometry
from pipeline.encoders import EncoderSpec, load_encoder
from pipeline.errors import CellTooLargeError, ConfigError
from pipeline.protocols import get_protocol
from storage_schema import ArraySpec, FeatureStore, feature_key, features_group_key
from storage_schema.ledger import Ledger
from tests.helpers.dense_layouts import CLASS_COLOURS, write_ade20k, write_nyuv2

SIZE = 32  # resnet18 block1 at 32 px: an 8 x 8 grid, stride 4
CFG = ExtractConfig(batch_size=4, chunk_batches=1, progress=False)
SEG = {"learning_rates": [0.5, 2.0], "epochs": 4, "batch_size": 4, "device": "cpu"}
NRM = {"head": "linear", "learning_rate": 0.5, "epochs": 4, "batch_size": 4, "device": "cpu"}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Both datasets extracted by two random resnet18s (block1.map and pre_logits)."""
    root = tmp_path_factory.mktemp("dense")
    ade = make_dataset("ade20k", root=str(write_ade20k(root / "ade")))
    nyu = make_dataset("nyuv2_normals", root=str(write_nyuv2(root / "nyu")))
    store = FeatureStore(str(root / "store"))
    encoders = [load_encoder(EncoderSpec(name=f"r18s{seed}", arch="resnet18", seed=seed, input_size=SIZE,
                                         layers=("pre_logits", "block1.map")), device="cpu") for seed in (0, 1)]
    for encoder in encoders:
        for dataset in (ade, nyu):
            for split in dataset.splits:
                extract(store, encoder, dataset, split, CFG)
    return {"root": root, "store": store, "ade": ade, "nyu": nyu, "encoders": encoders}


def test_map_layers_are_float16_grids_of_the_forward_pass(world, tmp_path):
    store, ade = world["store"], world["ade"]
    maps = store.features("r18s0", "ade20k", "val", "block1.map")
    assert maps.shape == (4, 8, 8, 64) and maps.read().dtype == np.float16
    assert maps.status.chunk_rows == 4 and maps.attrs["grid"] == [8, 8] and maps.attrs["stride"] == [4.0, 4.0]
    assert maps.attrs["input_size"] == [SIZE, SIZE] and maps.attrs["pooling"] == "map: spatial feature map"
    assert maps.attrs["labels"] == "datasets/ade20k/val/targets-r33-c32x32"
    encoder = world["encoders"][0]
    images = torch.stack([encoder.transform()(ade.load_image("val", i)) for i in range(4)])
    with torch.inference_mode():
        (stage,) = encoder.model.forward_intermediates(images, indices=[1], intermediates_only=True)
    np.testing.assert_allclose(maps.read().astype(np.float32), stage.permute(0, 2, 3, 1).numpy(), rtol=2e-3,
                               atol=2e-3)
    # a ViT's patch tokens on their grid, the class token left out
    vit = load_encoder(EncoderSpec(name="vit", arch="vit_tiny_patch16_224", input_size=32,
                                   layers=("block1.map", "block1.tokens")), device="cpu")
    out = vit.forward(torch.stack([vit.transform()(ade.load_image("val", i)) for i in range(2)]))
    assert vit.feature_shapes()["block1.map"] == (2, 2, 192)
    assert vit.pooling("block1.map") == "map: patch tokens on their grid"
    np.testing.assert_allclose(out["block1.map"].reshape(2, 4, 192), out["block1.tokens"][:, 1:], rtol=1e-6)
    small = FeatureStore(str(tmp_path / "s"))
    report = extract(small, vit, ade, "val", CFG)
    assert report.fingerprints["block1.map"] != report.fingerprints["block1.tokens"]
    assert small.features("vit", "ade20k", "val", "block1.map").attrs["stride"] == [16.0, 16.0]


def test_targets_are_the_encoders_crop_of_the_ground_truth_shared_by_its_geometry(world):
    store, ade, nyu = world["store"], world["ade"], world["nyu"]
    encoder = world["encoders"][0]
    geometry = target_geometry(encoder.data_config)
    seg = store.open_array("datasets/ade20k/train/targets-r33-c32x32")
    assert seg.shape == (6, SIZE, SIZE) and seg.read().dtype == np.uint8 and seg.attrs["task"] == "segmentation"
    np.testing.assert_array_equal(seg.read()[4], resample_target(ade.load_target("train", 4), geometry))
    assert 255 in seg.read() and seg.read()[seg.read() != 255].max() == 3  # ADE's 1..4 -> 0..3, 0 ignored
    # both encoders share one geometry, hence one targets array
    keys = {store.features(f"r18s{s}", "ade20k", "train", "block1.map").attrs["labels"] for s in (0, 1)}
    assert keys == {seg.key}
    normals = store.open_array("datasets/nyuv2_normals/test/targets-r33-c32x32").read()
    lengths = np.linalg.norm(normals.astype(np.float32), axis=-1)
    assert normals.dtype == np.float16 and normals.shape == (4, SIZE, SIZE, 3)
    assert np.allclose(lengths[lengths > 0], 1, atol=2e-3) and (lengths == 0).any()  # masked top rows
    # aligned with the image the encoder sees: each tile's colour is its class
    image = encoder.transform()(ade.load_image("train", 4)).permute(1, 2, 0).numpy()
    mean, std = np.array(encoder.data_config["mean"]), np.array(encoder.data_config["std"])
    rgb = (image * std + mean) * 255
    nearest = np.argmin(((rgb[..., None, :] - CLASS_COLOURS[None, None, :4]) ** 2).sum(-1), axis=-1)
    target = seg.read()[4].astype(np.int64)
    inside = np.ones_like(target, dtype=bool)  # pixels whose 3 x 3 neighbourhood is one class
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            inside &= np.roll(target, (dy, dx), axis=(0, 1)) == target
    inside[[0, -1]] = inside[:, [0, -1]] = False
    inside &= target != 255
    assert inside.sum() > 300 and (nearest[inside] == target[inside]).all()
    # another input size is another geometry: its own targets
    other = load_encoder(EncoderSpec(name="r18x", arch="resnet18", input_size=64, layers=("block1.map",)),
                         device="cpu")
    assert store_targets(store, ade, "val", other.data_config).endswith("targets-r67-c64x64")  # 64 / crop_pct 0.95


def test_repeval_ls_lists_maps_and_targets(world, capsys):
    assert main(["ls", "--store", world["store"].url, "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["features/r18s0/ade20k/val/block1.map"]["shape"] == [4, 8, 8, 64]
    assert rows["features/r18s0/ade20k/val/block1.map"]["dtype"] == "float16"
    assert rows["datasets/ade20k/val/targets-r33-c32x32"]["shape"] == [4, SIZE, SIZE]
    assert rows["datasets/nyuv2_normals/train/targets-r33-c32x32"]["status"] == "complete"


def _config(world, protocols, datasets=("ade", "nyu"), layers=("pre_logits", "block1.map"), **extra) -> dict:
    root = world["root"]
    entries = {"ade": {"name": "ade20k", "adapter": "ade20k", "params": {"root": str(root / "ade")},
                       "test_split": "val"},
               "nyu": {"name": "nyuv2_normals", "adapter": "nyuv2_normals", "params": {"root": str(root / "nyu")}},
               "tex": {"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 4, "test": 2}}}}
    return {"store": world["store"].url,
            "encoders": [{"name": f"r18s{s}", "arch": "resnet18", "seed": s, "input_size": SIZE, "layers": list(layers)}
                         for s in (0, 1)],
            "datasets": [entries[d] for d in datasets], "protocols": protocols,
            "report": {"path": str(root / "report.html"), "baseline": "r18s1"}, **extra}


def test_dense_protocols_pair_only_with_their_datasets_and_map_layers(world):
    protocols = [{"name": "seg", "protocol": "segmentation"}, {"name": "nrm", "protocol": "normals"},
                 {"name": "knn", "protocol": "knn"}]
    cfg = load_config(_config(world, protocols, datasets=("ade", "nyu", "tex")))
    pairs = {(c.setting, c.dataset, c.layer) for c in evaluation_cells(cfg) if c.model == "r18s0"}
    assert pairs == {("seg", "ade20k", "block1.map"), ("nrm", "nyuv2_normals", "block1.map"),
                     ("knn", "tex", "pre_logits")}


@pytest.mark.parametrize("protocols, datasets, layers, message", [
    ([{"name": "seg", "protocol": "segmentation"}], ("nyu",), ("block1.map",),
     r"protocols\[0\] \(seg\): protocol 'segmentation' needs a dataset with segmentation targets"),
    ([{"name": "seg", "protocol": "segmentation", "datasets": ["nyuv2_normals"]}], ("ade", "nyu"), ("block1.map",),
     r"protocols\[0\].datasets: 'nyuv2_normals' has normals targets, but protocol 'segmentation' \(seg\) reads "
     "segmentation targets"),
    ([{"name": "lin", "protocol": "logistic", "datasets": ["ade20k"]}], ("ade",), ("pre_logits",),
     r"'ade20k' has segmentation targets, but protocol 'logistic' \(lin\) reads no per-pixel targets"),
    ([{"name": "nrm", "protocol": "normals"}], ("nyu",), ("pre_logits",),
     r"protocol 'normals' reads spatial maps, but no encoder extracts a map layer; add e.g. 'block3.map'"),
    ([{"name": "nrm", "protocol": "normals", "layers": ["pre_logits"]}], ("nyu",), ("pre_logits", "block1.map"),
     r"'pre_logits' is a pooled layer, which protocol 'normals' \(nrm\) cannot read; it reads map layers"),
    ([{"name": "knn", "protocol": "knn", "layers": ["block1.map"]}], ("ade",), ("pre_logits", "block1.map"),
     r"'block1.map' is a map layer, which protocol 'knn' \(knn\) cannot read; map layers are read by the "
     "protocols that take maps"),
    ([{"name": "ft", "protocol": "finetune"}], ("ade",), ("pre_logits",),
     r"dataset 'ade20k' has per-pixel targets, which encoder protocol 'finetune' cannot read"),
])
def test_mismatched_dense_configs_are_refused_at_planning(world, protocols, datasets, layers, message):
    with pytest.raises(ConfigError, match=message):
        make_plan(load_config(_config(world, protocols, datasets, layers)))


def test_dense_cell_memory_is_known_before_extraction_and_an_impossible_cell_is_refused(world, tmp_path):
    from jobs.evaluation.cell_memory import check_cells_fit, declared_memory, parse_bytes

    raw = _config(world, [{"name": "seg", "protocol": "segmentation", "settings": SEG}], datasets=("ade",))
    before = make_plan(load_config({**raw, "store": str(tmp_path / "empty")}))  # sized on the meta device
    stored = make_plan(load_config(raw))  # sized from the stored maps and targets
    label = "r18s0/ade20k/block1.map:seg"
    expected = get_protocol("segmentation").memory_bytes(6, 4, 0, 64, 150, 2, before.cells[0].settings,
                                                         n_tokens=8 * 8, target_pixels=SIZE * SIZE)
    assert before.cell_memory[label] == stored.cell_memory[label] == expected
    # what `repeval run` checks before Prefect or Dask start (flows.benchmark.run_plan), for 40 MiB workers
    with pytest.raises(CellTooLargeError, match=rf"{label} needs .* \({expected} bytes\)"):
        check_cells_fit(before.cell_memory, [declared_memory(parse_bytes("40MiB"))], "a 40 MiB cluster")
    check_cells_fit(before.cell_memory, [expected], "a cluster")  # exactly enough is enough


@pytest.fixture(scope="module")
def evaluated(world):
    store = world["store"]
    out = {}
    for model in ("r18s0", "r18s1"):
        out[model, "seg"] = evaluate_cell(store, Cell(model, "ade20k", "block1.map", "seg", "segmentation", SEG,
                                                      "train", "val")).record
        out[model, "nrm"] = evaluate_cell(store, Cell(model, "nyuv2_normals", "block1.map", "nrm", "normals",
                                                      NRM)).record
    return out


def test_recorded_metrics_equal_a_direct_computation_from_the_stored_predictions(world, evaluated):
    store = world["store"]
    seg, nrm = evaluated["r18s0", "seg"], evaluated["r18s0", "nrm"]
    pred = store.open_array(seg["predicted_maps"]["key"]).read()
    target = store.open_array(seg["evidence"]["labels"]).read()
    keep = target.ravel() != 255
    conf = sk_confusion(target.ravel()[keep], pred.ravel()[keep], labels=range(150))
    tp, union = np.diag(conf), conf.sum(0) + conf.sum(1) - np.diag(conf)
    assert seg["metrics"]["miou"] == pytest.approx(np.mean(tp[union > 0] / union[union > 0]), abs=1e-12)
    assert seg["metrics"]["pixel_accuracy"] == pytest.approx(tp.sum() / keep.sum(), abs=1e-12)
    assert seg["metrics"]["score"] == seg["metrics"]["miou"] and seg["grid"] == [8, 8]
    counts = store.open_array(seg["evidence"]["key"]).read()
    np.testing.assert_array_equal(counts.sum(0)[:, 0], tp)

    pred = store.open_array(nrm["predicted_maps"]["key"]).read().astype(np.float64)
    true = store.open_array(nrm["evidence"]["labels"]).read().astype(np.float64)
    valid = np.linalg.norm(true, axis=-1) > 0
    p, g = pred[valid], true[valid]
    angles = np.degrees(np.arctan2(np.linalg.norm(np.cross(p, g), axis=1), np.einsum("ij,ij->i", p, g)))
    m = nrm["metrics"]
    assert m["mean_angle_error"] == pytest.approx(angles.mean(), abs=1e-6)
    assert m["median_angle_error"] == pytest.approx(np.median(angles), abs=1e-6)
    for name, t in (("within_11_25", 11.25), ("within_22_5", 22.5), ("within_30", 30.0)):
        assert m[name] == pytest.approx(np.mean(angles < t), abs=1e-9)
    assert m["valid_pixels"] == valid.sum() and nrm["evidence"]["kind"] == "pixel_counts"
    assert not (world["root"] / "store" / "_repeval" / "scratch" / "dense" / nrm["cell_id"]).exists()  # recorded


def _write_maps(store, model, dataset, split, maps, labels_key):
    key = feature_key(model, dataset, split, "block1.map")
    attrs = {"fingerprint": f"{model}-{dataset}-{split}", "kind": "features", "model": model, "dataset": dataset,
             "split": split, "layer": "block1.map", "labels": labels_key, "dtype": "float16"}
    with store.lease(features_group_key(model, dataset, split)) as lease:
        store.write_arrays(lease, [ArraySpec(key, maps.shape, len(maps), "float16", attrs)],
                           lambda todo: [(0, {key: maps})])


def test_a_better_encoder_beats_a_random_one_on_both_tasks_and_compare_says_so(world, evaluated):
    """"oracle": maps whose first channels are each grid cell's ground truth (one-hot class or
    normal) plus noise; "noise": the same shape, noise only."""
    store = world["store"]
    rng = np.random.default_rng(0)
    for dataset, splits in (("ade20k", ("train", "val")), ("nyuv2_normals", ("train", "test"))):
        for split in splits:
            labels = store.features("r18s0", dataset, split, "block1.map").attrs["labels"]
            target = store.open_array(labels).read()
            cells = target[:, 2::4, 2::4]  # each 4 x 4 cell's ground truth near its centre
            signal = np.eye(5)[np.where(cells == 255, 4, cells)] if dataset == "ade20k" else cells.astype(np.float64)
            maps = rng.normal(0, 0.3, (len(target), 8, 8, 8))
            _write_maps(store, "noise", dataset, split, maps.astype(np.float16), labels)
            maps[..., :signal.shape[-1]] += 2 * signal
            _write_maps(store, "oracle", dataset, split, maps.astype(np.float16), labels)
    recs = {}
    for model in ("oracle", "noise"):
        recs[model, "seg"] = evaluate_cell(store, Cell(model, "ade20k", "block1.map", "seg", "segmentation", SEG,
                                                       "train", "val")).record
        recs[model, "nrm"] = evaluate_cell(store, Cell(model, "nyuv2_normals", "block1.map", "nrm", "normals",
                                                       NRM)).record
    o, n = recs["oracle", "seg"]["metrics"], recs["noise", "seg"]["metrics"]
    assert o["miou"] > n["miou"] + 0.3 and o["pixel_accuracy"] > n["pixel_accuracy"] + 0.3, (o, n)
    o, n = recs["oracle", "nrm"]["metrics"], recs["noise", "nrm"]["metrics"]
    assert o["within_30"] > n["within_30"] + 0.3 and o["median_angle_error"] < n["median_angle_error"] - 20, (o, n)
    comparison = compare_encoders(store, list(recs.values()), "oracle", "noise")
    assert set(comparison.verdicts) == {("seg", "ade20k", "block1.map"), ("nrm", "nyuv2_normals", "block1.map")}
    for verdict in comparison.verdicts.values():
        assert verdict.comparison.difference > 0 and verdict.comparison.test == "randomization"
        assert verdict.comparison.score_a == pytest.approx(
            recs["oracle", "seg" if verdict.comparison.metric == "miou" else "nrm"]["metrics"]["score"])
    # the two random resnet18s pair on the same targets too
    again = compare_encoders(store, list(evaluated.values()), "r18s0", "r18s1")
    assert len(again.verdicts) == 2 and not again.not_compared


def test_correlations_negate_angle_errors_and_logit_the_fractions(world):
    raw = _config(world, [{"name": "nrm", "protocol": "normals"}], datasets=("nyu",),
                  reference={"scores": {"a": 0.5, "b": 0.6, "c": 0.7, "d": 0.8}},
                  correlation={"bootstrap": 0, "settings": [
                      {"name": "median", "protocol": "nrm", "datasets": ["nyuv2_normals"], "layer": "block1.map",
                       "metric": "median_angle_error"},
                      {"name": "within", "protocol": "nrm", "datasets": ["nyuv2_normals"], "layer": "block1.map",
                       "metric": "within_11_25"}]})
    cfg = load_config(raw)
    median, within = cfg.correlation.settings
    assert (median.bounded, median.lower_is_better) == (False, True) and (within.bounded, within.lower_is_better) == (
        True, False)
    from jobs.analysis.correlate import correlate_results

    errors, shares = {"a": 30.0, "b": 24.0, "c": 25.0, "d": 18.0}, {"a": 0.1, "b": 0.3, "c": 0.2, "d": 0.5}
    from storage_schema.ledger import config_hash

    records = [{"model": m, "dataset": "nyuv2_normals", "setting": "nrm", "layer": "block1.map", "protocol": "normals",
                "config_hash": config_hash(cfg.protocols[0].settings), "recorded": f"2026-01-0{i + 1}",
                "metrics": {"median_angle_error": errors[m], "within_11_25": shares[m]}} for i, m in enumerate(errors)]
    report = correlate_results(records, cfg, cfg.reference_scores())
    assert report.setting("median").status == "ok", report.setting("median").message
    ref = np.log(np.array([0.5, 0.6, 0.7, 0.8]) / (1 - np.array([0.5, 0.6, 0.7, 0.8])))
    got = report.setting("median").setting["pearson"]
    assert got == pytest.approx(pearsonr(ref, -np.array(list(errors.values()))).statistic)
    share = np.array(list(shares.values()))
    assert report.setting("within").setting["pearson"] == pytest.approx(
        pearsonr(ref, np.log(share / (1 - share))).statistic)
    bad = json.loads(json.dumps(raw))
    bad["correlation"]["settings"][0]["bounded"] = True
    with pytest.raises(ConfigError, match=r"settings\[0\].bounded: 'median_angle_error' is an angle in degrees"):
        load_config(bad)


def test_the_report_shows_the_dense_tables_and_predicted_maps(world, evaluated):
    from jobs.report import write_report

    cfg = load_config(_config(world, [{"name": "seg", "protocol": "segmentation", "settings": SEG},
                                      {"name": "nrm", "protocol": "normals", "settings": NRM}]))
    records = [r for r in Ledger(world["store"]) if r["model"] in ("r18s0", "r18s1")]
    html = open(write_report(records, None, cfg, str(world["root"] / "report.html"))).read()
    dense = html[html.index('<section id="dense">'):]
    dense = dense[:dense.index("</section>")]
    assert "Semantic segmentation" in dense and "Surface normals" in dense and dense.count("data:image/png") == 2
    assert "seg on ade20k: first test images" in dense and "baseline" in dense
    if '<section id="accuracy">' in html:  # a section with no content is not rendered at all
        accuracy = html[html.index('<section id="accuracy">'):]
        assert "seg (segmentation)" not in accuracy[:accuracy.index("</section>")]  # not among the accuracy tables


def test_a_damaged_targets_chunk_is_repaired_bitwise(world, tmp_path):
    from jobs.extraction.repair import repair

    store = FeatureStore(str(tmp_path / "s"))
    key = store_targets(store, world["nyu"], "train", world["encoders"][0].data_config)
    before = store.open_array(key).read()
    path = tmp_path / "s" / key / "c" / "0" / "0" / "0" / "0"  # (rows, H, W, 3) chunked by images
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert store.damaged_chunks(key) == [0]
    summary = repair(store)
    assert [(r.key, r.chunks) for r in summary.repaired] == [(key, [0])] and not summary.failed
    np.testing.assert_array_equal(store.open_array(key).read(), before)


def test_dense_splits_get_no_empty_class_notes(world):
    from jobs.report.data_notes import label_notes

    notes = label_notes(world["store"], [("ade20k", "train"), ("nyuv2_normals", "test")])
    assert notes == []  # their image labels are all 0 by design; the classes live in the targets
