"""Many tiny evaluation cells through the real benchmark flow (embedded Prefect API of the
test harness + a Dask LocalCluster of 2 worker processes): every cell is computed and
recorded, and the orchestration overhead per cell is measured and printed.

Evaluation tasks group up to ``dask.cells_per_task`` cells: 400 cells are many tasks of many
cells each, in a quarter of a minute on 2 cores; benchmarks/bench_load.py runs the same
measurement standalone at 1,000 cells (benchmarks/RESULTS.md's figures; it can profile the task
wrapper).
"""

from __future__ import annotations

import pytest

from jobs.config import load_config
from storage_schema.ledger import Ledger
from tests.helpers.load import load_config_dict, measure, prepare_features

CELLS = 400


@pytest.mark.slow
def test_many_cells_in_one_run(tmp_path, prefect_harness):
    cfg = load_config(load_config_dict(tmp_path, CELLS))
    prep = prepare_features(cfg)
    fig = measure(cfg)
    print(f"many cells: {fig['cells']} cells in one run (features extracted beforehand in {prep:.1f} s): "
          f"flow wall {fig['flow_wall_s']:.1f} s, run wall {fig['run_wall_s']:.1f} s, cells' own compute "
          f"{fig['cell_compute_s']:.1f} s, orchestration overhead {1000 * fig['overhead_per_cell_s']:.0f} ms "
          "per cell (fixed start-up included)")
    assert fig["cells"] == CELLS and fig["computed"] == CELLS and fig["failed"] == 0
    assert fig["extracted"] == 0  # the flow found every feature array complete
    records = list(Ledger(cfg.open_store(read_only=True)))
    assert len(records) == CELLS and len({r["cell_id"] for r in records}) == CELLS
    assert {r["setting"] for r in records} == {p.name for p in cfg.protocols}
