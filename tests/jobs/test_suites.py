"""`suite:` configs expand to the published datasets, protocols and correlation settings;
multi-label datasets are refused at config load by protocols that cannot take them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jobs.config import load_config
from jobs.run.plan import check_plan, evaluation_cells, extraction_units
from jobs.config.suites import CD_FSL, FEW_SHOT, MANY_SHOT
from pipeline.errors import ConfigError
from tests.pipeline.datasets.layouts_more import LAYOUTS

ENCODERS = [{"name": "r18", "arch": "resnet18", "input_size": 32}]


def _config(suite: dict, **extra) -> dict:
    return {"store": "store", "encoders": ENCODERS, "suite": suite, **extra}


def _roots(names, prefix="/data") -> dict:
    return {n: f"{prefix}/{n}" for n in names}


def test_many_shot_suite_expands_to_the_published_settings() -> None:
    cfg = load_config(_config({"name": "many-shot", "roots": _roots(MANY_SHOT)}))
    by_name = {d.name: d for d in cfg.datasets}
    assert list(by_name) == list(MANY_SHOT) and all(d.adapter == d.name for d in cfg.datasets)
    assert by_name["aircraft"].val_split == "val" and by_name["flowers102"].val_split == "val"
    assert by_name["dtd"].val_split == "val" and by_name["voc2007"].val_split == "val"
    assert by_name["pets"].val_split is None and by_name["cifar10"].val_split is None  # 20 % of train
    assert by_name["cars"].params == {"root": "/data/cars"}
    [linear] = cfg.protocols
    assert (linear.name, linear.protocol, linear.datasets) == ("linear", "logistic", list(MANY_SHOT))
    [corr] = cfg.correlation.settings
    assert (corr.protocol, corr.datasets, corr.metric) == ("linear", list(MANY_SHOT), "score")


def test_few_shot_suite_draws_episodes_from_pooled_splits() -> None:
    cfg = load_config(_config({"name": "few-shot", "roots": _roots(FEW_SHOT), "layers": ["pre_logits"]}))
    assert [d.name for d in cfg.datasets] == list(FEW_SHOT) and len(FEW_SHOT) == 14
    assert "voc2007" not in FEW_SHOT and set(CD_FSL) <= set(FEW_SHOT)
    for d in cfg.datasets:
        assert d.train_split == d.test_split == "all" and d.splits() == ["all"]
    assert [(p.name, p.settings["n_shot"], p.settings["pool"]) for p in cfg.protocols] == [
        ("fewshot5", 5, "test"), ("fewshot20", 20, "test"), ("fewshot50", 50, "test")]
    assert all(p.settings["n_way"] == 5 and p.settings["n_query"] == 15 and p.settings["n_episodes"] == 600
               for p in cfg.protocols)
    assert [(s.name, s.protocol) for s in cfg.correlation.settings] == [
        ("few-shot-fewshot5", "fewshot5"), ("few-shot-fewshot20", "fewshot20"), ("few-shot-fewshot50", "fewshot50")]
    # one extraction unit per dataset (the pooled split once), 3 cells per dataset
    assert len(extraction_units(cfg)) == 14 and len(evaluation_cells(cfg)) == 42


def test_suite_keeps_the_configs_own_entries(tmp_path: Path) -> None:
    raw = _config({"name": "many-shot", "roots": {**_roots(MANY_SHOT[:-1]), "voc2007": "voc"},
                   "skip": [], "params": {"caltech101": {"seed": 3}}},
                  datasets=[{"name": "mine", "adapter": "textures"}],
                  protocols=[{"name": "knn20", "protocol": "knn", "datasets": ["mine"]}],
                  correlation={"settings": [{"name": "own", "protocol": "knn20", "datasets": ["mine"]}]})
    path = tmp_path / "cfg" / "config.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert [d.name for d in cfg.datasets][0] == "mine" and len(cfg.datasets) == 12
    assert [p.name for p in cfg.protocols] == ["knn20", "linear"]
    assert [s.name for s in cfg.correlation.settings] == ["own"]
    by_name = {d.name: d for d in cfg.datasets}
    assert by_name["voc2007"].params["root"] == str(tmp_path / "cfg" / "voc")  # relative to the config file
    assert by_name["caltech101"].params == {"root": "/data/caltech101", "seed": 3}


@pytest.mark.parametrize("suite, match", [
    ({"name": "many-shots", "roots": {}}, "unknown suite 'many-shots'; suites: many-shot, few-shot"),
    ({"name": "many-shot", "roots": _roots(MANY_SHOT[:-2])}, "no root for sun397, voc2007"),
    ({"name": "few-shot", "roots": _roots(FEW_SHOT + ("voc2007",))}, "'voc2007' is not a dataset of suite 'few-shot'"),
    ({"name": "many-shot", "roots": _roots(MANY_SHOT), "extra": 1}, "suite.extra: unknown field"),
    ({"name": "many-shot", "roots": _roots(MANY_SHOT), "skip": list(MANY_SHOT)}, "leaves no dataset"),
    ({"name": "many-shot", "roots": _roots(MANY_SHOT), "params": {"dtd": {"root": "x"}}}, "other than root"),
    ("many-shot", "expected a mapping"),
])
def test_bad_suite_blocks_are_named(suite, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(_config(suite))


def test_skip_and_name_clash() -> None:
    cfg = load_config(_config({"name": "many-shot", "roots": _roots(MANY_SHOT[:-1]), "skip": ["voc2007"]}))
    assert "voc2007" not in [d.name for d in cfg.datasets]
    with pytest.raises(ConfigError, match="'dtd' is also a name the suite"):
        load_config(_config({"name": "many-shot", "roots": _roots(MANY_SHOT)},
                            datasets=[{"name": "dtd", "adapter": "textures"}]))


@pytest.mark.parametrize("protocol", ["knn", "fewshot", "lowshot"])  # logistic and ridge take it
def test_single_label_protocols_refuse_multilabel_data_at_config_load(protocol: str, tmp_path: Path) -> None:
    cfg = load_config({"store": str(tmp_path / "s"), "encoders": ENCODERS,
                       "datasets": [{"name": "voc", "adapter": "voc2007", "params": {"root": "/not/read"}}],
                       "protocols": [{"name": "p", "protocol": protocol}]})
    with pytest.raises(ConfigError, match=r"protocols\[0\] \(p\): dataset 'voc' \(voc2007\) is multi-label"):
        check_plan(cfg)  # before the adapter is built: its root does not exist


@pytest.mark.parametrize("suite", ["many-shot", "few-shot"])
def test_suites_plan_over_tiny_copies(suite: str, tmp_path: Path) -> None:
    """Every dataset of the suite built tiny in its publisher's layout; the plan reads them all."""
    members = MANY_SHOT if suite == "many-shot" else FEW_SHOT
    roots = {name: str(LAYOUTS[name](tmp_path / name).root) for name in members}
    params = {"caltech101": {"train_per_class": 3}}
    cfg = load_config(_config({"name": suite, "roots": roots, "params": params}))
    check_plan(cfg)
