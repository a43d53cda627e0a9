"""Do two evaluation settings order the encoders the same way? (Ericsson et al. 2021, fig. 7)"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy import stats

from pipeline.errors import DataValidationError

__all__ = [
    "MIN_ENCODERS", "PairAgreement", "RadarData", "encoder_ranks", "flip_count", "kendall_tau_b_rows",
    "pair_agreement", "radar_data", "rank_agreement", "rank_table", "spearman_rows",
]

MIN_ENCODERS = 3  # with two encoders every correlation is +1 or -1
_PAIR_BUDGET = 2**24  # sign-matrix entries per bootstrap chunk


def _scores(values: Mapping[Hashable, float], encoders: list[Hashable], name: str) -> np.ndarray:
    arr = np.array([values[e] for e in encoders], dtype=np.float64)
    bad = [str(e) for e, v in zip(encoders, arr) if not np.isfinite(v)]
    if bad:
        raise DataValidationError(f"{name} has non-finite scores for encoder(s) {bad[:10]}")
    return arr


def encoder_ranks(scores: Mapping[Hashable, float], lower_is_better: bool = False) -> dict[Hashable, float]:
    """Rank of each encoder under one setting: 1 is the best, ties share the average rank."""
    encoders = list(scores)
    if not encoders:
        raise DataValidationError("no encoder to rank: scores is empty")
    values = _scores(scores, encoders, "scores")
    ranks = stats.rankdata(values if lower_is_better else -values, method="average")
    return {e: float(r) for e, r in zip(encoders, ranks)}


def _signs(A: np.ndarray) -> np.ndarray:
    """sign(a_i - a_j) for every row of A (m, n) -> (m, n, n), int8."""
    return np.sign(A[:, :, None] - A[:, None, :]).astype(np.int8)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, NaN where den is 0 (a constant row: no correlation)."""
    safe = np.where(den > 0, den, 1.0)
    return np.where(den > 0, num / safe, np.nan)


def kendall_tau_b_rows(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each row pair (A[r], B[r]); NaN where a row is constant."""
    A, B = np.atleast_2d(A), np.atleast_2d(B)
    m, n = A.shape
    out = np.empty(m)
    n0 = n * (n - 1) / 2
    step = max(1, _PAIR_BUDGET // max(1, n * n))
    for start in range(0, m, step):
        Sa, Sb = _signs(A[start:start + step]), _signs(B[start:start + step])
        # every unordered pair appears twice off the diagonal; the diagonal is zero
        s = 0.5 * np.einsum("rij,rij->r", Sa, Sb, dtype=np.int64)
        n1 = 0.5 * ((Sa == 0).sum(axis=(1, 2)) - n)
        n2 = 0.5 * ((Sb == 0).sum(axis=(1, 2)) - n)
        out[start:start + step] = _ratio(s, np.sqrt((n0 - n1) * (n0 - n2)))
    return out


def spearman_rows(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Spearman's rho (Pearson of average ranks) of each row pair; NaN where a row is constant."""
    Ra = stats.rankdata(np.atleast_2d(A), axis=1)
    Rb = stats.rankdata(np.atleast_2d(B), axis=1)
    Ra -= Ra.mean(axis=1, keepdims=True)
    Rb -= Rb.mean(axis=1, keepdims=True)
    rho = _ratio((Ra * Rb).sum(axis=1), np.sqrt((Ra * Ra).sum(axis=1) * (Rb * Rb).sum(axis=1)))
    return np.clip(rho, -1.0, 1.0)


def flip_count(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(pairs ordered oppositely by ``a`` and ``b``, pairs tied in ``a`` or in ``b``)."""
    Sa, Sb = _signs(np.asarray(a, dtype=np.float64)[None])[0], _signs(np.asarray(b, dtype=np.float64)[None])[0]
    upper = np.triu(np.ones(Sa.shape, dtype=bool), k=1)
    product = Sa.astype(np.int64) * Sb
    return int((product[upper] < 0).sum()), int((product[upper] == 0).sum())


@dataclass(frozen=True)
class PairAgreement:
    """Agreement of two settings' encoder rankings on one dataset."""
    # ``n`` encoders scored in both; ``n_pairs`` = n(n-1)/2; ``flips`` pairs ordered
    # oppositely; ``tied_pairs`` tied in at least one setting; ``*_ci`` percentile bootstrap
    # intervals (None without bootstrap) from ``n_bootstrap_used`` of ``n_bootstrap`` resamples.

    dataset: Hashable | None
    setting_a: Hashable | None
    setting_b: Hashable | None
    n: int
    kendall_tau: float
    spearman_rho: float
    flips: int
    tied_pairs: int
    n_pairs: int
    kendall_ci: tuple[float, float] | None = None
    spearman_ci: tuple[float, float] | None = None
    n_bootstrap: int = 0
    n_bootstrap_used: int = 0
    confidence: float = 0.95


def _check_bootstrap(n_bootstrap: int, confidence: float) -> None:
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, (int, np.integer)) or n_bootstrap < 0:
        raise DataValidationError(f"n_bootstrap must be a non-negative integer, got {n_bootstrap!r}")
    if not 0.0 < confidence < 1.0:
        raise DataValidationError(f"confidence must lie in (0, 1), got {confidence!r}")


def pair_agreement(a: Mapping[Hashable, float], b: Mapping[Hashable, float], n_bootstrap: int = 1000,
                   seed: int = 0, confidence: float = 0.95, *, lower_is_better: tuple[bool, bool] = (False, False),
                   labels: tuple[Hashable, Hashable, Hashable] = (None, None, None)) -> PairAgreement:
    """Kendall's tau-b, Spearman's rho and flips between two settings' scores of the encoders."""
    _check_bootstrap(n_bootstrap, confidence)
    encoders = [e for e in a if e in b]
    name_a, name_b = (str(labels[1] or "a"), str(labels[2] or "b"))
    where = f" on dataset {labels[0]!s}" if labels[0] is not None else ""
    if len(encoders) < MIN_ENCODERS:
        raise DataValidationError(
            f"settings {name_a} and {name_b}{where} share {len(encoders)} scored encoder(s) "
            f"({[str(e) for e in encoders]}); a rank agreement needs at least {MIN_ENCODERS}")
    x = _scores(a, encoders, f"setting {name_a}") * (-1.0 if lower_is_better[0] else 1.0)
    y = _scores(b, encoders, f"setting {name_b}") * (-1.0 if lower_is_better[1] else 1.0)
    for name, v in ((name_a, x), (name_b, y)):
        if np.ptp(v) == 0:
            raise DataValidationError(f"setting {name}{where} gives all {v.size} encoders the same score "
                                      f"({abs(v[0]):g}); it does not rank them")
    tau = float(stats.kendalltau(x, y).statistic)
    rho = float(stats.spearmanr(x, y).statistic)
    flips, tied = flip_count(x, y)
    n = len(encoders)
    tau_ci = rho_ci = None
    used = 0
    if n_bootstrap > 0:
        idx = np.random.default_rng(seed).integers(0, n, size=(int(n_bootstrap), n))
        taus, rhos = kendall_tau_b_rows(x[idx], y[idx]), spearman_rows(x[idx], y[idx])
        ok = np.isfinite(taus) & np.isfinite(rhos)
        used = int(ok.sum())
        if used == 0:
            raise DataValidationError(f"all {n_bootstrap} bootstrap resamples of {n} encoders were constant; "
                                      "use more encoders or no bootstrap")
        q = [50.0 * (1.0 - confidence), 50.0 * (1.0 + confidence)]
        tau_ci = tuple(float(v) for v in np.percentile(taus[ok], q))
        rho_ci = tuple(float(v) for v in np.percentile(rhos[ok], q))
    return PairAgreement(labels[0], labels[1], labels[2], n, tau, rho, flips, tied, n * (n - 1) // 2, tau_ci,
                         rho_ci, int(n_bootstrap), used, float(confidence))


def _table(scores: Mapping[tuple[Hashable, Hashable, Hashable], float]) -> dict:
    """{dataset: {setting: {encoder: score}}} from (encoder, dataset, setting) keys, in first-seen order."""
    table: dict = {}
    for key, value in scores.items():
        if not (isinstance(key, tuple) and len(key) == 3):
            raise DataValidationError(f"scores must be keyed by (encoder, dataset, setting), got key {key!r}")
        encoder, dataset, setting = key
        table.setdefault(dataset, {}).setdefault(setting, {})[encoder] = value
    if not table:
        raise DataValidationError("scores is empty: nothing to rank")
    return table


def rank_table(scores: Mapping[tuple[Hashable, Hashable, Hashable], float],
               lower_is_better: Collection[Hashable] = ()) -> dict[tuple[Hashable, Hashable], dict[Hashable, float]]:
    """Each encoder's rank for every (dataset, setting), e.g. to print next to the scores."""
    return {(dataset, setting): encoder_ranks(values, lower_is_better=setting in lower_is_better)
            for dataset, by_setting in _table(scores).items() for setting, values in by_setting.items()}


def rank_agreement(scores: Mapping[tuple[Hashable, Hashable, Hashable], float], n_bootstrap: int = 1000,
                   seed: int = 0, confidence: float = 0.95,
                   lower_is_better: Collection[Hashable] = ()) -> list[PairAgreement]:
    """Agreement between every pair of settings, per dataset."""
    out = []
    for dataset, by_setting in _table(scores).items():
        for sa, sb in combinations(list(by_setting), 2):
            out.append(pair_agreement(by_setting[sa], by_setting[sb], n_bootstrap, seed, confidence,
                                      lower_is_better=(sa in lower_is_better, sb in lower_is_better),
                                      labels=(dataset, sa, sb)))
    return out


@dataclass(frozen=True)
class RadarData:
    """Each encoder's rank on each axis (the reference first, then the settings): one radar
    chart per encoder, or one polygon per encoder on a shared chart."""

    axes: tuple[Hashable, ...]
    encoders: tuple[Hashable, ...]
    ranks: np.ndarray  # (n_encoders, n_axes); 1 is the best

    def records(self) -> list[dict[str, object]]:
        """One row per (encoder, axis) with its rank."""
        return [{"encoder": e, "axis": a, "rank": float(self.ranks[i, j])}
                for i, e in enumerate(self.encoders) for j, a in enumerate(self.axes)]


def radar_data(by_setting: Mapping[Hashable, Mapping[Hashable, float]],
               reference: Mapping[Hashable, float] | None = None, reference_name: Hashable = "ImageNet",
               lower_is_better: Collection[Hashable] = ()) -> RadarData:
    """Rank of each encoder under every setting and under the reference (e.g. ImageNet top-1)."""
    axes = ([(reference_name, reference)] if reference is not None else []) + list(by_setting.items())
    if not by_setting:
        raise DataValidationError("radar_data needs at least one setting")
    encoders = list(next(iter(by_setting.values())))
    for j, (name, values) in enumerate(axes):
        missing = [str(e) for e in encoders if e not in values]
        # the reference may score more encoders (a table of published numbers); settings may not
        extra = [] if reference is not None and j == 0 else [str(e) for e in values if e not in set(encoders)]
        if missing or extra:
            raise DataValidationError(f"axis {name!s} must score the same encoders as the others; missing "
                                      f"{missing[:10]}, extra {extra[:10]}")
    ranks = np.empty((len(encoders), len(axes)))
    for j, (name, values) in enumerate(axes):
        r = encoder_ranks({e: values[e] for e in encoders}, lower_is_better=name in lower_is_better)
        ranks[:, j] = [r[e] for e in encoders]
    return RadarData(tuple(name for name, _ in axes), tuple(encoders), ranks)
