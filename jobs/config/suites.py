"""Benchmark suites: one config entry standing for the datasets, protocols and correlation
settings of a published evaluation (Ericsson et al. 2021, after Kornblith et al. 2019)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

MANY_SHOT = ("aircraft", "caltech101", "cars", "cifar10", "cifar100", "dtd", "flowers102", "food101", "pets",
             "sun397", "voc2007")
CD_FSL = ("cropdiseases", "eurosat", "isic2018", "chestx")
FEW_SHOT = tuple(d for d in MANY_SHOT if d != "voc2007") + CD_FSL
FEW_SHOTS = (5, 20, 50)
SUITES = {"many-shot": MANY_SHOT, "few-shot": FEW_SHOT}
_KEYS = ("name", "roots", "params", "skip", "layers")


def suite_datasets(name: str) -> tuple[str, ...]:
    """The dataset adapters of suite ``name``."""
    if name not in SUITES:
        raise ConfigError(f"config.suite.name: unknown suite {name!r}; suites: {', '.join(SUITES)}")
    return SUITES[name]


def _dataset_entry(adapter: str, params: dict[str, Any], pooled: bool) -> dict[str, Any]:
    # deferred: the dataset adapters and PIL load only when a suite is expanded
    from pipeline.datasets import adapter_class

    cls = adapter_class(adapter)  # class attributes only: no file is read here
    if pooled:  # few-shot episodes draw from every image of the dataset
        return {"name": adapter, "adapter": adapter, "params": params, "train_split": cls.pooled_split,
                "test_split": cls.pooled_split}
    return {"name": adapter, "adapter": adapter, "params": params, "train_split": cls.train_split,
            "val_split": cls.val_split, "test_split": cls.test_split}


def _check_block(block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise ConfigError(f"config.suite: expected a mapping with {', '.join(_KEYS)}, got {block!r} "
                          "(e.g. suite: {name: many-shot, roots: {aircraft: /data/fgvc-aircraft-2013b, ...}})")
    unknown = sorted(set(block) - set(_KEYS))
    if unknown:
        raise ConfigError(f"config.suite.{unknown[0]}: unknown field; valid fields: {', '.join(_KEYS)}")
    for key in ("roots", "params"):
        if not isinstance(block.get(key, {}), dict):
            raise ConfigError(f"config.suite.{key}: expected a mapping from dataset to value")
    for key in ("skip", "layers"):
        if not isinstance(block.get(key, []), list):
            raise ConfigError(f"config.suite.{key}: expected a list")
    return block


def expand_suite(data: Any, base: Path) -> Any:
    """``data`` with its ``suite`` block replaced by the entries it stands for."""
    if not isinstance(data, dict) or "suite" not in data:
        return data
    block = _check_block(data["suite"])
    name = block.get("name")
    members = suite_datasets(name)
    skip, roots, params = block.get("skip", []), block.get("roots", {}), block.get("params", {})
    for where, names in (("skip", skip), ("roots", list(roots)), ("params", list(params))):
        strangers = [n for n in names if n not in members]
        if strangers:
            raise ConfigError(f"config.suite.{where}: {strangers[0]!r} is not a dataset of suite {name!r}; its "
                              f"datasets: {', '.join(members)}")
    chosen = [d for d in members if d not in skip]
    missing = [d for d in chosen if d not in roots]
    if missing:
        raise ConfigError(f"config.suite.roots: no root for {', '.join(missing)} (suite {name!r} needs one per "
                          "dataset; leave a dataset out with suite.skip)")
    if not chosen:
        raise ConfigError(f"config.suite.skip: leaves no dataset of suite {name!r}")
    out = {k: v for k, v in data.items() if k != "suite"}
    datasets = []
    for d in chosen:
        root = Path(str(roots[d])).expanduser()
        extra = params.get(d, {})
        if not isinstance(extra, dict) or "root" in extra:
            raise ConfigError(f"config.suite.params.{d}: expected a mapping of adapter parameters other than root")
        full = {"root": str(root if root.is_absolute() else (base / root).resolve()), **extra}
        datasets.append(_dataset_entry(d, full, pooled=name == "few-shot"))
    layers = block.get("layers") or ["pre_logits"]
    if name == "many-shot":
        protocols = [{"name": "linear", "protocol": "logistic", "layers": layers, "datasets": chosen}]
    else:
        protocols = [{"name": f"fewshot{k}", "protocol": "fewshot", "layers": layers, "datasets": chosen,
                      "settings": {"n_way": 5, "n_shot": k, "n_query": 15, "n_episodes": 600, "pool": "test"}}
                     for k in FEW_SHOTS]
    for key, new in (("datasets", datasets), ("protocols", protocols)):
        own = list(out.get(key) or [])
        clash = {e.get("name") for e in own if isinstance(e, dict)} & {e["name"] for e in new}
        if clash:
            raise ConfigError(f"config.{key}: {sorted(clash)[0]!r} is also a name the suite {name!r} defines")
        out[key] = own + new
    correlation = dict(out.get("correlation") or {})
    if not correlation.get("settings"):
        correlation["settings"] = [
            {"name": f"{name}-{p['name']}" if name == "few-shot" else "many-shot-linear", "protocol": p["name"],
             "datasets": chosen, "metric": "score", "layer": layers[0]} for p in protocols]
        out["correlation"] = correlation
    return out
