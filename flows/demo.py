"""`make demo`: the main job on embedded defaults, from nothing to an HTML report.

1. trains checkpoints of two architectures for a few steps on a source task (textures
   drawn with another seed), so encoders differ in quality; their source-task accuracy
   is the reference score;
2. writes a benchmark config: those checkpoints (found by a checkpoint-folder scan) plus
   random-init timm encoders, datasets `digits` and `textures`, every protocol;
3. runs the benchmark flow (Prefect + a local Dask cluster + the Zarr store) and prints
   where the report is. Running it again reuses the store: nothing is recomputed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flows.runtime import prepare_environment

prepare_environment()

import yaml  # noqa: E402

OUT = Path(os.environ.get("REPEVAL_DEMO_DIR", "demo-out")).resolve()
SOURCE = {"adapter": "textures", "params": {"seed": 12345, "n_per_class": {"train": 300, "test": 100}}}
# (architecture, seed) -> step counts at which a checkpoint is saved (batches of 32):
# two training runs, seven encoders of graded quality, about two minutes on 2 cores.
TRAINING = {("resnet18", 0): [5, 15, 40, 100], ("resnet18", 1): [10, 25, 60]}
INPUT_SIZE = 32


def demo_config() -> dict:
    return {
        "store": str(OUT / "store"),
        "dask": {"n_workers": 2, "threads_per_worker": 1},
        "extract": {"batch_size": 64, "chunk_batches": 4},
        "encoders": [
            {"name": "resnet18-random", "arch": "resnet18", "input_size": INPUT_SIZE, "seed": 0,
             "layers": ["pre_logits", "block3"]},
            {"name": "vit-tiny-random", "arch": "vit_tiny_patch16_224", "input_size": INPUT_SIZE, "seed": 0,
             "layers": ["pre_logits", "block11.tokens"]},  # the tokens: for the attentive probe
            {"name": "mobilenet-random", "arch": "mobilenetv3_small_050", "input_size": INPUT_SIZE, "seed": 0},
        ],
        "checkpoints": [
            {"path": str(OUT / "checkpoints"), "arch": "resnet18", "pattern": "seed*-resnet18-*.safetensors",
             "input_size": INPUT_SIZE, "layers": ["pre_logits", "block3"],
             "settle_seconds": 0},  # written by the training above, before the run
        ],
        "datasets": [
            {"name": "digits", "adapter": "digits"},
            {"name": "textures", "adapter": "textures", "params": {"n_per_class": {"train": 200, "test": 100}}},
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
        "report": {"path": str(OUT / "report" / "report.html"), "baseline": "resnet18-random"},
    }


def train_sources() -> None:
    from jobs.source_training import train_checkpoints
    from pipeline.datasets import make_dataset

    source = make_dataset(SOURCE["adapter"], name="source", **SOURCE["params"])
    for (arch, seed), steps in TRAINING.items():
        prefix = f"seed{seed}-"
        if all((OUT / "checkpoints" / f"{prefix}{arch}-step{s:04d}.safetensors").exists() for s in steps):
            continue
        print(f"training {arch} (seed {seed}) on the source task for {max(steps)} steps ...", file=sys.stderr)
        for ck in train_checkpoints(arch, source, steps, str(OUT / "checkpoints"), input_size=INPUT_SIZE,
                                    batch_size=32, seed=seed, prefix=prefix):
            print(f"  {Path(ck.path).name}: source accuracy {ck.source_accuracy:.3f}", file=sys.stderr)


def main() -> int:
    from flows.benchmark import run_benchmark
    from jobs.config import load_config
    from jobs.plan import make_plan

    OUT.mkdir(parents=True, exist_ok=True)
    train_sources()
    config_path = OUT / "demo.yaml"
    config_path.write_text(yaml.safe_dump(demo_config(), sort_keys=False))
    cfg = load_config(config_path)
    plan = make_plan(cfg)
    summary = run_benchmark(cfg, plan=plan)
    print(f"encoders: {len(plan.config.encoders)}, cells: {summary['cells']} "
          f"({summary['computed']} computed, {summary['cached']} from the ledger), "
          f"{summary['images']} images extracted, {summary['seconds']:.0f} s")
    for setting in (summary.get("correlation") or {}).get("settings", []):
        if setting["status"] == "ok":
            r = setting["setting"]
            print(f"  {setting['name']}: Pearson r = {r['pearson']:.2f}, Spearman rho = {r['spearman']:.2f}, "
                  f"n = {setting['n']} encoders")
        else:
            print(f"  {setting['name']}: {setting['message']}")
    for failed in summary["failures"]:
        print(f"  failed {failed['kind']}: {failed['label']}: {failed['reason'][:160]}")
    print(f"config: {config_path}")
    print(f"report: {summary['report']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
