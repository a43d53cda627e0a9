"""What the per-protocol tests read from the registry, and what they need of each entry.

Every test that must cover each protocol takes its list from the registry
(``feature_protocols``) and its cheap settings from the entry (``cheap_settings``, also as
the live mapping ``CHEAP``); ``missing_requirements`` names what an entry lacks for them,
with what to add where.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

#: Which test refuses bad inputs for an entry, by what it reads (``Protocol.reads``).
BAD_INPUT_TESTS = {"pooled": "tests/properties/test_protocol_inputs.py",
                   "tokens": "tests/properties/test_protocol_inputs.py",
                   "map": "tests/pipeline/test_dense_protocols.py",
                   "weights": "tests/jobs/test_encoder_jobs.py"}


def feature_protocols(*reads: str) -> list[str]:
    """Registered protocols that read stored features (only those that read one of ``reads``
    when given: ``pooled``, ``tokens``, ``map``), sorted."""
    from pipeline.protocols.registry import get_protocol, list_protocols

    return [n for n in list_protocols() if get_protocol(n).reads_features and (
        not reads or get_protocol(n).reads in reads)]


class _Cheap(Mapping):
    """The registered entries' ``cheap_settings`` by name, read from the registry on each use."""

    def _entries(self) -> dict[str, Any]:
        from pipeline.protocols.registry import get_protocol, list_protocols

        entries = {n: get_protocol(n).cheap_settings for n in list_protocols()}
        return {n: cheap for n, cheap in entries.items() if cheap is not None}

    def __getitem__(self, name: str) -> dict[str, Any]:
        return dict(self._entries()[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries())

    def __len__(self) -> int:
        return len(self._entries())


#: Cheap base settings per protocol (each entry's ``cheap_settings``), so a run on accepted settings stays fast.
CHEAP = _Cheap()


def cheap_settings(name: str) -> dict[str, Any]:
    """The entry's cheap settings; a clear failure naming what to add when it declares none."""
    problems = missing_requirements(name, ("cheap_settings",))
    assert not problems, problems[0]
    return CHEAP[name]


def missing_requirements(name: str, only: tuple[str, ...] = ()) -> list[str]:
    """What the per-protocol tests need that the entry ``name`` lacks, each with what to add
    where (empty: nothing). ``only``: check just these of ``cheap_settings``, ``memory``,
    ``bad_inputs``."""
    from pipeline.protocols.registry import get_protocol

    proto = get_protocol(name)
    where = f"its @register_protocol entry in {proto.run.__module__}"
    problems = []
    wanted = only or ("cheap_settings", "memory", "bad_inputs")
    if not proto.reads_features:  # an encoder protocol: its settings class and test_encoder_jobs cover it
        wanted = ()
    if "cheap_settings" in wanted and proto.cheap_settings is None:
        problems.append(f"protocol {name!r} has no cheap_settings: add cheap_settings={{...}} (settings for a run "
                        f"on a few dozen rows; {{}} if its defaults are cheap) to {where}")
    if "memory" in wanted and proto.memory is None:
        problems.append(f"protocol {name!r} has no memory estimate: add memory=<fn(CellShape, settings) -> bytes>, "
                        f"composed of pipeline.protocols.memory's parts, to {where}")
    if "bad_inputs" in wanted and proto.reads not in BAD_INPUT_TESTS:
        problems.append(f"protocol {name!r} reads {proto.reads!r}, which no bad-input test covers: add a family of "
                        "bad inputs for it to BAD_INPUT_TESTS in tests/helpers/protocols.py")
    return problems


def as_tokens(data, n_tokens: int = 2):
    """``data`` with every feature row repeated as ``n_tokens`` tokens: (n, d) -> (n, T, d),
    for the protocols that read token features (the class is in every token)."""
    import dataclasses

    import numpy as np

    def tok(X):
        return None if X is None else np.repeat(np.asarray(X)[:, None], n_tokens, axis=1)

    return dataclasses.replace(data, X_train=tok(data.X_train), X_test=tok(data.X_test), X_val=tok(data.X_val))


def dense_data(task: str, n_train: int = 12, n_test: int = 6, grid: int = 4, size: int = 16, width: int = 8,
               informative: bool = True, seed: int = 0):
    """Tiny ``DenseData``: maps whose first channels carry each grid cell's label (a class,
    or a unit normal) plus noise (``informative=False``: noise only), and targets of
    ``size`` x ``size`` pixels, each grid cell's label over its block of pixels (the first
    pixel row ignored or invalid)."""
    import numpy as np

    from pipeline.protocols.dense.data import DenseData

    rng = np.random.default_rng(seed)
    block = size // grid
    axes = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0]], dtype=np.float64)

    def split(n):
        cells = rng.integers(0, 3 if task == "segmentation" else 4, (n, grid, grid))
        signal = np.eye(3)[np.minimum(cells, 2)] if task == "segmentation" else axes[cells]
        X = rng.normal(0, 0.4, (n, grid, grid, width))
        if informative:
            X[..., :3] += 2 * signal
        pixels = np.repeat(np.repeat(cells if task == "segmentation" else signal, block, axis=1), block, axis=2)
        if task == "segmentation":
            y = pixels.astype(np.uint8)
            y[:, 0] = 255
        else:
            y = pixels.astype(np.float16)
            y[:, 0] = 0
        return X.astype(np.float16), y

    X_train, y_train = split(n_train)
    X_test, y_test = split(n_test)
    return DenseData(task, X_train, y_train, X_test, y_test, 3)


def log_loss_choice(considered, log_loss, n_val: int) -> int:
    """The logistic ``stable`` rule written out: among the positions ``considered``, the
    smallest grid position (strongest penalty) whose validation log-loss is at most their
    lowest plus ln 2 / n_val (one validation row moved from certain to a coin flip)."""
    considered = np.flatnonzero(considered)
    lowest = min(log_loss[j] for j in considered)
    return int(next(j for j in considered if log_loss[j] <= lowest + np.log(2) / n_val))


def seed_walk_choice(scores) -> int:
    """Ericsson et al.'s rule written out: walking the grid from the weakest penalty (the last
    position) up, a value is kept only when its score is strictly higher."""
    best = len(scores) - 1
    for j in range(len(scores) - 2, -1, -1):
        if scores[j] > scores[best]:
            best = j
    return best


def seed_choice(scores, iters) -> int:
    """The C grid position the logistic tie rule keeps: walking C upwards, a better validation
    score, or an equal one whose fit moved (0 iterations: the previous value's model),
    replaces the choice (Ericsson et al.: the weakest penalty among the best)."""
    best = 0
    for j in range(1, len(scores)):
        if scores[j] > scores[best] or (scores[j] == scores[best] and iters[j] > 0):
            best = j
    return best
