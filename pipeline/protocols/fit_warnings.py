"""Warnings kept with each result: fits that look fine as numbers and are not."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pipeline.protocols.evidence import headline_rows

__all__ = ["ONE_CLASS_SHARE", "WARNING_CODES", "at_chance_warning", "chance_level", "class_share_collapsed",
           "evidence_warnings", "features_collapsed", "fit_warning", "grid_warnings", "merge_warnings",
           "prediction_warnings", "python_warning", "record_warnings", "unreliable_reasons", "warning_codes"]

UNRELIABLE = "unreliable"
CAUTION = "caution"

#: Code -> (severity, what it means). docs/protocols.md lists the same.
WARNING_CODES: dict[str, tuple[str, str]] = {
    "one_class": (UNRELIABLE, "the model predicts one class for (nearly) every test example"),
    "at_chance": (UNRELIABLE, "the score is at or below chance (1/K, the majority-class rate, or the protocol's own "
                              "chance level, e.g. a random ranking's mAP@R)"),
    "grid_edge": (UNRELIABLE, "the selected hyperparameter is at an end of its grid (three or more values) and "
                              "the selection criterion was still improving there: the best value may lie outside "
                              "the grid"),
    "short_grid": (CAUTION, "the hyperparameter was chosen from a two-value grid, always at an edge, and the "
                            "criterion differs between the two: a wider grid could move the choice"),
    "plateau": (CAUTION, "many grid values tie for the best validation score: the split cannot tell them apart"),
    "selection_fragile": (UNRELIABLE, "the validation comparison that chose C is closer than the features' "
                                      "rounding (a few float32 ulps) can move it, or validation cannot inform C "
                                      "at all: the score could move with rounding, not with the weights"),
    "tie_decided": (UNRELIABLE, "more than one test prediction is decided by ties within rounding (neighbours "
                                "equally similar at the k-NN cut, or equal class weights): the score could "
                                "move with the features' last bits"),
    "selection_moved": (CAUTION, "the validation choice gave a refitted model that collapsed; a weaker penalty "
                                 "was taken instead"),
    "temperature_edge": (CAUTION, "the calibration temperature is at an end of its search range (the "
                                  "temperature-scaled calibration metrics only)"),
    "collapsed_features": (CAUTION, "every test example has the same features: the representation itself has "
                                    "collapsed, so a chance score is the encoder's true result, not a fit's fault"),
    "undefined_ap": (CAUTION, "a class has no present test image: its AP is undefined (map11 counts it as 1/11, as "
                              "the seed's code does; map11_devkit leaves it out)"),
    "not_converged": (CAUTION, "a fit stopped at its iteration limit before its tolerance"),
    "runtime": (CAUTION, "a warning raised while the protocol ran"),
}

#: Share of the rows given one class above which a prediction counts as one-class.
ONE_CLASS_SHARE = 0.95
#: Fewest grid values tied at the best for a plateau, and their least share of the grid.
PLATEAU_MIN, PLATEAU_SHARE = 3, 0.25


def fit_warning(code: str, message: str) -> dict[str, str]:
    """One warning as records keep it."""
    if code not in WARNING_CODES:
        raise ValueError(f"unknown warning code {code!r}; codes: {', '.join(WARNING_CODES)}")
    return {"code": code, "message": str(message)}


def python_warning(category: str, message: str) -> dict[str, str]:
    """A Python warning raised during a run, as a record's warning."""
    code = "not_converged" if category == "ConvergenceWarning" else "runtime"
    return fit_warning(code, f"{category}: {message}")


def record_warnings(rec: Mapping[str, Any]) -> list[dict[str, str]]:
    """A record's warnings as ``{"code", "message"}`` dicts (records written before codes
    existed hold plain strings: those read as ``runtime``, or ``not_converged`` for a
    ConvergenceWarning), plus ``not_converged`` for a record marked not converged."""
    out = []
    for w in rec.get("warnings") or []:
        if isinstance(w, Mapping) and w.get("code") in WARNING_CODES:
            out.append({"code": str(w["code"]), "message": str(w.get("message", ""))})
        elif isinstance(w, Mapping):
            out.append(fit_warning("runtime", str(w.get("message", w))))
        else:
            text = str(w)
            category, _, rest = text.partition(": ")
            out.append(python_warning(category, rest) if rest and category.endswith("Warning")
                       else fit_warning("runtime", text))
    if rec.get("converged") is False and not any(w["code"] == "not_converged" for w in out):
        out.append(fit_warning("not_converged", "a fit did not reach its tolerance (converged: false)"))
    return out


def warning_codes(rec: Mapping[str, Any]) -> list[str]:
    """The distinct warning codes of a record, in the order first seen."""
    return list(dict.fromkeys(w["code"] for w in record_warnings(rec)))


def unreliable_reasons(rec: Mapping[str, Any]) -> list[str]:
    """Why a record's score cannot back a verdict: its ``unreliable`` warnings as
    ``code: message``; empty when it can."""
    return [f"{w['code']}: {w['message']}" for w in record_warnings(rec) if WARNING_CODES[w["code"]][0] == UNRELIABLE]


# -- what the predictions say ------------------------------------------------------------------
def chance_level(y_true: Any, mean_per_class: bool = False, n_classes: int | None = None) -> float:
    """What a constant prediction scores: the majority-class rate (at least 1/K), or
    1/K for the mean per-class accuracy (K: the classes present in ``y_true``)."""
    y = np.asarray(y_true).ravel()
    if y.size == 0:
        return float("nan")
    counts = np.unique(y, return_counts=True)[1]
    if mean_per_class:
        return 1.0 / counts.size
    return max(float(counts.max()) / y.size, 1.0 / max(int(n_classes or counts.size), 1))


def at_chance_warning(score: float, chance: float, what: str) -> list[dict[str, str]]:
    """``at_chance`` when ``score`` is at or below ``chance``."""
    if not (math.isfinite(score) and math.isfinite(chance)) or score > chance + 1e-12:
        return []
    return [fit_warning("at_chance", f"score {score:.4g} is at or below chance ({chance:.4g}: {what})")]


def prediction_warnings(y_true: Any, y_pred: Any, score: float, mean_per_class: bool = False,
                        n_classes: int | None = None) -> list[dict[str, str]]:
    """``one_class`` and ``at_chance`` of a classifier's test predictions."""
    # One class: at least ``ONE_CLASS_SHARE`` of the rows get the same class while the
    # labels hold at least two classes and no class that large. At chance: ``score`` at or
    # below :func:`chance_level`.
    y, p = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
    out: list[dict[str, str]] = []
    if y.size == 0 or p.shape != y.shape:
        return out
    labels, counts = np.unique(y, return_counts=True)
    classes, given = np.unique(p, return_counts=True)
    top, share = classes[np.argmax(given)], float(given.max()) / p.size
    if labels.size >= 2 and share >= ONE_CLASS_SHARE and float(counts.max()) / y.size < ONE_CLASS_SHARE:
        out.append(fit_warning("one_class", f"{share:.0%} of the {p.size} test examples are predicted as class "
                                            f"{top}, the labels' largest class holds {counts.max() / y.size:.0%}"))
    what = "1/K of the classes present" if mean_per_class else "the majority-class rate"
    out += at_chance_warning(score, chance_level(y, mean_per_class, n_classes), what)
    return out


def class_share_collapsed(y_pred: Any, y_true: Any) -> bool:
    """Whether predictions give (nearly) one class to every row (see ``prediction_warnings``)."""
    return any(w["code"] == "one_class" for w in prediction_warnings(y_true, y_pred, float("nan")))


# -- what a hyperparameter grid says -----------------------------------------------------------
def grid_warnings(name: str, grid: Sequence[float], scores: Sequence[float], selected: int, *,
                  higher_is_better: bool = True, rtol: float = 0.0, criterion: str = "validation score",
                  plateau: bool = True, setting: str | None = None) -> list[dict[str, str]]:
    """``grid_edge``, ``short_grid`` and ``plateau`` of a value selected from a grid."""
    # The rule: an edge is worth a warning only where a wider grid could change the
    # choice, i.e. the selected value is the grid's first or last (in grid order) and its
    # criterion beats the next value inward by more than ``rtol`` (relative; a NaN / inf
    # neighbour, a diverged fit, counts as beaten): the search was cut off while still
    # improving. A tie at the edge is not an edge (the inner values are as good). On a grid
    # of three or more values that is ``grid_edge`` (unreliable). A two-value grid picks an
    # edge whatever the scores and one difference cannot tell a peak from a trend, so there
    # it is ``short_grid`` (a caution: the score stands). Both messages say which setting to
    # widen, in which direction, with the next value at the grid's own spacing. Plateau: at
    # least ``PLATEAU_MIN`` values and ``PLATEAU_SHARE`` of the grid share the best
    # criterion (within ``rtol``).
    s = np.asarray(scores, dtype=np.float64)
    g = np.asarray(grid, dtype=np.float64)
    if s.size < 2 or s.size != g.size or not np.isfinite(s[selected]):
        return []
    sign = 1.0 if higher_is_better else -1.0
    best = s[selected]
    out = []
    for edge, inner in ((0, 1), (s.size - 1, s.size - 2)):
        gain = sign * (s[edge] - s[inner]) if np.isfinite(s[inner]) else math.inf
        if selected == edge and gain > rtol * max(abs(s[inner]) if np.isfinite(s[inner]) else 0.0, 1e-300):
            out.append(_edge_warning(name, g, s, edge, inner, criterion, setting))
    finite = s[np.isfinite(s)]
    tied = int(np.sum(np.abs(finite - best) <= rtol * max(abs(best), 1e-300)))
    if plateau and tied >= max(PLATEAU_MIN, math.ceil(PLATEAU_SHARE * s.size)):
        out.append(fit_warning("plateau", f"{tied} of {s.size} {name} values tie for the best {criterion} "
                                          f"({best:.6g}); the selection among them is a rule, not evidence"))
    return out


def _edge_warning(name: str, g: np.ndarray, s: np.ndarray, edge: int, inner: int, criterion: str,
                  setting: str | None) -> dict[str, str]:
    """The ``grid_edge`` / ``short_grid`` warning of an edge pick, with what to widen."""
    upward = g[edge] > g[inner]
    # the next value at the grid's own spacing: geometric for a positive grid, else linear
    beyond = g[edge] * (g[edge] / g[inner]) if g[edge] > 0 and g[inner] > 0 else 2 * g[edge] - g[inner]
    what = f"`{setting}`" if setting else f"the {name} grid"
    widen = f"widen {what} {'above' if upward else 'below'} {g[edge]:.3g} (e.g. add {beyond:.3g})"
    theirs = f"{s[inner]:.6g}" if np.isfinite(s[inner]) else "none (the fit diverged)"
    found = f"its {criterion} {s[edge]:.6g} beats the next value's ({g[inner]:.3g}) {theirs}"
    if g.size == 2:
        return fit_warning("short_grid", f"{name} = {g[edge]:.3g} is chosen from a two-value grid ({g.min():.3g}, "
                                         f"{g.max():.3g}), always an edge; {found}: {widen} to learn whether it "
                                         "still improves")
    return fit_warning("grid_edge", f"{name} = {g[edge]:.3g} is the {'first' if edge == 0 else 'last'} of the grid "
                                    f"({g.min():.3g} .. {g.max():.3g}) and {found}: the best value may lie outside "
                                    f"it; {widen}")


def merge_warnings(*groups: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """The warnings of several groups, each (code, message) once, in order."""
    seen, out = set(), []
    for group in groups:
        for w in group:
            key = (w["code"], w["message"])
            if key not in seen:
                seen.add(key)
                out.append({"code": w["code"], "message": w["message"]})
    return out


#: Features whose spread over the rows is within this share of their magnitude are one vector.
COLLAPSE_RTOL = 1e-5


def features_collapsed(X: Any) -> bool:
    """Whether every row of ``X`` (n, ...) is the same vector, to ``COLLAPSE_RTOL``."""
    if X is None or len(X) < 2:
        return False
    rows = np.asarray(X).reshape(len(X), -1)
    spread = float(np.max(np.max(rows, axis=0).astype(np.float64) - np.min(rows, axis=0)))
    return spread <= COLLAPSE_RTOL * max(float(np.max(np.abs(rows))), 1e-30)


def evidence_warnings(data: Any, result: Any, metric: str = "score") -> list[dict[str, str]]:
    """``one_class`` / ``at_chance`` of the test predictions a result keeps as evidence."""
    # Single-label predictions (k-NN, the probes, the nets) are judged with the record's
    # ``score``; low-shot fits by the headline N's fits (one-class when any of them is) and
    # the mean score; multi-label cells by their test columns without a present image
    # (``undefined_ap``). Collapsed test features (``features_collapsed``) give
    # ``collapsed_features`` instead: the chance score is then the encoder's. Episodes
    # (few-shot: chance is 1/n_way, which its runner knows) are left to their runner.
    ev, score = result.evidence, result.metrics.get(metric)
    y = np.asarray(data.y_test)
    if getattr(data, "multilabel", False):  # dense data (maps and pixels) has no such flag
        empty = np.flatnonzero(~(y == 1).any(axis=0)) if y.ndim == 2 else []
        return [fit_warning("undefined_ap", f"{len(empty)} class(es) without a present test image "
                                            f"({', '.join(map(str, empty[:10]))}): their AP is undefined; map11 counts "
                                            "each as 1/11, map11_devkit leaves them out")] if len(empty) else []
    if ev is None or not isinstance(score, (int, float)) or isinstance(score, bool):
        return []
    if features_collapsed(data.X_test):
        return [fit_warning("collapsed_features", f"all {len(data.X_test)} test examples have the same features "
                                                  f"(to {COLLAPSE_RTOL:g} of their magnitude): the encoder maps "
                                                  f"every image to one vector; score {float(score):.4g}")]
    if ev.kind == "predictions":
        return prediction_warnings(y, ev.values, float(score), ev.metric == "mean_per_class", data.n_classes)
    if ev.kind != "fits":
        return []
    rows = ev.values[headline_rows(ev.fits, ev.headline)]
    collapsed = sum(class_share_collapsed(r, y) for r in rows)
    out = []
    if collapsed:
        out.append(fit_warning("one_class", f"{collapsed} of the {len(rows)} fits at N = {ev.headline} predict one "
                                            f"class for at least {ONE_CLASS_SHARE:.0%} of the test examples"))
    return out + at_chance_warning(float(score), chance_level(y, n_classes=data.n_classes), "the majority-class rate")
