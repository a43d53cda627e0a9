"""A small checkpoint series' report, built in seconds on a real store: digits pixels as the
features of checkpoints ``ck-step<N>`` of one scanned folder (more noise, lower accuracy),
their cells evaluated and the report written as a run writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from tests.helpers.evidence import DATASET, SETTINGS, noisy_encoders

#: step -> noise of the default series: the best at step 400, the newest (600) much worse.
NOISE = {100: 6.0, 200: 4.0, 300: 3.0, 400: 0.5, 500: 2.0, 600: 9.0}
#: The settings the series is evaluated with: ``plateau`` is a ridge whose small penalties
#: tie on the clean checkpoints (a ``plateau`` caution) and whose largest one wins on the
#: noisiest (``grid_edge``: unreliable), so the report has both kinds of warning.
SERIES_SETTINGS = {**{s: SETTINGS[s] for s in ("knn", "few")},
                   "plateau": ("ridge", {"alphas": [1e-6, 1e-5, 1e-4, 1e-3, 1e4]})}


def series_config(tmp: Path, settings=SERIES_SETTINGS, **report: Any) -> dict[str, Any]:
    """The raw config of the series: a scanned folder ``run7`` with steps in the names."""
    return {
        "store": str(tmp / "store"),
        "checkpoints": [{"path": str(tmp / "run7"), "arch": "resnet18", "settle_seconds": 0,
                         "series": "run7", "step_pattern": "ck-step{step}"}],
        "datasets": [{"name": DATASET, "adapter": "features", "params": {"path": str(tmp / "unused.npz")}}],
        "protocols": [{"name": s, "protocol": p, "settings": kw} for s, (p, kw) in settings.items()],
        "report": {"path": str(tmp / "out" / "report.html"), **report},
    }


def write_series(tmp: Path, raw: dict[str, Any], noise: dict[int, float] | None = None) -> dict[str, Any]:
    """Checkpoint files of the steps of ``noise`` in the folder, their features in the store,
    their cells evaluated, the report written: ``correlate_and_report``'s answer."""
    from jobs.config import load_config
    from jobs.evaluation.evaluate import evaluate_cells
    from jobs.plan import make_plan
    from jobs.report.inputs import correlate_and_report

    noise = NOISE if noise is None else noise
    folder = tmp / "run7"
    folder.mkdir(parents=True, exist_ok=True)
    for step in noise:
        path = folder / f"ck-step{step}.safetensors"
        if not path.exists():
            save_file({"w": np.full(2, step, np.float32)}, str(path), metadata={"epoch": str(step // 100)})
    cfg = load_config(raw)
    store = noisy_encoders(tmp, {f"ck-step{s}": v for s, v in noise.items()}, store=cfg.open_store())
    plan = make_plan(cfg, check=False, ready_only=False)
    outcomes = evaluate_cells(store, plan.cells)
    bad = [o for o in outcomes if o["status"] not in ("computed", "cached")]
    if bad:
        raise AssertionError(f"cells failed: {bad}")
    return correlate_and_report(store, plan.config, [o for o in outcomes if o.get("cell_id")], plan=plan)
