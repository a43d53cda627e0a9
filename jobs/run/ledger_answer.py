"""A rerun with nothing to do, answered from the store: no Prefect, no Dask, no torch.

After a run without failures, ``record_run`` notes what its results depend on besides the
config (files' sizes and times, library versions, the machine), each array's fingerprint
and every cell id; ``ledger_answer`` answers only while all of it still holds, the images
are unchanged, nothing failed and the report is there. Anything else takes the full run."""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import socket
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from jobs.analysis.correlate import figure_lines
from jobs.config.checkpoint_facts import keep_facts
from jobs.config import BenchmarkConfig
from pipeline.plain import to_plain
from jobs.evaluation.identity import recorded_cells
from jobs.run.plan import Plan, make_adapter
from jobs.report.inputs import config_failures
from pipeline.errors import RepevalError
from pipeline.protocols.registry import get_protocol
from pipeline.protocols.settings import setting_at
from storage_schema import feature_key
from storage_schema.backend import local_path, portable_path, portable_paths, store_base
from storage_schema.record_keys import run_memo_key
from storage_schema.provenance import now_iso, stable_hash

MEMO_VERSION = 2  # 2: paths relative to a local store's folder
# distributions whose versions can change what an encoder computes (random init, data config)
_LIBRARIES = ("torch", "torchvision", "timm", "safetensors", "numpy", "pillow")
_HUB = ("pretrained",)


@dataclass
class Answer:
    """A no-op rerun's answer: counts, the report and the figures of the run that made them."""

    units: int
    cells: int
    report: str
    figures: list[str] = field(default_factory=list)
    correlation: dict[str, Any] | None = None
    recorded: str = ""

    def line(self) -> str:
        """The one line a no-op rerun prints."""
        return (f"nothing to do: all {self.cells} cells and {self.units} extractions are in the ledger and the "
                f"store (run of {self.recorded}); report: {self.report}")

    def summary(self) -> dict[str, Any]:
        """The keys of a run summary (``repeval run --json``), for a run that did nothing."""
        return {"nothing_to_do": True, "units": self.units, "cells": self.cells, "extracted": 0,
                "forward_batches": 0, "images": 0, "computed": 0, "cached": self.cells, "failed": [],
                "failed_extractions": [], "failures": [], "report": self.report, "correlation": self.correlation,
                "seconds": 0.0}


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _inputs(cfg: BenchmarkConfig) -> dict[str, Any] | None:
    """What the results depend on besides the planned config; None where it cannot be read
    without torch (hub weights)."""
    files: dict[str, list[int] | None] = {}
    for e in cfg.encoders:
        if not e.extracted or e.weights == "random":
            continue
        if e.weights in _HUB or e.weights.startswith("timm:"):
            return None
        files[e.weights] = _stat(e.weights)
    if cfg.reference.csv:
        files[cfg.reference.csv] = _stat(cfg.reference.csv)
    for p in cfg.protocols:  # the local files its settings name (a perceptual network's checkpoint)
        for name in get_protocol(p.protocol).files:
            path = setting_at(p.settings, name)
            if isinstance(path, str):
                files[path] = _stat(path)
    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    machine = {"host": socket.gethostname(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
               "gpus": sorted(glob.glob("/dev/nvidia[0-9]*"))}
    return {"files": files, "versions": versions, "machine": machine}


def _observe(plan: Plan, store) -> dict[str, Any] | None:
    """The listed config's key, inputs, arrays and cell ids as the store holds them now;
    None when something is left to do or cannot be told without the full run."""
    if plan.scan.waiting or plan.scan.skipped:
        return None
    base = store_base(store)  # paths relative to a local store: a workspace moved whole keeps its note
    inputs = _inputs(plan.config)
    if inputs is None:
        return None
    arrays, labels = {}, {}
    for unit in plan.units:
        for layer in unit.encoder.layers:
            key = feature_key(unit.encoder.name, unit.dataset.name, unit.split, layer)
            st = store.status(key)
            if st is None or not st.complete:
                return None
            arrays[key] = st.fingerprint
            labels[st.attrs.get("labels")] = (unit.dataset.name, unit.split)
    found, missing = recorded_cells(store, plan.cells)
    if missing:
        return None
    if config_failures(store, plan.config, plan.cells, plan.units):
        return None
    inputs = {**inputs, "files": {portable_path(k, base): v for k, v in inputs["files"].items()}}
    return {"key": stable_hash(portable_paths(to_plain(plan.config), base), 16), "inputs": inputs, "arrays": arrays,
            "labels": labels, "plan": plan, "cells": sorted({r["cell_id"] for r in found})}


def _images_unchanged(cfg: BenchmarkConfig, store, labels: dict[str | None, tuple[str, str]]) -> bool:
    """Each extracted split's images fingerprint, listed now, is the one its labels hold
    (a dense split's per-pixel targets: the one they were made from). ``labels`` maps each
    labels (or targets) key the features name to its (dataset, split)."""
    by_name = {d.name: d for d in cfg.datasets}
    adapters: dict[str, Any] = {}
    listed: dict[tuple[str, str, bool], str] = {}
    for labels_key, (dataset, split) in labels.items():
        st = store.status(labels_key) if labels_key else None
        if st is None or not st.complete:
            return False
        if dataset not in adapters:
            adapters[dataset] = make_adapter(by_name[dataset])
        targets = st.attrs.get("kind") == "targets"
        if (dataset, split, targets) not in listed:  # one listing per split, however many arrays name it
            adapter = adapters[dataset]
            listed[dataset, split, targets] = (adapter.fingerprint if targets else adapter.labels_fingerprint)(split)
        held = st.attrs.get("dataset_fingerprint") if targets else st.fingerprint
        if listed[dataset, split, targets] != held:
            return False
    return True


def record_run(store, listing: Plan, summary: Mapping[str, Any]) -> bool:
    """After a run in which nothing failed: note what it covered, so an unchanged rerun is
    answered from the ledger. Returns whether a note was written."""
    if summary.get("failures") or not summary.get("report"):
        return False
    seen = _observe(listing, store)
    if seen is None:
        return False
    memo = {"version": MEMO_VERSION, "inputs": seen["inputs"], "arrays": seen["arrays"], "cells": seen["cells"],
            "units": len(seen["plan"].units), "n_cells": len(seen["plan"].cells),
            "report": portable_path(summary["report"], store_base(store)),
            "figures": figure_lines(summary.get("correlation")), "correlation": summary.get("correlation"),
            "recorded": now_iso()}
    store.check_writable()
    store.backend.write_atomic(run_memo_key(seen["key"]), json.dumps(memo, default=str).encode())
    if listing.config.checkpoints:  # the folders' steps and fingerprints: the rerun scans them without a read
        keep_facts(store, {})
    return True


def ledger_answer(store, listing: Plan) -> Answer | None:
    """The answer of a rerun with nothing to do, or None (the full run decides)."""
    if store is None:
        return None
    try:
        seen = _observe(listing, store)
    except (RepevalError, OSError):  # no store yet, or a state the full run's checks explain
        return None
    if seen is None:
        return None
    raw = store.backend.read(run_memo_key(seen["key"]))
    memo = json.loads(raw) if raw is not None else None
    if not memo or memo.get("version") != MEMO_VERSION or memo.get("inputs") != json.loads(
            json.dumps(seen["inputs"])):
        return None
    if memo.get("arrays") != seen["arrays"] or memo.get("cells") != seen["cells"]:
        return None
    report = local_path(str(memo.get("report") or ""), store_base(store))
    if not os.path.isfile(report) or not _images_unchanged(seen["plan"].config, store,
                                                                              seen["labels"]):
        return None
    return Answer(units=memo["units"], cells=memo["n_cells"], report=report,
                  figures=list(memo.get("figures") or []), correlation=memo.get("correlation"),
                  recorded=str(memo.get("recorded", ""))[:19])
