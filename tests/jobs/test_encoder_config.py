"""Encoder protocols in the config and the plan: settings validated at load (one line naming
the field, no torch imported), their cells planned with the feature cells (cells of the
same type that carry the encoder's and the dataset's fields), no extraction for a dataset
only they read, and the checks that need the registries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from jobs.config import load_config
from jobs.config.protocols import settings_hash
from jobs.config.typed import from_plain
from jobs.evaluation.cell import Cell
from jobs.run.plan import check_plan, evaluation_cells, extraction_units, list_work
from pipeline.errors import ConfigError
from pipeline.protocols import get_protocol, list_protocols
from pipeline.protocols.finetune import FinetuneSettings, grid_points
from pipeline.plain import to_plain
from tests.helpers.cli import REPO, cli_env

FT = {"name": "ft", "protocol": "finetune", "settings": {"steps": 3, "lrs": [0.01, 0.1], "weight_decays": [0.0],
                                                         "augmentations": ["center_crop"]}}


def _config(tmp_path, protocols=None, **changes) -> dict:
    raw = {
        "store": str(tmp_path / "store"),
        "encoders": [{"name": "a", "arch": "test_resnet", "input_size": 32},
                     {"name": "b", "arch": "test_resnet", "input_size": 32, "seed": 1}],
        "datasets": [{"name": "tex", "adapter": "textures", "params": {"n_per_class": {"train": 8, "test": 4}}},
                     {"name": "tex2", "adapter": "textures", "params": {"n_per_class": {"train": 8, "test": 4}}}],
        "protocols": protocols if protocols is not None else [
            FT, {"name": "sal", "protocol": "saliency", "datasets": ["tex"]},
            {"name": "knn", "protocol": "knn", "datasets": ["tex2"]}],
        "report": {"path": str(tmp_path / "report.html")},
    }
    raw.update(changes)
    return raw


def _error(raw) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(raw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_settings_resolve_to_every_setting_with_the_defaults(tmp_path):
    cfg = load_config(_config(tmp_path, protocols=[{"name": "ft", "protocol": "finetune"},
                                                   {"name": "sal", "protocol": "saliency"},
                                                   {"name": "col", "protocol": "colour_detail"}]))
    ft, sal, col = cfg.protocols
    assert ft.settings == to_plain(FinetuneSettings())
    assert len(grid_points(FinetuneSettings.from_dict(ft.settings))) == 40  # 4 lr x 5 wd x 2 augmentations
    assert sal.settings["method"] == "gradient" and sal.settings["n_images"] == 64
    assert col.settings["steps"] == 500 and col.settings["perceptual"] is None


@pytest.mark.parametrize(("protocol", "settings", "fragment"), [
    ("finetune", {"stepz": 3}, "config.protocols[0]: settings.stepz: unknown setting of protocol 'finetune'; "
                               "valid settings: steps, batch_size"),
    ("finetune", {"lrs": [0.1, -1.0]}, "config.protocols[0]: settings: finetune setting lrs: every value must be a "
                                       "finite number > 0 and <= 1e+30, got -1.0"),
    ("finetune", {"lrs": ["1e-4"]}, "YAML reads 1e-4 as text, write 1.0e-4"),
    ("finetune", {"augmentations": ["mixup"]}, "unknown augmentation 'mixup'; valid choices: "
                                               "random_resized_crop_flip, center_crop"),
    ("finetune", {"steps": 0}, "steps must be an integer >= 1, got 0"),
    ("saliency", {"method": "lime"}, "saliency method 'lime' is not one of gradient, occlusion"),
    ("saliency", {"n_images": 0}, "n_images must be an integer >= 1, got 0"),
    ("colour_detail", {"lr": 0}, "inversion setting lr must be a finite number > 0, got 0"),
    ("colour_detail", {"perceptual": {"arch": "resnet18", "weights": "random"}},
     "perceptual network weights must be a local checkpoint file, got 'random'"),
    ("colour_detail", {"perceptual": {"arch": "resnet18"}}, "perceptual takes arch, weights, layers, input_size"),
])
def test_a_bad_setting_is_one_line_naming_the_entry_and_the_value(tmp_path, protocol, settings, fragment):
    assert fragment in _error(_config(tmp_path, protocols=[{"name": "x", "protocol": protocol,
                                                            "settings": settings}]))


def test_unknown_protocol_names_the_encoder_protocols_too(tmp_path):
    message = _error(_config(tmp_path, protocols=[{"name": "x", "protocol": "finetun"}]))
    assert "config.protocols[0].protocol: Unknown protocol 'finetun'. Did you mean: finetune?" in message
    assert all(name in message for name in ("knn", "saliency", "colour_detail"))


def test_an_encoder_protocol_works_at_pre_logits_only(tmp_path):
    raw = _config(tmp_path, protocols=[{**FT, "layers": ["block3"]}])
    assert "config.protocols[0].layers: protocol 'finetune' works on the encoder itself" in _error(raw)
    assert load_config(_config(tmp_path, protocols=[{**FT, "layers": ["pre_logits"]}]))


@pytest.mark.parametrize(("setting", "fragment"), [
    ({"name": "c", "protocol": "sal", "datasets": ["tex"], "metric": "attentive_diffusion"},
     "correlation.settings[0].bounded: 'attentive_diffusion' of 'saliency' is not a fraction in [0, 1]; it is "
     "read raw, without the logit transform: set bounded: false"),
    ({"name": "c", "protocol": "sal", "datasets": ["tex"], "metric": "top1"},
     "protocol 'saliency' records no metric 'top1'; its metrics: attentive_diffusion"),
    ({"name": "c", "protocol": "ft", "datasets": ["tex"], "metric": "nll", "lower_is_better": True},
     "'nll' of 'finetune' is not a fraction in [0, 1]"),
])
def test_correlation_settings_read_unbounded_metrics_raw(tmp_path, setting, fragment):
    raw = _config(tmp_path, correlation={"settings": [setting]})
    assert fragment in _error(raw)
    ok = {**setting, "bounded": False}
    if setting["metric"] != "top1":
        assert load_config(_config(tmp_path, correlation={"settings": [ok]}))
    bounded = {"name": "c", "protocol": "ft", "datasets": ["tex"], "metric": "score"}  # accuracy: logit, as always
    assert load_config(_config(tmp_path, correlation={"settings": [bounded]}))


def test_encoder_cells_are_planned_with_the_feature_cells(tmp_path):
    cfg = load_config(_config(tmp_path))
    cells = [c for c in evaluation_cells(cfg) if not c.entry.reads_features]
    assert [(c.model, c.dataset, c.layer, c.setting, c.protocol) for c in cells] == [
        ("a", "tex", "pre_logits", "ft", "finetune"), ("b", "tex", "pre_logits", "ft", "finetune"),
        ("a", "tex2", "pre_logits", "ft", "finetune"), ("b", "tex2", "pre_logits", "ft", "finetune"),
        ("a", "tex", "pre_logits", "sal", "saliency"), ("b", "tex", "pre_logits", "sal", "saliency")]
    assert {c.setting for c in evaluation_cells(cfg) if c.entry.reads_features} == {"knn"}  # no feature cell of an encoder protocol
    assert cells[0].splits() == ["train", "test"] and cells[-1].splits() == ["test"]
    assert from_plain(Cell, json.loads(json.dumps(to_plain(cells[0]))), "cell") == cells[0]  # plain values


def test_a_dataset_only_encoder_protocols_read_is_not_extracted(tmp_path):
    cfg = load_config(_config(tmp_path))  # tex: finetune + saliency only; tex2: knn too
    assert {(u.encoder.name, u.dataset.name, u.split) for u in extraction_units(cfg)} == {
        (e, "tex2", s) for e in ("a", "b") for s in ("train", "test")}
    plan = list_work(cfg)
    encoder_cells = [c for c in plan.cells if not c.entry.reads_features]
    assert len(encoder_cells) == 6 and len(plan.cells) - len(encoder_cells) == 2 and len(plan.units) == 4


def test_finetune_on_a_multi_label_dataset_is_refused_before_any_work(tmp_path):
    raw = _config(tmp_path, protocols=[FT, {"name": "sal", "protocol": "saliency"}])
    raw["datasets"] = [{"name": "voc", "adapter": "voc2007", "params": {"root": str(tmp_path / "nothing")}}]
    with pytest.raises(ConfigError, match=r"config.protocols\[0\] \(ft\): dataset 'voc' \(voc2007\) is multi-label, "
                                          r"and protocol 'finetune' needs one class per sample"):
        check_plan(load_config(raw))


def test_a_perceptual_checkpoint_path_is_relative_to_the_config_and_checked(tmp_path):
    raw = _config(tmp_path, protocols=[{"name": "col", "protocol": "colour_detail",
                                        "settings": {"perceptual": {"arch": "resnet18", "weights": "net.pt"}}}])
    path = tmp_path / "cfg" / "config.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert cfg.protocols[0].settings["perceptual"]["weights"] == str(tmp_path / "cfg" / "net.pt")
    with pytest.raises(ConfigError, match=r"config.protocols\[0\].settings.perceptual: .*net.pt"):
        check_plan(cfg)


def test_the_record_hash_ignores_settings_that_cannot_change_the_result():
    base = settings_hash("finetune", {"steps": 3})
    assert settings_hash("finetune", {"steps": 3, "num_workers": 0, "save_every": 1,
                                      "eval_batch_size": 7}) == base
    assert settings_hash("finetune", {"steps": 4}) != base
    entry = get_protocol("colour_detail")
    a = entry.result_settings(entry.resolve({"perceptual": {"arch": "resnet18", "weights": "/x/a.pt"}}))
    b = entry.result_settings(entry.resolve({"perceptual": {"arch": "resnet18", "weights": "/y/a.pt"}}))
    assert a == b  # the file's contents are in the cell's fingerprints, not its path


def test_every_encoder_protocol_declares_its_metrics_and_reads_no_torch():
    for entry in [get_protocol(n) for n in list_protocols() if get_protocol(n).reads == "weights"]:
        assert entry.metrics and set(entry.unbounded) <= set(entry.metrics)
        assert set(entry.lower_is_better) <= set(entry.metrics)
        assert entry.resolve(None) == entry.resolve({})
    code = ("import json, sys\nfrom jobs.config import load_config\nfrom jobs.run.plan import list_work\n"
            f"cfg = load_config({_config_literal()})\nlist_work(cfg)\n"
            "print(json.dumps(sorted(m for m in ('torch', 'timm', 'sklearn') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO,
                         timeout=120)
    assert json.loads(out.stdout) == []


def _config_literal() -> str:
    raw = {"store": "/tmp/never-written", "encoders": [{"name": "a", "arch": "resnet18"}],
           "datasets": [{"name": "tex", "adapter": "textures"}],
           "protocols": [FT, {"name": "sal", "protocol": "saliency"}, {"name": "col", "protocol": "colour_detail"}]}
    return repr(raw)
