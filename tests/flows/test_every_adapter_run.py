"""Every registered dataset adapter, and every dense protocol on every dense adapter it fits,
end to end through `repeval run`: a tiny copy in its publisher's layout
(tests/helpers/adapter_copies.py), the real flow (Prefect API, Dask, Zarr store, a random-init
timm encoder), a record per cell, `repeval datasets show` exit 0, and a no-op rerun answered
from the ledger.

The cases are generated from the adapter and protocol registries: an adapter registered
without a case here fails a test that names it. One run holds every image adapter (one flow,
one encoder) and a second the imported `features`, so the module costs two runs and their
reruns, not one per adapter.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from flows.cli.main import main
from pipeline.datasets import list_datasets
from pipeline.datasets.registry import adapter_class
from pipeline.protocols.registry import get_protocol, list_protocols
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from tests.helpers.adapter_copies import COPIES

ENCODER = {"name": "enc", "arch": "test_resnet", "input_size": 32, "seed": 0, "layers": ["pre_logits", "block1.map"]}
# the readout each image adapter is run with: k-NN for single-label classification, the
# logistic probe for multi-label (k-NN takes one label per image), every dense protocol whose
# task is the adapter's
READOUTS = {
    "knn": {"protocol": "knn", "settings": {"n_neighbors": 1}},
    "logistic": {"protocol": "logistic", "settings": {"Cs": [0.1, 1.0], "val_fraction": 0.4}},
    "segmentation": {"protocol": "segmentation", "settings": {"learning_rates": [1.0], "epochs": 1, "batch_size": 2,
                                                             "device": "cpu"}},
    "normals": {"protocol": "normals", "settings": {"head": "linear", "learning_rate": 0.5, "epochs": 1,
                                                   "batch_size": 2, "device": "cpu"}},
}
# adapters a config cannot extract (no images): imported with `repeval import-features`
IMPORTED = {"features"}
# datasets whose split roles a config names (a copy with a val split but no test split)
SPLITS = {"imagenet": {"test_split": "val"}}


def dense_protocols() -> dict[str, list[str]]:
    """Dense task -> the registered protocols reading it."""
    out: dict[str, list[str]] = {}
    for name in list_protocols():
        task = get_protocol(name).dense
        if task:
            out.setdefault(task, []).append(name)
    return out


def readouts_for(adapter: str) -> list[str]:
    cls = adapter_class(adapter)
    task = getattr(cls, "dense_task", None)
    if task:
        return dense_protocols()[task]
    return ["logistic"] if getattr(cls, "multi_label", False) else ["knn"]


def _dataset_name(adapter: str) -> str:
    return adapter.replace("_", "-")


def _cli(args: list[str]) -> tuple[int, str, str]:
    """``repeval ARGS``: exit code, stdout, stderr (a module fixture has no capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def _run(config: dict, path: Path) -> dict:
    """The run's summary; a failed cell is left to the test of its adapter, which names it."""
    path.write_text(yaml.safe_dump(config))
    code, out, err = _cli(["run", str(path), "--json"])
    assert code in (0, 3) and out.strip(), err
    return {**json.loads(out.strip().splitlines()[-1]), "stderr": err}


@dataclass
class Case:
    config: Path
    store: str
    dataset: str
    readouts: list[str]
    first: dict
    again: dict


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prefect_harness) -> dict[str, Case]:
    """Both runs and their no-op reruns, per adapter."""
    tmp = tmp_path_factory.mktemp("adapters")
    images = [a for a in list_datasets() if a in COPIES and a not in IMPORTED]
    datasets, protocols = [], {}
    for adapter in images:
        entry = {"name": _dataset_name(adapter), "adapter": adapter, "params": COPIES[adapter](tmp / adapter),
                 **SPLITS.get(adapter, {})}
        datasets.append(entry)
        for readout in readouts_for(adapter):
            protocols.setdefault(readout, []).append(entry["name"])
    config = {
        "store": str(tmp / "store"),
        "dask": {"n_workers": 1, "processes": False},
        "extract": {"batch_size": 8, "chunk_batches": 1},
        "encoders": [ENCODER],
        "datasets": datasets,
        "protocols": [{"name": r, **READOUTS[r], "datasets": names,
                       "layers": ["block1.map" if get_protocol(READOUTS[r]["protocol"]).dense else "pre_logits"]}
                      for r, names in protocols.items()],
        "report": {"path": str(tmp / "report.html")},
    }
    path = tmp / "images.yaml"
    first = _run(config, path)
    again = _run(config, path)
    out = {a: Case(path, config["store"], _dataset_name(a), readouts_for(a), first, again) for a in images}

    for adapter in sorted(IMPORTED & set(COPIES)):
        store, name = str(tmp / f"{adapter}-store"), _dataset_name(adapter)
        params = COPIES[adapter](tmp / adapter)
        code, _, err = _cli(["import-features", "--store", store, "--model", "lab", "--path", params["path"],
                             "--dataset-name", name])
        assert code == 0, err
        imported = {"store": store, "dask": {"n_workers": 1, "processes": False},
                    "encoders": [{"name": "lab", "source": "store"}],
                    "datasets": [{"name": name, "adapter": adapter, "params": params}],
                    "protocols": [{"name": "knn", **READOUTS["knn"]}],
                    "report": {"path": str(tmp / f"{adapter}.html")}}
        path = tmp / f"{adapter}.yaml"
        out[adapter] = Case(path, store, name, ["knn"], _run(imported, path), _run(imported, path))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("adapter", list_datasets())
def test_adapter_runs_end_to_end(adapter: str, runs: dict[str, Case]) -> None:
    assert adapter in COPIES, (f"the dataset adapter {adapter!r} has no tiny copy in tests/helpers/adapter_copies.py: "
                               "every adapter runs end to end in the suite")
    assert adapter in runs, f"the dataset adapter {adapter!r} was not run end to end"
    case = runs[adapter]
    failures = [f for f in case.first["failures"] if f"/{case.dataset}/" in json.dumps(f)]
    assert not failures, failures
    records = [r for r in Ledger(FeatureStore(case.store, read_only=True)) if r["dataset"] == case.dataset]
    assert sorted(r["setting"] for r in records) == sorted(case.readouts)  # a record per cell
    for rec in records:
        assert rec["metrics"]["score"] == rec["metrics"]["score"], rec  # not NaN
    # the no-op rerun is the ledger's one-line answer, not a second flow
    assert case.again.get("nothing_to_do") is True and case.again["computed"] == 0, case.again
    if adapter not in IMPORTED:  # `datasets show` reads the same copy as the run did
        entry = next(d for d in yaml.safe_load(case.config.read_text())["datasets"] if d["name"] == case.dataset)
        params = [f"--param={k}={json.dumps(v)}" for k, v in entry["params"].items()]
        code, out, err = _cli(["datasets", "show", adapter, *params, "--json"])
        assert code == 0, err


def test_every_dense_protocol_meets_every_dense_adapter_of_its_task() -> None:
    tasks = dense_protocols()
    dense = [a for a in list_datasets() if getattr(adapter_class(a), "dense_task", None)]
    pairs = {(p, a) for a in dense for p in readouts_for(a)}
    assert pairs == {(p, a) for a in dense for p in tasks[adapter_class(a).dense_task]}
    assert {p for p, _ in pairs} == set(tasks)  # no dense protocol without an adapter to run on
    assert set(tasks) <= set(READOUTS)
