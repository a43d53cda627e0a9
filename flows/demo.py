"""`make demo`: the main job on embedded defaults, from nothing to an HTML report."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from flows.runtime import prepare_environment

prepare_environment()

import yaml  # noqa: E402

from jobs.analysis.leaders import TopGroup, top_group  # noqa: E402
from jobs.run.spine import Run  # noqa: E402
from jobs.report.results import config_records  # noqa: E402

INPUT_SIZE = 32
#: The setting whose best accuracy per dataset the demo prints.
LINEAR = "linear"


@dataclass(frozen=True)
class DemoSize:
    """How much the demo trains and evaluates."""

    training: dict = field(default_factory=dict)
    source_per_class: dict = field(default_factory=dict)
    textures_per_class: dict = field(default_factory=dict)
    random_encoders: bool = True
    all_protocols: bool = True
    worker_processes: bool = True


# Two training runs, seven encoders of graded quality, about two minutes on 2 cores.
FULL = DemoSize(training={("resnet18", 0): [5, 15, 40, 100], ("resnet18", 1): [10, 25, 60]},
                source_per_class={"train": 300, "test": 100}, textures_per_class={"train": 200, "test": 100})
# The same steps at the size of a test: three trained encoders, two protocols, and the Dask
# workers as threads (two worker processes' start-up was a third of a test-sized run)
SMALL = DemoSize(training={("resnet18", 0): [2, 8], ("resnet18", 1): [4]},
                 source_per_class={"train": 40, "test": 25}, textures_per_class={"train": 30, "test": 20},
                 random_encoders=False, all_protocols=False, worker_processes=False)


def demo_dir() -> Path:
    """The demo's folder: ``$REPEVAL_DEMO_DIR``, else ``demo-out`` in the working folder."""
    return Path(os.environ.get("REPEVAL_DEMO_DIR", "demo-out")).resolve()


def demo_config(out: Path | None = None, size: DemoSize = FULL) -> dict:
    """The benchmark config the demo runs (plain data, as in a YAML file)."""
    out = demo_dir() if out is None else out
    random_encoders = [
        {"name": "resnet18-random", "arch": "resnet18", "input_size": INPUT_SIZE, "seed": 0,
         "layers": ["pre_logits", "block3"]},
        {"name": "vit-tiny-random", "arch": "vit_tiny_patch16_224", "input_size": INPUT_SIZE, "seed": 0,
         "layers": ["pre_logits", "block11.tokens"]},  # the tokens: for the attentive probe
        {"name": "mobilenet-random", "arch": "mobilenetv3_small_050", "input_size": INPUT_SIZE, "seed": 0},
    ]
    config = {
        "store": str(out / "store"),
        "dask": {"n_workers": 2, "threads_per_worker": 1, **({} if size.worker_processes else {"processes": False})},
        "extract": {"batch_size": 64, "chunk_batches": 4},
        "encoders": random_encoders if size.random_encoders else [],
        "checkpoints": [
            {"path": str(out / "checkpoints"), "arch": "resnet18", "pattern": "seed*-resnet18-*.safetensors",
             "input_size": INPUT_SIZE, "layers": ["pre_logits", "block3"],
             "settle_seconds": 0},  # written by the training above, before the run
        ],
        "datasets": [
            {"name": "digits", "adapter": "digits"},
            {"name": "textures", "adapter": "textures", "params": {"n_per_class": dict(size.textures_per_class)}},
        ],
        "protocols": [
            {"name": "linear", "protocol": "logistic"},
            {"name": "ridge-loo", "protocol": "ridge"},
            {"name": "knn20", "protocol": "knn", "settings": {"n_neighbors": 20}},
            {"name": "knn200", "protocol": "knn", "settings": {"n_neighbors": 200}},
            {"name": "knn5-euclid", "protocol": "knn",
             "settings": {"n_neighbors": 5, "metric": "euclidean", "weights": "uniform"}},
            {"name": "fewshot-5way-5shot", "protocol": "fewshot", "settings": {"n_shot": 5}, "datasets": ["digits"]},
            {"name": "fewshot-5way-20shot", "protocol": "fewshot", "settings": {"n_shot": 20}, "datasets": ["digits"]},
            {"name": "fewshot-4way-20shot", "protocol": "fewshot", "settings": {"n_way": 4, "n_shot": 20},
             "datasets": ["textures"]},
            {"name": "lowshot", "protocol": "lowshot"},
            {"name": "invariance", "protocol": "invariance", "settings": {"max_train": 600},
             "datasets": ["digits"]},
            {"name": "mlp", "protocol": "mlp", "datasets": ["digits"],
             "settings": {"hidden_units": 256, "weight_decays": [0.0, 1e-3, 1e-2], "max_epochs": 40}},
            {"name": "attentive", "protocol": "attentive", "datasets": ["digits"],
             "settings": {"num_heads": 4, "learning_rates": [1e-3, 1e-2], "weight_decays": [1e-2], "max_epochs": 30}},
        ],
        "correlation": {"settings": [
            {"name": "many-shot linear", "protocol": "linear", "datasets": ["digits", "textures"]},
            {"name": "k-NN", "protocol": "knn20", "datasets": ["digits", "textures"]},
            {"name": "few-shot", "protocol": "fewshot-5way-20shot", "datasets": ["digits"], "metric": "mean"},
        ], "bootstrap": 1000},
        "report": {"path": str(out / "report" / "report.html"),
                   "baseline": "resnet18-random" if size.random_encoders else None},
    }
    if not size.all_protocols:
        config["protocols"] = [p for p in config["protocols"] if p["name"] in (LINEAR, "knn20")]
        config["correlation"]["settings"] = [s for s in config["correlation"]["settings"]
                                             if s["protocol"] in (LINEAR, "knn20")]
    return config


def train_sources(out: Path, size: DemoSize) -> dict[str, float]:
    """Train the demo's checkpoints (once: existing files are kept)."""
    # deferred: torch and timm load in main(): Dask's worker processes (spawned) run this script's top level
    # again
    from flows.demo_sources import train_checkpoints
    from pipeline.datasets import make_dataset

    folder = out / "checkpoints"
    source = make_dataset("textures", name="source", seed=12345, n_per_class=dict(size.source_per_class))
    accuracies = {}
    for (arch, seed), steps in size.training.items():
        prefix = f"seed{seed}-"
        files = [folder / f"{prefix}{arch}-step{s:04d}.safetensors" for s in steps]
        if not all(f.exists() and f.with_suffix(".json").exists() for f in files):
            print(f"training {arch} (seed {seed}) on the source task for {max(steps)} steps ...", file=sys.stderr)
            train_checkpoints(arch, source, steps, str(folder), input_size=INPUT_SIZE, batch_size=32, seed=seed,
                              prefix=prefix)
        for f in files:
            accuracies[f.stem] = float(json.loads(f.with_suffix(".json").read_text())["reference_score"])
    return accuracies


def best_linear(cfg) -> dict[str, TopGroup]:
    """Dataset -> the top of the ``linear`` setting there: the best cell and every cell its
    test images cannot tell from it (``jobs.analysis.leaders``)."""
    # A single best layer would be a figure without the precision to back it: the demo's best
    # layers lie within a point of each other, and which one comes first moves with another
    # machine's rounding.
    store = cfg.open_store(read_only=True)
    rows, _ = config_records(store, cfg)
    groups = {dataset: top_group(store, rows, LINEAR, dataset)
              for dataset in sorted({r["dataset"] for r in rows if r["setting"] == LINEAR})}
    return {dataset: group for dataset, group in groups.items() if group is not None}


def main(small: bool | None = None) -> int:
    """Train, configure, run and print the demo's figures."""
    # deferred: Prefect and Dask load in main(): Dask's worker processes (spawned) run this script's top level
    # again
    from flows.benchmark import run_here
    small = os.environ.get("REPEVAL_DEMO_SMALL") == "1" if small is None else small
    size, out = (SMALL if small else FULL), demo_dir()
    out.mkdir(parents=True, exist_ok=True)
    sources = train_sources(out, size)
    for name, accuracy in sources.items():
        print(f"  {name}: source accuracy {accuracy:.3f}", file=sys.stderr)
    config_path = out / "demo.yaml"
    config_path.write_text(yaml.safe_dump(demo_config(out, size), sort_keys=False))
    run = Run(config_path)
    summary = run.go(run_here, answer=False)
    print(f"encoders: {len(run.listing.config.encoders)}, cells: {summary.cells} "
          f"({summary.computed} computed, {summary.cached} from the ledger), "
          f"{summary['images']} images extracted, {summary['seconds']:.0f} s")
    figures: dict = {"source_accuracy": sources, "correlation": {}, "best_linear": {}}
    for setting in (summary.correlation or {}).get("settings", []):
        if setting["status"] == "ok":
            r = setting["setting"]
            # with what they were computed from: each encoder's reference and per-dataset scores
            figures["correlation"][setting["name"]] = {
                "pearson": r["pearson"], "spearman": r["spearman"], "n": setting["n"],
                "reference_logit": setting["reference_logit"], "scores": setting["scores"], "cells": setting["cells"]}
    for line in summary.figures:  # as `repeval run` ends
        print(line)
    for dataset, group in best_linear(run.config).items():
        figures["best_linear"][dataset] = group.to_dict()
        print(f"  {group.line()}")
    for failed in summary.failures:
        print(f"  failed {failed['kind']}: {failed['label']}: {failed['reason'][:160]}")
    (out / "figures.json").write_text(json.dumps(figures, indent=1, sort_keys=True))
    print(f"config: {config_path}")
    print(f"report: {summary.report}")
    return 3 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
