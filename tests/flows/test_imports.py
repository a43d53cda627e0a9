"""The command line answers fast: reading a config, planning, listing results and starting
the CLI import no numerical or orchestration library (torch, timm, scikit-learn,
matplotlib, Prefect, Dask); those load only where a forward pass, a fit, a plot or a run
happens. (The seconds are measured by benchmarks/bench_cli.py, never asserted here.)"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.cli import REPO, cli_env

HEAVY = ("torch", "timm", "torchvision", "sklearn", "matplotlib", "prefect", "dask", "scipy", "pandas")
LIGHT = ("flows.cli", "jobs.config", "jobs.run.plan", "jobs.report.results", "jobs.report.inputs", "jobs.report.run_summary",
         "jobs.run.changes", "jobs.config.checkpoint_folders", "storage_schema.ledger", "flows.cli.compare", "jobs.analysis.compare",
         "jobs.analysis.series", "jobs.report.events", "storage_schema.evidence")


def test_cli_and_config_modules_import_no_heavy_library():
    code = (f"import importlib, json, sys\nfor m in {LIGHT!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(h for h in {HEAVY!r} if h in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO,
                         timeout=120, check=True)
    assert json.loads(out.stdout) == []


def test_the_step_of_a_safetensors_checkpoint_is_read_without_torch(tmp_path):
    """A scheduled scan of a checkpoint folder (a flow run's process of its own, every few
    seconds or nightly) reads each safetensors file's step from its header: no torch."""
    code = ("import json, sys\nimport numpy as np\nfrom safetensors.numpy import save_file\n"
            "from pipeline.analysis.series.steps import read_step_metadata\n"
            f"path = {str(tmp_path / 'ck.safetensors')!r}\n"
            "save_file({'w': np.zeros(3, np.float32)}, path, metadata={'step': '1200'})\n"
            "print(json.dumps([read_step_metadata(path), sorted(h for h in ('torch', 'timm') if h in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO,
                         timeout=120, check=True)
    assert json.loads(out.stdout) == [[1200, "step"], []]
