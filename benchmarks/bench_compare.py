"""Paired comparison statistics against the loop a user would write with scikit-learn.

Each case computes the same numbers both ways on the same synthetic predictions: the
paired bootstrap replicates of the score difference (resample test examples, score both
encoders on the resample, subtract) and, for metrics without an exact test, the paired
randomization test (swap the two encoders' outputs on a random half of the examples). The
reference loops over the very resamples ``pipeline.analysis.compare`` draws
(``bootstrap_indices``, ``swap_masks``) and calls sklearn's metric per resample, so both
sides return identical replicates and p-values (checked before timing is reported). Interleaved runs
(ours, loop, loop, ours, ...); the median of the per-pair ratios is printed.

* top-1: ``compare_predictions(metric="top1")`` against ``accuracy_score`` per resample
  (the McNemar p-value is a closed form; it costs nothing on either side).
* mean per-class accuracy: ``compare_predictions(metric="mean_per_class")`` against
  ``balanced_accuracy_score`` per bootstrap resample and per random swap.
* multi-label mAP: ``compare_scores`` against the mean over classes of
  ``average_precision_score`` per bootstrap resample and per random swap.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_compare.py [--quick] [--markdown]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks._common import limit_threads, machine_line, median, pair_ratios, print_tables, timed  # noqa: E402
from pipeline.analysis.compare import compare_predictions, compare_scores  # noqa: E402
from pipeline.analysis.compare.resampling import bootstrap_indices, swap_masks  # noqa: E402


def _classification(n: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    a = np.where(rng.random(n) < 0.75, y, rng.integers(0, classes, n))
    b = np.where(rng.random(n) < 0.72, y, rng.integers(0, classes, n))
    return y, a, b


def _loop_top1(y, a, b, resamples: int) -> np.ndarray:
    from sklearn.metrics import accuracy_score

    return np.array([accuracy_score(y[i], a[i]) - accuracy_score(y[i], b[i]) for i in bootstrap_indices(y.size, resamples, 0)])


def _loop_mean_per_class(y, a, b, resamples: int, permutations: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.metrics import balanced_accuracy_score as bal

    boot = np.array([bal(y[i], a[i]) - bal(y[i], b[i]) for i in bootstrap_indices(y.size, resamples, 0)])
    swaps = np.array([bal(y, np.where(s, b, a)) - bal(y, np.where(s, a, b)) for s in swap_masks(y.size, permutations, 0)])
    return boot, swaps


def _mean_ap(y: np.ndarray, scores: np.ndarray) -> float:
    from sklearn.metrics import average_precision_score

    kept = [k for k in range(y.shape[1]) if y[:, k].any()]
    return float(np.mean([average_precision_score(y[:, k], scores[:, k]) for k in kept]))


def _loop_map(y, sa, sb, resamples: int, permutations: int) -> tuple[np.ndarray, np.ndarray]:
    boot = np.array([_mean_ap(y[i], sa[i]) - _mean_ap(y[i], sb[i]) for i in bootstrap_indices(y.shape[0], resamples, 0)])
    swaps = []
    for s in swap_masks(y.shape[0], permutations, 0):
        swaps.append(_mean_ap(y, np.where(s[:, None], sb, sa)) - _mean_ap(y, np.where(s[:, None], sa, sb)))
    return boot, np.array(swaps)


def _same(result, loop: tuple[np.ndarray, np.ndarray]) -> None:
    """Identical bootstrap replicates and randomization p-value on both sides."""
    boot, swaps = loop
    np.testing.assert_allclose(result.replicates, boot, atol=1e-12)
    p = (1 + np.sum(np.abs(swaps) >= abs(result.difference) - 1e-12)) / (1 + swaps.size)
    np.testing.assert_allclose(result.p_value, p, rtol=1e-12)


def _case(name: str, ours, reference, repeats: int, check) -> list[object]:
    t_ours, t_ref = [], []
    for i in range(repeats):
        order = (ours, reference) if i % 2 == 0 else (reference, ours)
        for fn in order:
            seconds, out = timed(fn)
            (t_ours if fn is ours else t_ref).append(seconds)
            if fn is ours:
                mine = out
            else:
                theirs = out
    check(mine, theirs)
    ratios = pair_ratios(t_ref, t_ours)
    return [name, median(t_ours), median(t_ref), median(ratios), median(t_ref) / median(t_ours)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--markdown", action="store_true", help="also print markdown tables")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="thread budget of both sides (0: defaults)")
    args = parser.parse_args()
    threads = limit_threads(None if args.threads == 0 else args.threads)
    scale = 0.2 if args.quick else 1.0
    n, resamples, permutations = int(10_000 * scale), int(1000 * scale), int(1000 * scale)
    rows = []

    y, a, b = _classification(n, 100)
    rows.append(_case(
        f"top1 bootstrap (n={n}, B={resamples})",
        lambda: compare_predictions(y, a, b, n_resamples=resamples),
        lambda: _loop_top1(y, a, b, resamples), args.repeats,
        lambda r, loop: np.testing.assert_allclose(r.replicates, loop, atol=1e-12),
    ))
    rows.append(_case(
        f"mean per-class bootstrap + randomization (n={n}, 100 classes, B={resamples}, P={permutations})",
        lambda: compare_predictions(y, a, b, "mean_per_class", n_resamples=resamples, n_permutations=permutations),
        lambda: _loop_mean_per_class(y, a, b, resamples, permutations), args.repeats,
        _same,
    ))

    m, classes, few = int(2000 * scale), 20, int(200 * scale)
    rng = np.random.default_rng(1)
    labels = rng.random((m, classes)) < 0.1
    sa, sb = labels + rng.normal(0, 1.0, (m, classes)), labels + rng.normal(0, 1.1, (m, classes))
    rows.append(_case(
        f"mAP bootstrap + randomization (n={m}, {classes} classes, B={few}, P={few})",
        lambda: compare_scores(labels, sa, sb, n_resamples=few, n_permutations=few),
        lambda: _loop_map(labels, sa, sb, few, few), args.repeats, _same,
    ))
    print(f"{machine_line()}; threads: {threads}")
    print_tables("Paired comparison: pipeline.analysis.compare vs sklearn loop (same resamples, same replicates)",
                 ["case", "ours s", "sklearn loop s", "speed-up (median of pair ratios)", "ratio of medians"],
                 rows, args.markdown)


if __name__ == "__main__":
    main()
