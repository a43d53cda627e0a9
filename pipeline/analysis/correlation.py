"""Correlating scores across models in logit space (after Ericsson et al., CVPR 2021, appendix A.7)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from pipeline.errors import DataValidationError
from pipeline.plain import to_plain

DEFAULT_EPS = 1e-6
MIN_MODELS = 3

__all__ = [
    "CorrelationResult",
    "SettingCorrelation",
    "correlate_setting",
    "logit",
    "setting_scores",
    "transfer_correlation",
]


def _as_finite_1d(values: object, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise DataValidationError(f"{name} must be one score per model (1-D), got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise DataValidationError(
            f"{name} has {bad.size} non-finite value(s) (NaN/Inf) at position(s) {bad[:10].tolist()}"
        )
    return arr


def logit(p: object, eps: float = DEFAULT_EPS) -> np.ndarray:
    """log(p / (1 - p)) of fractions in [0, 1], clipped to [eps, 1 - eps] first."""
    # Values outside [0, 1] are refused rather than clipped: 85.0 is almost always a
    # percentage, and clipping it to 1 - eps would silently give every such model the same
    # score. Pass fractions (0.85).
    if not 0.0 < eps < 0.5:
        raise DataValidationError(f"eps must lie in (0, 0.5), got {eps!r}")
    arr = np.asarray(p, dtype=np.float64)
    flat = arr.reshape(-1)
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        raise DataValidationError(
            f"logit input has {bad.size} non-finite value(s) (NaN/Inf) at flat position(s) "
            f"{bad[:10].tolist()}"
        )
    out = np.flatnonzero((flat < 0.0) | (flat > 1.0))
    if out.size:
        shown = ", ".join(f"{flat[i]:g}" for i in out[:5])
        hint = (
            " They look like percentages: pass fractions (e.g. 85.0 % -> 0.85)."
            if np.all((flat[out] > 1.0) & (flat[out] <= 100.0))
            else " A bounded metric must be a fraction; pass bounded=False for an unbounded one."
        )
        raise DataValidationError(
            f"logit needs fractions in [0, 1]; {out.size} value(s) lie outside: {shown}.{hint}"
        )
    clipped = np.clip(arr, eps, 1.0 - eps)
    return np.log(clipped) - np.log1p(-clipped)


def _transform(values: np.ndarray, bounded: bool, eps: float) -> np.ndarray:
    return logit(values, eps) if bounded else values


@dataclass(frozen=True)
class CorrelationResult:
    """Pearson r and Spearman rho over ``n`` models of two (transformed) score vectors."""
    # ``pearson_ci`` / ``spearman_ci`` are percentile bootstrap intervals over models (models
    # resampled with replacement, ``n_bootstrap`` times, at level ``confidence``); ``None`` when
    # no bootstrap was asked. Resamples in which either vector is constant have no defined
    # correlation and are left out; ``n_bootstrap_used`` says how many counted.

    pearson: float
    spearman: float
    n: int
    pearson_p: float
    spearman_p: float
    pearson_ci: tuple[float, float] | None = None
    spearman_ci: tuple[float, float] | None = None
    n_bootstrap: int = 0
    n_bootstrap_used: int = 0
    confidence: float = 0.95


def _rowwise_pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean(axis=1, keepdims=True)
    den = np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))
    num = (a * b).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return np.clip(r, -1.0, 1.0)


def _check_not_constant(values: np.ndarray, name: str) -> None:
    if np.ptp(values) == 0.0:
        raise DataValidationError(
            f"{name} is the same for all {values.size} models (value {values[0]:g} after any "
            "logit transform); "
            "a correlation with a constant is undefined"
        )


def _correlate(
    ref: np.ndarray,
    tgt: np.ndarray,
    n_bootstrap: int,
    seed: int,
    confidence: float,
    target_name: str = "target",
) -> CorrelationResult:
    """Correlate two already transformed, validated, equally long vectors."""
    n = ref.size
    if n < MIN_MODELS:
        raise DataValidationError(
            f"a correlation across models needs at least {MIN_MODELS} models, got {n}: "
            "with 2 models Pearson and Spearman are always +1 or -1"
        )
    _check_not_constant(ref, "reference")
    _check_not_constant(tgt, target_name)
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, (int, np.integer)) or n_bootstrap < 0:
        raise DataValidationError(f"n_bootstrap must be a non-negative integer, got {n_bootstrap!r}")
    if not 0.0 < confidence < 1.0:
        raise DataValidationError(f"confidence must lie in (0, 1), got {confidence!r}")
    pr = stats.pearsonr(ref, tgt)
    sr = stats.spearmanr(ref, tgt)
    pearson_ci = spearman_ci = None
    used = 0
    if n_bootstrap > 0:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(int(n_bootstrap), n))
        rb, tb = ref[idx], tgt[idx]
        boot_p = _rowwise_pearson(rb, tb)
        boot_s = _rowwise_pearson(stats.rankdata(rb, axis=1), stats.rankdata(tb, axis=1))
        ok = np.isfinite(boot_p) & np.isfinite(boot_s)
        used = int(ok.sum())
        if used == 0:
            raise DataValidationError(
                f"all {n_bootstrap} bootstrap resamples of {n} models were constant; "
                "use more models or no bootstrap"
            )
        q = [50.0 * (1.0 - confidence), 50.0 * (1.0 + confidence)]
        lo, hi = np.percentile(boot_p[ok], q)
        pearson_ci = (float(lo), float(hi))
        lo, hi = np.percentile(boot_s[ok], q)
        spearman_ci = (float(lo), float(hi))
    return CorrelationResult(
        pearson=float(pr.statistic),
        spearman=float(sr.statistic),
        n=int(n),
        pearson_p=float(pr.pvalue),
        spearman_p=float(sr.pvalue),
        pearson_ci=pearson_ci,
        spearman_ci=spearman_ci,
        n_bootstrap=int(n_bootstrap),
        n_bootstrap_used=used,
        confidence=float(confidence),
    )


def _align(reference: object, target: object) -> tuple[np.ndarray, np.ndarray]:
    """Two sequences of equal length, or two mappings model -> score with the same models."""
    ref_map = isinstance(reference, Mapping)
    tgt_map = isinstance(target, Mapping)
    if ref_map != tgt_map:
        raise DataValidationError(
            "reference and target must both be sequences (aligned by position) or both "
            f"mappings model -> score (aligned by model); got {type(reference).__name__} and "
            f"{type(target).__name__}"
        )
    if ref_map:
        missing_t = [m for m in reference if m not in target]
        missing_r = [m for m in target if m not in reference]
        if missing_t or missing_r:
            raise DataValidationError(
                f"reference and target must score the same models; only in reference: "
                f"{sorted(map(str, missing_t))}, only in target: {sorted(map(str, missing_r))}"
            )
        models = list(reference)
        reference = [reference[m] for m in models]
        target = [target[m] for m in models]
    ref = _as_finite_1d(reference, "reference")
    tgt = _as_finite_1d(target, "target")
    if ref.size != tgt.size:
        raise DataValidationError(
            f"reference has {ref.size} models but target has {tgt.size}; they must be aligned "
            "one score per model"
        )
    return ref, tgt


def transfer_correlation(
    reference: Sequence[float] | Mapping[object, float] | np.ndarray,
    target: Sequence[float] | Mapping[object, float] | np.ndarray,
    bounded: bool = True,
    lower_is_better: bool = False,
    n_bootstrap: int = 0,
    seed: int = 0,
    *,
    reference_bounded: bool | None = None,
    eps: float = DEFAULT_EPS,
    confidence: float = 0.95,
) -> CorrelationResult:
    """Pearson and Spearman correlation across models between a reference and a target score.

    ``reference`` (usually ImageNet top-1) and ``target`` hold one score per model, as two
    equally long sequences or two mappings model -> score over the same models.
    ``bounded`` logit-transforms the target (fractions in [0, 1]); ``reference_bounded``
    does so for the reference and defaults to ``bounded``. ``lower_is_better`` negates the
    (transformed) target, so an error rate or ECE correlates positively when it improves
    with the reference. ``n_bootstrap`` > 0 adds percentile bootstrap intervals over models.
    At least 3 models are needed, and neither vector may be constant.

    Parameters
    ----------
    reference, target : sequence, mapping or numpy.ndarray
        One score per model, aligned by position (sequences) or by model (mappings).
    bounded : bool
        Logit-transform the target (fractions in [0, 1]).
    lower_is_better : bool
        Negate the transformed target.
    n_bootstrap : int
        Bootstrap resamples over models for the intervals (0: none).
    seed : int
        Seed of the resampling.
    reference_bounded : bool, optional
        Logit-transform the reference; ``bounded`` by default.
    eps : float
        Clipping bound of the logit.
    confidence : float
        Level of the bootstrap intervals.

    Returns
    -------
    CorrelationResult
        Pearson and Spearman coefficients, p-values and intervals.
    """
    ref, tgt = _align(reference, target)
    ref_t = _transform(ref, bounded if reference_bounded is None else reference_bounded, eps)
    tgt_t = _transform(tgt, bounded, eps)
    if lower_is_better:
        tgt_t = -tgt_t
    return _correlate(ref_t, tgt_t, n_bootstrap, seed, confidence)


def _split_key(key: object) -> tuple[object, object]:
    if not (isinstance(key, tuple) and len(key) == 2):
        raise DataValidationError(f"scores must be keyed by (model, dataset) pairs, got key {key!r}")
    return key[0], key[1]


def _models_of(scores: Mapping[tuple[object, object], float]) -> list[object]:
    seen: dict[object, None] = {}
    for key in scores:
        seen.setdefault(_split_key(key)[0], None)
    return list(seen)


def setting_scores(
    scores: Mapping[tuple[object, object], float],
    datasets: Sequence[object],
    models: Sequence[object] | None = None,
    *,
    bounded: bool = True,
    eps: float = DEFAULT_EPS,
) -> dict[object, float]:
    """One value per model: the mean over ``datasets`` of its logit-transformed scores."""
    # ``scores`` maps (model, dataset) to a score; entries of datasets outside the setting
    # are ignored. ``models`` defaults to every model in ``scores``; each must have a score
    # on every dataset of the setting, otherwise the error names the model and what it
    # lacks. ``bounded=False`` averages the raw scores (unbounded metrics).
    datasets = list(datasets)
    if not datasets:
        raise DataValidationError("a setting needs at least one dataset, got none")
    if len(set(datasets)) != len(datasets):
        dup = sorted({str(d) for d in datasets if datasets.count(d) > 1})
        raise DataValidationError(f"datasets of a setting must be distinct; repeated: {dup}")
    models = _models_of(scores) if models is None else list(models)
    if not models:
        raise DataValidationError("scores is empty: no model to summarise")
    missing = {
        m: [d for d in datasets if (m, d) not in scores] for m in models
    }
    missing = {m: ds for m, ds in missing.items() if ds}
    if missing:
        lines = "; ".join(f"{m!s} lacks {[str(d) for d in ds]}" for m, ds in list(missing.items())[:10])
        more = f" (and {len(missing) - 10} more models)" if len(missing) > 10 else ""
        raise DataValidationError(
            f"{len(missing)} of {len(models)} model(s) lack a score on the setting's datasets "
            f"{[str(d) for d in datasets]}: {lines}{more}"
        )
    out: dict[object, float] = {}
    for m in models:
        vals = np.array([scores[(m, d)] for d in datasets], dtype=np.float64)
        if not np.all(np.isfinite(vals)):
            bad = [str(d) for d, v in zip(datasets, vals) if not np.isfinite(v)]
            raise DataValidationError(f"model {m!s} has non-finite scores on {bad}")
        out[m] = float(np.mean(_transform(vals, bounded, eps)))
    return out


@dataclass(frozen=True)
class SettingCorrelation:
    """Correlation of a setting's per-model summary with the reference, and per dataset."""

    setting: CorrelationResult
    per_dataset: dict[object, CorrelationResult]
    models: tuple[object, ...]
    datasets: tuple[object, ...]
    setting_scores: dict[object, float] = field(repr=False)

    def to_records(self) -> list[dict[str, object]]:
        """One flat record for the setting (dataset ``None``) and one per dataset."""
        rows = [{"dataset": None, **to_plain(self.setting)}]
        rows += [{"dataset": d, **to_plain(r)} for d, r in self.per_dataset.items()]
        return rows


def correlate_setting(
    reference: Mapping[object, float],
    scores: Mapping[tuple[object, object], float],
    datasets: Sequence[object],
    *,
    bounded: bool = True,
    reference_bounded: bool = True,
    lower_is_better: bool = False,
    n_bootstrap: int = 0,
    seed: int = 0,
    eps: float = DEFAULT_EPS,
    confidence: float = 0.95,
) -> SettingCorrelation:
    """Correlate a setting (and each of its datasets) with a reference score per model."""
    # The models are those in ``scores``; ``reference`` (model -> score, e.g. published
    # ImageNet top-1 as fractions) must cover all of them and may hold more, which are not
    # used. The setting value of a model is :func:`setting_scores` (mean logit over the
    # datasets); per dataset the model's transformed score is used directly.
    if not isinstance(reference, Mapping):
        raise DataValidationError(
            f"reference must be a mapping model -> score, got {type(reference).__name__}"
        )
    models = _models_of(scores)
    lacking = [m for m in models if m not in reference]
    if lacking:
        raise DataValidationError(
            f"the reference has no score for {len(lacking)} model(s): {sorted(map(str, lacking))}; "
            f"it holds {len(reference)} models"
        )
    summary = setting_scores(scores, datasets, models, bounded=bounded, eps=eps)
    ref = _transform(_as_finite_1d([reference[m] for m in models], "reference"), reference_bounded, eps)
    sign = -1.0 if lower_is_better else 1.0
    setting = _correlate(
        ref, sign * np.array([summary[m] for m in models]), n_bootstrap, seed, confidence, "the setting score"
    )
    per_dataset = {}
    for d in datasets:
        tgt = _transform(_as_finite_1d([scores[(m, d)] for m in models], f"scores on {d!s}"), bounded, eps)
        per_dataset[d] = _correlate(ref, sign * tgt, n_bootstrap, seed, confidence, f"the score on {d!s}")
    return SettingCorrelation(
        setting=setting,
        per_dataset=per_dataset,
        models=tuple(models),
        datasets=tuple(datasets),
        setting_scores=summary,
    )
