"""Low-shot sweep: accuracy against train images per class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, DataValidationError, unknown_name
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.linear.logistic import LogisticProbe
from pipeline.protocols.linear.ridge import DEFAULT_ALPHAS, RidgeProbe
from pipeline.protocols.transforms import apply_transform
from pipeline.protocols.transforms.transformers import make_transform
from pipeline.protocols.inputs.features import check_features
from pipeline.protocols.inputs.labels import check_class_indices, check_min_classes

ALL = "all"
DEFAULT_SHOTS: tuple[int | str, ...] = (1, 2, 4, 8, 16, 32, 64, 128, ALL)
ON_INSUFFICIENT = ("raise", "skip")

#: Low-shot probes and their defaults (overridden by ``probe_params``).
PROBES: dict[str, tuple[type, dict[str, Any]]] = {
    "ridge": (RidgeProbe, {"alphas": DEFAULT_ALPHAS, "fit_intercept": True}),
    "logistic": (LogisticProbe, {}),
}
# Fitted attributes copied into each run's record when the probe has them.
_DIAGNOSTICS = ("alpha_", "C_", "converged_", "n_val_")  # n_val_: a logistic probe's

__all__ = [
    "DEFAULT_SHOTS",
    "LowShotResult",
    "LowShotRun",
    "PROBES",
    "lowshot_curve",
    "relative_to_baseline",
    "sample_per_class",
]


@dataclass(frozen=True)
class LowShotRun:
    """One fitted sample: N shots (or "all"), repetition index, test accuracy."""

    shots: int | str
    repetition: int
    accuracy: float
    n_train: int
    diagnostics: dict[str, Any] = field(default_factory=dict)
    predictions: np.ndarray | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class LowShotResult:
    """Mean, std (ddof = 0) and per-seed test accuracies (fractions) for each N evaluated.

    Parameters
    ----------
    shots : tuple
        The N actually evaluated, in the order asked.
    mean, std, per_seed : dict
        Per N.
    runs : tuple of LowShotRun
    skipped : dict
        Each N that was not evaluated (``on_insufficient="skip"``) and the reason.
    probe, transform : str
    transform_params, probe_params : dict
    n_seeds, seed, n_classes, n_test : int
    """

    shots: tuple[int | str, ...]
    mean: dict[int | str, float]
    std: dict[int | str, float]
    per_seed: dict[int | str, tuple[float, ...]]
    runs: tuple[LowShotRun, ...]
    skipped: dict[int | str, str]
    probe: str
    transform: str
    transform_params: dict[str, Any]
    probe_params: dict[str, Any]
    n_seeds: int
    seed: int
    n_classes: int
    n_test: int

    def to_records(self) -> list[dict[str, Any]]:
        """One flat record per evaluated N (for the results ledger).

        Returns
        -------
        list of dict
        """
        return [
            {
                "shots": s,
                "mean": self.mean[s],
                "std": self.std[s],
                "per_seed": list(self.per_seed[s]),
                "probe": self.probe,
                "transform": self.transform,
                "probe_params": self.probe_params,
                "transform_params": self.transform_params,
                "n_seeds": self.n_seeds,
                "seed": self.seed,
            }
            for s in self.shots
        ]


def _check_shots(shots: Sequence[int | str]) -> tuple[int | str, ...]:
    if isinstance(shots, (str, int)):
        shots = (shots,)
    out: list[int | str] = []
    for s in shots:
        ok_int = isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1
        if not (ok_int or s == ALL):
            raise DataValidationError(
                f"shots must be integers >= 1 or {ALL!r}, got {s!r} in {list(shots)!r}"
            )
        out.append(int(s) if ok_int else ALL)
    if not out:
        raise DataValidationError("shots is empty: give at least one N (e.g. (1, 2, 4, 'all'))")
    dup = sorted({str(s) for s in out if out.count(s) > 1})
    if dup:
        raise DataValidationError(f"shots must be distinct; repeated: {dup}")
    return tuple(out)


def _make_probe(probe: str, probe_params: Mapping[str, Any] | None, random_state: int, device: Any = None) -> Any:
    if probe not in PROBES:
        raise unknown_name("low-shot probe", probe, PROBES)
    cls, defaults = PROBES[probe]
    params = {**defaults, **dict(probe_params or {})}
    valid = cls().get_params()
    bad = sorted(set(params) - set(valid))
    if bad:
        raise ConfigError(
            f"probe_params {bad} are not parameters of the {probe!r} probe ({cls.__name__}); "
            f"valid: {sorted(valid)}"
        )
    if "random_state" in valid and "random_state" not in dict(probe_params or {}):
        params["random_state"] = random_state
    if "device" not in dict(probe_params or {}):
        params["device"] = device
    return cls(**params)


def sample_per_class(labels: np.ndarray, classes: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of ``n`` rows of every class, drawn without replacement."""
    perm = rng.permutation(labels.size)
    by_class = perm[np.argsort(labels[perm], kind="stable")]  # random order within each class
    starts = np.searchsorted(labels[by_class], classes, side="left")
    take = (starts[:, None] + np.arange(n)[None, :]).ravel()
    return np.sort(by_class[take])


def _fit_score(train: FeatureRows, y_tr: np.ndarray, test: FeatureRows, y_te: np.ndarray, transform: str,
               transform_params: Mapping[str, Any] | None, probe: str, probe_params: Mapping[str, Any] | None,
               random_state: int, device: Any) -> tuple[float, dict[str, Any], np.ndarray]:
    train, test = apply_transform(transform, train, train, test, **dict(transform_params or {}))
    model = _make_probe(probe, probe_params, random_state, device).fit_rows(train, y_tr)
    pred = model.predict_rows(test)
    diag = {a.rstrip("_"): _plain(getattr(model, a)) for a in _DIAGNOSTICS if hasattr(model, a)}
    return float(np.mean(pred == y_te)), diag, _compact(pred)


def _compact(pred: np.ndarray) -> np.ndarray:
    """Predictions kept per fit in int32 when the labels fit (41 fits of a large test split
    would otherwise hold 41 int64 copies)."""
    pred = np.asarray(pred)
    if np.issubdtype(pred.dtype, np.integer) and pred.size and np.iinfo(np.int32).min <= pred.min() \
            and pred.max() <= np.iinfo(np.int32).max:
        return pred.astype(np.int32)
    return pred


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def lowshot_curve(
    X_train: Any,
    y_train: Any,
    X_test: Any,
    y_test: Any,
    shots: Sequence[int | str] = DEFAULT_SHOTS,
    n_seeds: int = 5,
    probe: str = "ridge",
    transform: str = "l2",
    seed: int = 0,
    probe_params: Mapping[str, Any] | None = None,
    on_insufficient: str = "raise",
    transform_params: Mapping[str, Any] | None = None,
    device: Any = None,
) -> LowShotResult:
    """Test accuracy of ``probe`` fitted on N train images per class, for each N in ``shots``.

    Parameters
    ----------
    X_train : array-like of shape (n, d) or FeatureRows
        Train features, in memory or streamed.
    y_train : array-like of shape (n,)
        Integer class labels.
    X_test : array-like of shape (m, d)
    y_test : array-like of shape (m,)
    shots : sequence of int or "all"
        The N to evaluate.
    n_seeds : int
        Samples per N.
    probe : str
        ``ridge`` or ``logistic``.
    transform : str
        A name of ``make_transform``, fitted on each sample like the probe.
    seed : int
        Seed of the samples.
    probe_params : mapping or None
        Override the probe's defaults (ridge: ``alphas=DEFAULT_ALPHAS``,
        ``fit_intercept=True``).
    on_insufficient : str
        An N larger than some class's train count raises DataValidationError
        (``raise``) or is skipped and recorded (``skip``).
    transform_params : mapping or None
        E.g. ``{"eps": 1e-6}`` for whiten on fewer samples than features.
    device : str, torch.device or None
        Compute device of the probes.

    Returns
    -------
    LowShotResult
    """
    if on_insufficient not in ON_INSUFFICIENT:
        raise DataValidationError(
            f"on_insufficient must be one of {list(ON_INSUFFICIENT)}, got {on_insufficient!r}"
        )
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, (int, np.integer)) or n_seeds < 1:
        raise DataValidationError(f"n_seeds must be an integer >= 1, got {n_seeds!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataValidationError(f"seed must be an integer >= 0, got {seed!r}")
    shots = _check_shots(shots)
    train = X_train if isinstance(X_train, FeatureRows) else FeatureRows.of(check_features(X_train, "X_train"))
    y_tr = check_class_indices(y_train, n_samples=len(train), name="y_train")
    check_min_classes(y_tr, name="y_train")
    X_te = check_features(X_test, "X_test")
    if X_te.shape[1] != train.n_features:
        raise DataValidationError(f"X_test has {X_te.shape[1]} features, but X_train has {train.n_features}; "
                                  "both splits must come from the same layer")
    y_te = check_class_indices(y_test, n_samples=X_te.shape[0], name="y_test")
    test = FeatureRows.of(X_te)
    _make_probe(probe, probe_params, 0)  # unknown probe or parameter: fail before any fit
    try:
        make_transform(transform, **dict(transform_params or {}))
    except TypeError as exc:
        raise ConfigError(
            f"transform_params {dict(transform_params or {})!r} do not fit transform {transform!r}: {exc}"
        ) from None

    classes, counts = np.unique(y_tr, return_counts=True)
    skipped: dict[int | str, str] = {}
    for s in shots:
        if s == ALL or s <= counts.min():
            continue
        short = classes[counts < s]
        reason = (
            f"{s} shots per class need {s} train images in every class, but {short.size} of "
            f"{classes.size} classes have fewer: {short[:20].tolist()} (smallest: class "
            f"{classes[counts.argmin()]} with {counts.min()} images). At most {counts.min()} shots "
            "are possible here"
        )
        if on_insufficient == "raise":
            raise DataValidationError(
                f"{reason}; drop {s} from shots or pass on_insufficient='skip' to skip it and record why."
            )
        skipped[s] = reason
    evaluated = tuple(s for s in shots if s not in skipped)
    if not evaluated:
        raise DataValidationError(f"no N in shots {list(shots)} is feasible: {'; '.join(skipped.values())}")

    runs: list[LowShotRun] = []
    per_seed: dict[int | str, tuple[float, ...]] = {}
    for s in evaluated:
        accs = []
        for rep in range(1 if s == ALL else n_seeds):
            if s == ALL:
                idx, sample = np.arange(y_tr.size), train
            else:  # streamed features: the sample read once and kept; in memory: not copied
                idx = sample_per_class(y_tr, classes, s, np.random.default_rng([seed, s, rep]))
                sample = train.cached(idx).select(idx)
            acc, diag, pred = _fit_score(sample, y_tr[idx], test, y_te, transform, transform_params, probe,
                                         probe_params, seed + rep, device)
            accs.append(acc)
            runs.append(LowShotRun(shots=s, repetition=rep, accuracy=acc, n_train=idx.size, diagnostics=diag,
                                   predictions=pred))
        per_seed[s] = tuple(accs)
    return LowShotResult(
        shots=evaluated,
        mean={s: float(np.mean(v)) for s, v in per_seed.items()},
        std={s: float(np.std(v)) for s, v in per_seed.items()},
        per_seed=per_seed,
        runs=tuple(runs),
        skipped=skipped,
        probe=probe,
        transform=transform,
        transform_params=dict(transform_params or {}),
        probe_params=dict(probe_params or {}),
        n_seeds=int(n_seeds),
        seed=int(seed),
        n_classes=int(classes.size),
        n_test=int(y_te.size),
    )


def relative_to_baseline(result: LowShotResult, baseline: LowShotResult) -> dict[int | str, float]:
    """Mean accuracy minus the baseline's, per N (ImageNet-CoG's relative curves).

    Both must come from the same protocol (probe, transform and their parameters) on the
    same test split size, and the baseline must have every N of ``result``.

    Parameters
    ----------
    result, baseline : LowShotResult

    Returns
    -------
    dict
        N -> mean accuracy difference.
    """
    mine = (result.probe, result.transform, result.probe_params, result.transform_params)
    theirs = (baseline.probe, baseline.transform, baseline.probe_params, baseline.transform_params)
    if not (mine[:2] == theirs[:2] and all(_same_params(a, b) for a, b in zip(mine[2:], theirs[2:]))):
        raise DataValidationError(
            "result and baseline used different protocols: (probe, transform, probe_params, "
            f"transform_params) {mine!r} vs {theirs!r}; a relative curve needs the same protocol"
        )
    if result.n_test != baseline.n_test or result.n_classes != baseline.n_classes:
        raise DataValidationError(
            f"result has {result.n_test} test images and {result.n_classes} classes, the "
            f"baseline {baseline.n_test} and {baseline.n_classes}: not the same dataset"
        )
    missing = [s for s in result.shots if s not in baseline.mean]
    if missing:
        raise DataValidationError(
            f"the baseline has no result for shots {missing}; it has {list(baseline.shots)}"
        )
    return {s: result.mean[s] - baseline.mean[s] for s in result.shots}


def _same_params(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if set(a) != set(b):
        return False
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
