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
    from jobs.run.plan import list_work
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
    plan = list_work(cfg, ready_only=False)
    outcomes = evaluate_cells(store, plan.cells)
    bad = [o for o in outcomes if o["status"] not in ("computed", "cached")]
    if bad:
        raise AssertionError(f"cells failed: {bad}")
    return correlate_and_report(store, plan.config, [o for o in outcomes if o.get("cell_id")], plan=plan)


#: The first night of a series with Lightning-like long names: the newest checkpoint (step
#: 200) far better than the one before, the oldest (step 0) so noisy that its ridge picks
#: the grid's edge (``grid_edge``: a score not to be trusted); two more encoders with the
#: very same features, so their mean ranks tie.
NIGHT_ONE = {"vit-b16-lightning-run7-epoch=0-step=0": (0, 9.0), "vit-b16-lightning-run7-epoch=3-step=100": (100, 3.0),
             "vit-b16-lightning-run7-epoch=7-step=200": (200, 0.5)}
TWINS = ("twin-a", "twin-b")


def night_one(tmp: Path, settings=SERIES_SETTINGS) -> dict[str, Any]:
    """The night-1 report, written from a real store as a run writes it (series analysed,
    summary beside it): ``{"report", "summary", "series", "records", "config"}``."""
    from jobs.analysis.series import analyse_series
    from jobs.config import load_config
    from jobs.report.events import build_report_summary
    from jobs.report.page import write_report
    from storage_schema.keys import feature_key
    from tests.helpers.evidence import evaluate_all, put_features

    store = noisy_encoders(tmp, {**{n: noise for n, (_, noise) in NIGHT_ONE.items()}, TWINS[0]: 2.0})
    for split in ("train", "test"):  # the twin: the very same features, so every score ties
        first = store.open_array(feature_key(TWINS[0], DATASET, split, "pre_logits"))
        put_features(store, TWINS[1], DATASET, split, first.read(), str(first.attrs["labels"]))
    names = [*NIGHT_ONE, *TWINS]
    records = list(evaluate_all(store, names, settings).values())
    cfg = load_config({
        "store": str(tmp / "store"),
        "encoders": [{"name": n, "source": "store", "series": "run7", "step": step}
                     for n, (step, _) in NIGHT_ONE.items()] + [{"name": n, "source": "store"} for n in TWINS],
        "datasets": [{"name": DATASET, "adapter": "digits"}],
        "protocols": [{"name": s, "protocol": p, "settings": kw} for s, (p, kw) in settings.items()],
        "correlation": {"settings": []},
        "report": {"path": str(tmp / "out" / "report.html")},
    })
    series = analyse_series(store, records, cfg)
    summary = build_report_summary(records, [], series, evaluated=list(NIGHT_ONE), report=cfg.report.path)
    path = write_report(records, None, cfg, cfg.report.path, series=series, summary=summary)
    return {"report": path, "summary": summary, "series": series, "records": records, "config": cfg}
