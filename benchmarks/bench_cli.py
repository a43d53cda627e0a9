"""How fast the command line answers, on a demo-like store of 200 evaluated cells.

The store is built in this process without the demo's training and extraction (minutes):
10 encoders' features (64-d, 10 classes, 2 datasets) are imported, then 10 protocol
settings like the demo's (ridge, logistic, four k-NN, two few-shot, low-shot) are
evaluated on each, 200 ledger records in all, with two correlation settings. Each
command then runs as users type it, in a fresh process, timed from start to exit:

* ``repeval results --store S``: the ledger, latest record per cell;
* ``repeval results --config C``: the config's current settings under its names;
* config errors: ``repeval run`` on a config with a field of the wrong type, and with a
  misspelled protocol setting (which needs the protocol registry's settings);
* ``repeval run R`` with nothing to do: R names the same 200 cells (its encoders
  ``source: store``), run once while building; the rerun is answered from the ledger;
* ``repeval report C``: 200 cells, accuracy tables, low-shot plots, correlation scatters;
* a nightly scan of an unchanged folder of 50 checkpoints (the schedules' state recorded
  as a finished scan leaves it): in a fresh process, ``jobs.run.spine.Run`` made as
  scheduled and asked what changed (config loaded, store opened, folder listed once), and
  ``flows.schedules.scan_checkpoints_flow`` itself on an embedded Prefect API already
  started (serve's case: its server runs).

Beside each: whether the process imported torch, and a bare ``python -c pass`` start
for reference. Targets (issues): results, a config error and the no-op rerun under 2 s,
the scan of 50 unchanged checkpoints under 3 s, the report under 5 s.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_cli.py [--repeats 3] [--root DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ROOT, machine_line, median  # noqa: E402

N_ENCODERS, DATASETS = 10, ("blobs-a", "blobs-b")
SETTINGS = [
    {"name": "linear", "protocol": "ridge"},
    {"name": "logistic", "protocol": "logistic", "settings": {"Cs": [0.1, 1.0]}},
    {"name": "knn5", "protocol": "knn", "settings": {"n_neighbors": 5}},
    {"name": "knn20", "protocol": "knn", "settings": {"n_neighbors": 20}},
    {"name": "knn50", "protocol": "knn", "settings": {"n_neighbors": 50}},
    {"name": "knn5-euclid", "protocol": "knn", "settings": {"n_neighbors": 5, "metric": "euclidean",
                                                            "weights": "uniform"}},
    {"name": "fewshot-5way-5shot", "protocol": "fewshot", "settings": {"n_shot": 5, "n_episodes": 100}},
    {"name": "fewshot-4way-10shot", "protocol": "fewshot", "settings": {"n_way": 4, "n_shot": 10,
                                                                         "n_episodes": 100}},
    {"name": "lowshot", "protocol": "lowshot", "settings": {"shots": [1, 4, 16, "all"], "n_seeds": 2}},
    {"name": "ridge-a1", "protocol": "ridge", "settings": {"alphas": [1.0]}},
]


def build(root: Path) -> Path:
    """The store and config (once; a second call reuses them)."""
    import numpy as np
    import yaml

    config = root / "config.yaml"
    if config.exists():
        return config
    from jobs.config import load_config
    from jobs.evaluation.evaluate import evaluate_cell
    from jobs.extraction.import_features import import_features
    from jobs.run.plan import evaluation_cells
    from pipeline.datasets import make_dataset
    from storage_schema import FeatureStore

    encoders = [f"enc{i:02d}" for i in range(N_ENCODERS)]
    store = FeatureStore(str(root / "store"))
    rng = np.random.default_rng(0)
    for d in DATASETS:
        centers = rng.normal(size=(10, 64))
        for i, m in enumerate(encoders):  # better encoders: tighter classes
            arrays = {}
            for split, n in (("train", 300), ("test", 100)):
                y = np.arange(n) % 10
                X = centers[y] + rng.normal(scale=2.5 - 0.2 * i, size=(n, 64))
                arrays[f"{split}_features"], arrays[f"{split}_labels"] = X.astype(np.float32), y
            path = root / f"{m}-{d}.npz"
            np.savez(path, **arrays)
            for split in ("train", "test"):
                import_features(store, m, make_dataset("features", name=d, path=str(path)), split)
    raw = {
        "store": str(root / "store"),
        "encoders": [{"name": m, "arch": "resnet18"} for m in encoders],
        "datasets": [{"name": d, "adapter": "features", "params": {"path": str(root / f"enc00-{d}.npz")}}
                     for d in DATASETS],
        "protocols": SETTINGS,
        "reference": {"scores": {m: 0.5 + 0.04 * i for i, m in enumerate(encoders)}},
        "correlation": {"settings": [{"name": "linear", "protocol": "linear", "datasets": list(DATASETS)},
                                     {"name": "k-NN", "protocol": "knn20", "datasets": list(DATASETS)}],
                        "bootstrap": 1000},
        "report": {"path": str(root / "report" / "report.html"), "baseline": encoders[0]},
    }
    config.write_text(yaml.safe_dump(raw))
    cells = evaluation_cells(load_config(config))
    for n, cell in enumerate(cells, 1):
        evaluate_cell(store, cell)
        if n % 50 == 0:
            print(f"building the store: {n}/{len(cells)} cells", file=sys.stderr, flush=True)
    bad = dict(raw, protocols=[dict(SETTINGS[2], settings={"n_neighbours": 5})] + SETTINGS[3:])
    (root / "bad.yaml").write_text(yaml.safe_dump(bad))
    typo = dict(raw, encoders=[dict(raw["encoders"][0], seed="zero")] + raw["encoders"][1:])
    (root / "typo.yaml").write_text(yaml.safe_dump(typo))
    stored = dict(raw, encoders=[{"name": m, "source": "store"} for m in encoders], dask={"n_workers": 1})
    (root / "run.yaml").write_text(yaml.safe_dump(stored))
    print("building the store: one full `repeval run` of run.yaml (every cell from the ledger)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "flows.cli", "run", str(root / "run.yaml")], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1"), stdout=subprocess.DEVNULL)
    return config


PROBE = "import runpy, sys; sys.argv = ['repeval'] + {args!r}; code = 0\n" \
        "try:\n    runpy.run_module('flows.cli', run_name='__main__')\n" \
        "except SystemExit as e:\n    code = e.code\n" \
        "print('TORCH=' + str('torch' in sys.modules), file=sys.stderr); sys.exit(code)"


def time_command(args: list[str], repeats: int) -> tuple[float, bool, int]:
    """Median wall seconds of ``repeval <args>`` in fresh processes; whether torch was imported."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    times, torch_seen, code = [], False, 0
    for _ in range(repeats):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True,
                             env=env, cwd=ROOT)
        times.append(time.perf_counter() - t)
        torch_seen = "TORCH=True" in out.stderr
        code = out.returncode
    return median(times), torch_seen, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", help="keep the store here (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="repeval-bench-cli-"))
    root.mkdir(parents=True, exist_ok=True)
    config = build(root)
    print(machine_line())
    bare = median([_bare() for _ in range(args.repeats)])
    rows = [
        ("results --store", ["results", "--store", str(root / "store")], 2.0),
        ("results --config", ["results", "--config", str(config)], 2.0),
        ("config error: a field's type (run)", ["run", str(root / "typo.yaml")], 2.0),
        ("config error: a protocol setting (run)", ["run", str(root / "bad.yaml")], 2.0),
        ("run with nothing to do, 200 cells", ["run", str(root / "run.yaml")], 2.0),
        ("report, 200 cells", ["report", str(config)], 5.0),
    ]
    print(f"python -c pass: {bare:.2f} s (interpreter start, for reference)")
    registry = median([_bare("import pipeline.protocols.registry") for _ in range(args.repeats)])
    print(f"python -c 'import pipeline.protocols.registry': {registry:.2f} s (the settings of every protocol; "
          "reading a config's protocols needs it)")
    print("| command | seconds | target | imports torch | exit code |")
    print("|---|---|---|---|---|")
    results = {}
    for label, cli_args, target in rows:
        seconds, torch_seen, code = time_command(cli_args, args.repeats)
        results[label] = seconds
        verdict = "met" if seconds < target else "**missed**"
        print(f"| `repeval {' '.join(a if '/' not in a else Path(a).name for a in cli_args)}` | {seconds:.2f} | "
              f"< {target:g} s: {verdict} | {'yes' if torch_seen else 'no'} | {code} |")
    scans = scan_folder(root, args.repeats)
    for label, (seconds, target) in scans.items():
        results[label] = seconds
        print(f"| {label} | {seconds:.2f} | < {target:g} s: {'met' if seconds < target else '**missed**'} | - | 0 |")
    print(json.dumps({"bare_python_s": bare, "registry_import_s": registry, **results}))
    return 0


N_CHECKPOINTS = 50
SCAN_PROBE = ("import time; t = time.perf_counter()\n"
              "from jobs.run.spine import Run\n"
              "changes = Run({config!r}, scheduled=True).changes()\n"
              "assert not changes.any, changes\n"
              "print(time.perf_counter() - t)")


def scan_folder(root: Path, repeats: int) -> dict[str, tuple[float, float]]:
    """The nightly scan of an unchanged folder of ``N_CHECKPOINTS`` checkpoints, as the
    schedules' state left by a finished scan makes it (nothing new: nothing runs)."""
    import torch
    import yaml

    folder = root / "checkpoints"
    if not folder.is_dir():
        folder.mkdir()
        import timm

        for step in range(1, N_CHECKPOINTS + 1):  # small files: the scan reads names, sizes and times only
            torch.manual_seed(step)
            model = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=0)
            torch.save({"model": model.state_dict(), "epoch": step}, folder / f"checkpoint{step:04d}.pth")
    raw = yaml.safe_load((root / "config.yaml").read_text())
    raw = dict(raw, store=str(root / "scan-store"), encoders=[],
               checkpoints=[{"path": str(folder), "arch": "mobilenetv3_small_050", "input_size": 32,
                             "settle_seconds": 0, "pattern": "*.pth"}])
    config = root / "scan.yaml"
    config.write_text(yaml.safe_dump(raw))
    from jobs.run.changes import save_state
    from jobs.run.spine import Run

    run = Run(config, scheduled=True)  # as the last scan recorded it
    assert len(run.listing.config.encoders) == N_CHECKPOINTS
    save_state(run.store(writable=True), run.listing.config, run.watch_key, files=run.listing.scan.signatures())
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    fresh = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", SCAN_PROBE.format(config=str(config))], check=True, env=env, cwd=ROOT,
                       capture_output=True)
        fresh.append(time.perf_counter() - t)
    out = {f"scan of {N_CHECKPOINTS} unchanged checkpoints, fresh process (Run + changes)": (median(fresh), 3.0)}
    from flows.runtime import prefect_api
    from flows.schedules import scan_checkpoints_flow

    with prefect_api():
        scan_checkpoints_flow(str(config))  # the flow's first run pays Prefect's own warm-up
        flows = []
        for _ in range(repeats):
            t = time.perf_counter()
            assert scan_checkpoints_flow(str(config)) == {"ran": False, "new_encoders": []}
            flows.append(time.perf_counter() - t)
    out[f"scan of {N_CHECKPOINTS} unchanged checkpoints, the scan flow on a running Prefect API"] = (median(flows),
                                                                                                     3.0)
    return out


def _bare(code: str = "pass") -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
