"""Planning a run: which cells a config asks for, and every mistake refused in one line
before any work (another architecture's checkpoint, hub weights that are not cached, an
unreadable image), plus what an adapter tolerated, counted and named."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from flows.cli.main import main
from flows.tasks import extract_task
from jobs.config import load_config
from jobs.config.typed import from_plain
from jobs.report.data_notes import label_notes
from jobs.run.plan import ExtractUnit, check_plan, evaluation_cells, list_work, make_plan
from jobs.report.run_summary import build_summary, summary_lines
from pipeline.plain import to_plain
from pipeline.errors import ConfigError
from storage_schema import FeatureStore
from tests.helpers.cli import REPO, cli_env
from tests.helpers.configs import write_checkpoint


def _config(tmp_path, **changes) -> dict:
    raw = {
        "store": str(tmp_path / "store"),
        "encoders": [{"name": "r18", "arch": "resnet18", "input_size": 32, "layers": ["pre_logits", "block3"]},
                     {"name": "mnv3", "arch": "mobilenetv3_small_050", "input_size": 32}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 8, "test": 4}}}],
        "protocols": [{"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}},
                      {"name": "ridge", "protocol": "ridge", "layers": ["block3"]}],
        "report": {"path": str(tmp_path / "report.html")},
    }
    raw.update(changes)
    return raw


def test_each_protocol_runs_on_every_layer_its_encoders_extract(tmp_path):
    cells = {(c.model, c.layer, c.setting) for c in evaluation_cells(load_config(_config(tmp_path)))}
    assert cells == {("r18", "pre_logits", "knn5"), ("r18", "block3", "knn5"), ("mnv3", "pre_logits", "knn5"),
                     ("r18", "block3", "ridge")}  # a protocol's layers: only filters


def test_checkpoint_of_another_architecture_is_refused_at_config_load(tmp_path):
    for suffix in (".safetensors", ".pth"):
        path = write_checkpoint(tmp_path / "ck", "r50", seed=0, arch="resnet50")
        if suffix == ".pth":
            from safetensors.torch import load_file

            torch.save(load_file(str(path)), tmp_path / "ck" / "r50.pth")
            path = tmp_path / "ck" / "r50.pth"
        raw = _config(tmp_path)
        raw["encoders"][0]["weights"] = str(path)
        with pytest.raises(ConfigError) as info:
            check_plan(load_config(raw))
        message = str(info.value)
        assert message.startswith("config.encoders[0].weights: 'r50") and "\n" not in message
        assert "does not fit resnet18" in message and "shape mismatches" in message
    assert not (tmp_path / "store").exists()


def test_pretrained_weights_not_cached_say_how_to_give_a_local_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-torch"))
    raw = _config(tmp_path)
    raw["encoders"][1]["weights"] = "pretrained"
    with pytest.raises(ConfigError) as info:
        check_plan(load_config(raw))
    message = str(info.value)
    assert message.startswith("config.encoders[1].weights: Pretrained weights") and "never downloads" in message
    assert "`weights: /path/to/ckpt.safetensors`" in message and "EncoderSpec" not in message


@pytest.mark.slow  # four CLI processes
def test_a_config_mistake_is_one_line_before_any_work(tmp_path):
    raw = _config(tmp_path)
    raw["protocols"][0]["settings"] = {"n_neighbours": 5}
    path = tmp_path / "config.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw))
    for command in ("run", "serve", "report", "results"):
        args = ["results", "--config", str(path)] if command == "results" else [command, str(path)]
        out = subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                             env=cli_env(), cwd=REPO, timeout=300)
        assert out.returncode == 2 and out.stdout == "", (command, out.stderr)
        assert out.stderr.startswith("repeval: error: config.protocols[0]: settings.n_neighbours: unknown setting")
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "store").exists()


def test_an_unexpected_error_is_one_line_with_a_pointer_to_verbose(tmp_path, capsys):
    import numpy as np

    from jobs.extraction.import_features import import_features
    from pipeline.datasets import make_dataset

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "f.npz", train_features=rng.normal(size=(6, 3)).astype(np.float32),
             train_labels=np.arange(6) % 2, test_features=rng.normal(size=(4, 3)).astype(np.float32),
             test_labels=np.arange(4) % 2)
    store = FeatureStore(str(tmp_path / "s"))
    for split in ("train", "test"):
        import_features(store, "m", make_dataset("features", name="d", path=str(tmp_path / "f.npz")), split)
    from jobs.evaluation.evaluate import Cell, evaluate_cell

    evaluate_cell(store, Cell("m", "d", "pre_logits", "knn1", "knn", {"n_neighbors": 1}))
    code = main(["results", "--store", str(tmp_path / "s"), "--format", "csv",
                 "--output", str(tmp_path / "no-such-folder" / "r.csv")])  # pandas raises OSError
    err = capsys.readouterr().err
    assert code == 4 and err.startswith("repeval: internal error: OSError") and "run with -v" in err
    assert len(err.strip().splitlines()) == 1


def _image_folder(root, corrupt: bool) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("test", 2)):
        for cls in ("a", "b"):
            folder = root / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    if corrupt:
        (root / "train" / "a" / "broken.png").write_bytes(b"\x89PNG not really")


def _unit(tmp_path, skip_bad: bool) -> dict:
    raw = _config(tmp_path, datasets=[{"name": "mine", "adapter": "image_folder",
                                       "params": {"root": str(tmp_path / "images"), "skip_bad": skip_bad}}])
    raw["encoders"] = raw["encoders"][:1]
    return to_plain(from_plain(ExtractUnit, {"encoder": raw["encoders"][0], "dataset": raw["datasets"][0],
                                             "split": "train"}, "unit"))


def test_an_unreadable_image_names_the_file_and_suggests_skip_bad(tmp_path):
    _image_folder(tmp_path / "images", corrupt=True)
    store = {"url": str(tmp_path / "store")}
    out = extract_task.fn(store, _unit(tmp_path, skip_bad=False), to_plain(load_config(_config(tmp_path)).extract))
    assert out["status"] == "failed" and out["label"] == "r18/mine/train"
    assert out["reason"].startswith("CorruptImageError: ") and "broken.png" in out["reason"]
    assert out["reason"].endswith("set skip_bad: true in the dataset's params")


def test_images_an_adapter_left_out_are_counted_and_named(tmp_path, capsys):
    _image_folder(tmp_path / "images", corrupt=True)
    store = {"url": str(tmp_path / "store")}
    out = extract_task.fn(store, _unit(tmp_path, skip_bad=True), to_plain(load_config(_config(tmp_path)).extract))
    assert out["status"] == "extracted" and out["skipped_ids"] == ["a/broken.png"]
    lines = summary_lines(build_summary(reason="run", units=1, cells=0, extractions=[out], outcomes=[],
                                        failures=[], report=None, correlation=None, started=0.0))
    assert "data: 1 unreadable image(s) left out of mine/train: a/broken.png" in lines
    notes = label_notes(FeatureStore(store["url"], read_only=True), [("mine", "train"), ("mine", "test")])
    assert notes == [{"where": "mine/train", "what": "1 unreadable image(s) left out (skip_bad)",
                      "items": ["a/broken.png"], "kind": "skipped"}]
    assert main(["ls", "--store", store["url"]]) == 0
    listing = capsys.readouterr().out
    assert "datasets/mine/train/labels: 1 unreadable image(s) left out: a/broken.png" in listing


def test_make_plan_checks_once_and_lists_the_work(tmp_path):
    plan = make_plan(load_config(_config(tmp_path)))
    assert [u.label() for u in plan.units] == ["r18/tex/train", "r18/tex/test", "mnv3/tex/train", "mnv3/tex/test"]
    assert len(plan.cells) == 4 and not plan.checkpoint_failures
    assert not (tmp_path / "store").exists()  # no checkpoint folder: the store is not even opened


def test_the_plan_is_written_once_and_read_back_as_planned(tmp_path):
    from jobs.run.plan_store import read_plan, write_plan
    from storage_schema import record_keys

    raw = _config(tmp_path, protocols=[{"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}},
                                       {"name": "sal", "protocol": "saliency", "settings": {"n_images": 2}}])
    plan = list_work(load_config(raw))
    store = FeatureStore(raw["store"])
    key = write_plan(store, plan, ["r18"])
    assert key.startswith(record_keys.plan_key("x")[:-len("x.json")]) and write_plan(store, plan, ["r18"]) == key
    run = read_plan(store, key)  # what the flow gets: the planned config, units and cells, not re-planned
    assert to_plain(run.config) == to_plain(plan.config)
    assert run.units == plan.units and [to_plain(u) for u in run.units] == [to_plain(u) for u in plan.units]
    assert run.cells == plan.cells and {c.protocol for c in run.cells} == {"knn", "saliency"}
    weights = [c for c in run.cells if c.protocol == "saliency"]
    assert weights and all(c.encoder is not None and c.dataset_config.name == "tex" for c in weights)
    assert run.notes["new_encoders"] == ["r18"] and run.cell_memory == plan.cell_memory
    with pytest.raises(Exception, match="no run plan"):
        read_plan(store, record_keys.plan_key("0" * 32))
