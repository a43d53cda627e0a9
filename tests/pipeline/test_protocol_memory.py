"""Peak memory of every protocol stays within 1.5x the features it is given, plus terms
that do not grow with the number of rows.

Each protocol runs in a process of its own (``memory_child``: forked for it from a server
that has imported torch and the protocols and run nothing, so the start-up is paid once
and no other protocol's leftovers can hide its growth) at two train sizes while that
process holds the features; the peak RSS growth during the run is measured there. Two
checks per protocol: the growth from the small to the large size is at most half the
added feature bytes (nothing of size n beyond the features themselves), and at the large
size the growth is at most half the features plus a fixed allowance for row blocks and
runtime (``ALLOWANCE``). The protocol's own ``memory_bytes`` must not underestimate the
measured growth. Sizes are modest; the seconds are in benchmarks/bench_scale.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.protocols.memory import F8, feature_rows, peak
from pipeline.protocols.registry import CellShape, get_protocol
from tests.helpers.protocols import feature_protocols
from tests.pipeline.memory_child import MeasurementServer

ALLOWANCE = 64 * 2**20  # row blocks (a few MiB each), library and allocator slack
MEASURED = {
    "ridge": {"settings": {}},
    "knn": {"settings": {}, "n_test": 2000},
    "fewshot": {"settings": {"n_episodes": 200}},
    "lowshot": {"settings": {"shots": [1, 8, "all"], "n_seeds": 2}},
    "invariance": {"settings": {"max_train": 500, "max_dims": 16}},
    # a few L-BFGS steps: each step reads the rows the same way, so the peak is reached in the
    # first; more steps cost seconds and change no byte held
    "logistic": {"settings": {"Cs": [0.1, 1.0], "max_iter": 5}},
    "logistic-float16": {"settings": {"Cs": [0.1, 1.0], "max_iter": 5}, "dtype": "float16"},
    "mlp": {"settings": {"hidden_units": 32, "max_epochs": 1, "weight_decays": [0.0, 0.1], "linear_Cs": [1.0]}},
    "attentive": {"settings": {"num_heads": 4, "max_epochs": 2, "learning_rates": [0.03], "weight_decays": [0.0]},
                  "tokens": 4, "dim": 32, "n_classes": 5, "dtype": "float16"},
}
# every other entry that reads pooled or token features is measured with its cheap settings
CASES = {**{n: {"settings": dict(get_protocol(n).cheap_settings or {}),
                **({"tokens": 4, "dim": 32, "n_classes": 5, "dtype": "float16"} if get_protocol(n).tokens else {})}
            for n in feature_protocols("pooled", "tokens")}, **MEASURED}
# over 10 s each: the entries say so themselves (``slow``)
SLOW = {case for case in CASES if get_protocol(case.split("-")[0]).slow}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The forking measurement server: torch's and the protocols' imports paid once for every case."""
    server = MeasurementServer("tests.pipeline.memory_child", tmp_path_factory.mktemp("memory") / "server.log")
    yield server
    server.close()


def run_child(server: MeasurementServer, protocol: str, sizes: list[tuple[int, int]], dim: int = 128,
              n_classes: int = 20, **extra) -> list[dict]:
    return server.measure({"protocol": protocol, "sizes": sizes, "dim": dim, "n_classes": n_classes, **extra})


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset the RSS peak")
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_peak_memory_stays_near_the_features(case, server):
    spec = dict(CASES[case])
    protocol = case.split("-")[0]
    n_test = spec.pop("n_test", 4000)
    small, large = run_child(server, protocol, [(20_000, n_test), (160_000, n_test)], **spec)
    added = large["feature_bytes"] - small["feature_bytes"]
    summary = f"{case}: growth {small['growth'] / 2**20:.1f} MiB -> {large['growth'] / 2**20:.1f} MiB"
    assert large["growth"] - small["growth"] <= 0.5 * added, summary
    assert large["growth"] <= 0.5 * large["feature_bytes"] + ALLOWANCE, summary
    for point in (small, large):
        assert point["growth"] <= point["estimate_extra"], f"{summary}; memory_bytes underestimates"
    floor = get_protocol(protocol).floor  # the runs did real work: the headline beats the entry's floor
    assert floor is None or large["score"] is None or large["score"] > floor, summary


def test_memory_parts_add_up_and_refuse_what_is_not_bytes():
    c = CellShape(100, 20, 0, 8, 3, 2, 1, 0)
    assert peak(features=feature_rows(10, c, copies=1, itemsize=F8), runtime=5) == 10 * 8 * (2 + 8) + 5
    with pytest.raises(ValueError, match="memory part 'scores' is -1, not a number of bytes"):
        peak(scores=-1)
