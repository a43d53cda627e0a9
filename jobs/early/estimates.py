"""Early estimates of a new encoder's full figures, with intervals and early verdicts."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from statistics import NormalDist
from typing import Any

import numpy as np

from jobs.analysis.compare import record_score
from jobs.analysis.series import series_members
from jobs.config import BenchmarkConfig
from jobs.early.results import early_result
from jobs.early.subsets import Subset
from jobs.evaluation.cell import Cell
from pipeline.analysis.compare import benjamini_hochberg, compare_predictions
from pipeline.analysis.early import (
    Estimate, HistoryModel, PairedHistoryModel, conformal_half_width, detectable_difference, early_verdict, line_trial,
    stratified_change, stratified_estimate,
)
from pipeline.errors import RepevalError
from pipeline.plain import to_plain
from pipeline.protocols.fit_warnings import unreliable_reasons
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords, early_id
from storage_schema.provenance import WEIGHTS_FIELD

__all__ = ["CellKey", "cell_history", "estimate_encoder"]

log = logging.getLogger(__name__)

CellKey = tuple[str, str, str]  # (setting, dataset, layer)


def _key(rec: Mapping[str, Any]) -> CellKey:
    return str(rec.get("setting")), str(rec.get("dataset")), str(rec.get("layer"))


def _weights(rec: Mapping[str, Any]) -> str | None:
    return (rec.get("provenance") or {}).get(WEIGHTS_FIELD)


def cell_history(records: Iterable[Mapping[str, Any]], cell: Cell, result: Mapping[str, Any],
                 test_labels: str) -> dict[str, dict[str, Any]]:
    """The exact records of other encoders on the same cell: model -> its latest record."""
    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        if (rec.get("model") == cell.model or rec.get("dataset") != cell.dataset or rec.get("layer") != cell.layer
                or rec.get("protocol") != cell.protocol or rec.get("config_hash") != result["config_hash"]
                or str(rec.get("protocol_version")) != str(result["protocol_version"])):
            continue
        if (rec.get("fingerprints") or {}).get(f"{cell.test_split}.labels") != test_labels:
            continue
        if result.get(WEIGHTS_FIELD) and _weights(rec) == result.get(WEIGHTS_FIELD):
            continue  # the same weights under another name: not an earlier encoder
        if record_score(rec) is None:
            continue
        old = out.get(str(rec["model"]))
        if old is None or str(rec.get("recorded") or "") > str(old.get("recorded") or ""):
            out[str(rec["model"])] = dict(rec)
    return out


def _history_results(store: FeatureStore, cell: Cell, subset: Subset,
                     history: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each earlier encoder's early result from its stored features (skipped, and logged,
    when its arrays are gone or changed)."""
    out = {}
    for model in sorted(history):
        other = dataclasses.replace(cell, model=model, encoder=None, identity=None, encoder_identity=None)
        try:
            res = early_result(store, other, subset, "store", record=not store.read_only)
        except (RepevalError, ValueError, OSError) as exc:
            log.info("%s: no early result of %s for calibration: %s", cell.label(), model, exc)
            continue
        if res.get("score") is not None and _weights(history[model]) in (None, res.get(WEIGHTS_FIELD)):
            out[model] = res
    return out


def _series_of(cfg: BenchmarkConfig, model: str) -> tuple[list[tuple[str, int]], int | None]:
    """The members (encoder, step) of ``model``'s series, by step, and its step."""
    for members in series_members(cfg).values():
        steps = dict(members)
        if model in steps and steps[model] is not None:
            placed = sorted(((e, s) for e, s in members if s is not None), key=lambda m: m[1])
            return placed, steps[model]
    return [], None


def _pairs(cfg: BenchmarkConfig, usable: set[str]) -> list[tuple[str, str]]:
    """Consecutive (older, newer) checkpoints of the config's series, both usable."""
    pairs = []
    for members in series_members(cfg).values():
        placed = sorted(((e, s) for e, s in members if s is not None and e in usable), key=lambda m: m[1])
        pairs.extend((a[0], b[0]) for a, b in zip(placed, placed[1:]))
    return pairs


def _estimate(cell: Cell, result: Mapping[str, Any], subset: Subset, store: FeatureStore, cfg: BenchmarkConfig,
              history: Mapping[str, Mapping[str, Any]], results: Mapping[str, Mapping[str, Any]],
              reference: str | None, bounded: bool, uncalibrated: str | None = None,
              ) -> tuple[Estimate | None, str, list[str]]:
    """(estimate, why this method or why none, the earlier encoders it rests on). A history
    line is used only within the range it was fitted on, while its setting's intervals hold
    (``uncalibrated``: why not), and where it beat, on its own history and leave-one-out, the
    estimate made without it; else that estimate (the reference's exact figure plus the early
    rows' own change, or the early rows' own sampling interval), saying so."""
    early = cfg.early
    score = float(result["score"])
    exact = {m: float(record_score(history[m])) for m in results}
    pairs = _pairs(cfg, set(results))
    labels = store.labels(cell.dataset, cell.test_split).read() if (
        result.get("predictions") is not None and subset.method == "stratified") else None

    def plain(model: str) -> Estimate:
        return _plain_of(results[model], subset, labels, cell.test_split, early.level)

    changes: dict[tuple[str, str], tuple[float, float, float] | None] = {}

    def pair_change(older: str, newer: str) -> tuple[float, float, float] | None:
        if (older, newer) not in changes:
            changes[(older, newer)] = _early_change(results[newer], results[older], subset, labels,
                                                    cell.test_split, early.level)
        return changes[(older, newer)]

    def without_line(older: str, newer: str) -> Estimate:
        # what an earlier pair's newer checkpoint would have been estimated as without the
        # line: its predecessor's exact figure plus the early rows' change, as below
        change = pair_change(older, newer)
        if change is None:
            return plain(newer)
        return _change_estimate(exact[older], change, len(subset.rows[cell.test_split]), early.level, bounded)

    # the early rows' own change since the reference: a line must agree with it (and its
    # interval reach it on its side), and without a line it is the estimate
    measured = _early_change(result, results[reference], subset, labels, cell.test_split, early.level) if (
        reference is not None and reference in results) else None
    if measured is not None:
        missed = [(exact[b] - exact[a]) - c[0] for a, b in pairs if (c := pair_change(a, b)) is not None]
        measured = _with_history_misses(measured, missed, early.level)
    declined = []
    if uncalibrated:
        declined.append(uncalibrated)
    elif reference is not None and reference in results and len(pairs) >= early.min_history:
        model = PairedHistoryModel.fit([results[a]["score"] for a, _ in pairs], [results[b]["score"] for _, b in pairs],
                                       [exact[a] for a, _ in pairs], [exact[b] for _, b in pairs], bounded,
                                       early.level, early.min_history)
        beyond = model.outside(score, float(results[reference]["score"]))
        if beyond is None:
            trial = line_trial(model.leave_one_out(), [without_line(a, b) for a, b in pairs], model.full_after,
                               bounded)
            if trial.kept:
                est = model.predict(score, float(results[reference]["score"]), exact[reference])
                beyond = _against_early_change(est, exact[reference], measured, early.level)
                if beyond is None:
                    est, held = _holding_early_change(est, exact[reference], measured, bounded)
                    return (est, f"{reference}'s exact figure plus the change of early score, calibrated on "
                            f"{len(pairs)} earlier consecutive checkpoints ({trial.line()}){held}",
                            sorted({m for p in pairs for m in p}))
            else:
                beyond = trial.line()
        declined.append(beyond)
    elif len(results) >= early.min_history:
        names = sorted(results)
        model = HistoryModel.fit([results[m]["score"] for m in names], [exact[m] for m in names], bounded,
                                 early.level, early.min_history)
        beyond = model.outside(score)
        if beyond is None:
            trial = line_trial(model.leave_one_out(), [plain(m) for m in names], model.full, bounded)
            if trial.kept:
                return (model.predict(score), f"from the early score, calibrated on {len(names)} earlier encoders "
                        f"({trial.line()})", names)
            beyond = trial.line()
        declined.append(beyond)
    short = "; ".join(declined) if declined else \
        f"{len(results)} earlier encoder(s) with this cell, {early.min_history} needed to calibrate"
    if result.get("predictions") is None:
        return None, f"no estimate: {short}, and its scores are not per-image predictions", []
    if subset.method != "stratified":
        return None, f"no estimate: {short} (anchor rows are no random sample)", []
    if measured is not None:
        est = _change_estimate(exact[reference], measured, len(subset.rows[cell.test_split]), early.level, bounded)
        return est, (f"{reference}'s exact figure plus the early rows' own change since it "
                     f"({100 * measured[0]:+.1f} points); {short}"), [reference]
    est = _stratified(result, subset, labels, cell.test_split, early.level)
    return est, f"the readout fitted on the early rows, over the whole test split; {short}", []


def _early_change(result: Mapping[str, Any], reference: Mapping[str, Any], subset: Subset,
                  labels: np.ndarray | None, test: str, level: float) -> tuple[float, float, float] | None:
    """The early rows' own estimate of the change since ``reference`` (the same rows, both
    early fits): (change, low, high), or None without per-image predictions of both on a
    stratified sample. Never narrower than one early row's worth either way: two fits that
    agree on every early row leave a zero-width interval, which such a sample cannot
    claim."""
    if labels is None or result.get("predictions") is None or reference.get("predictions") is None:
        return None
    rows = labels[subset.rows[test]]
    classes, counts = np.unique(labels, return_counts=True)
    right = [(np.asarray(r["predictions"]) == rows).astype(int) for r in (result, reference)]
    change, low, high = stratified_change(*right, rows, dict(zip(classes.tolist(), counts.tolist())), level,
                                          mean_per_class=result.get("metric") == "mean_per_class")
    half = max((high - low) / 2, 1.0 / rows.size)
    return change, change - half, change + half


def _with_history_misses(measured: tuple[float, float, float], missed: list[float],
                         level: float) -> tuple[float, float, float]:
    """The early rows' change with its interval at least as wide, either way, as the
    history's own misses of it: ``missed``, per earlier consecutive pair, the full change
    minus the early rows' change. The sampling interval covers which test rows were drawn;
    the two early fits also rest on a tenth of the train rows, which the full fits do not,
    and a change of the features (a loss spike most of all) moves a fit on few rows unlike
    a fit on all of them. The half-width is the split-conformal quantile of the misses'
    sizes (``conformal_half_width``), which covers at ``level`` a new pair exchangeable
    with the history's; with too few pairs for it, the sampling interval stands."""
    q = conformal_half_width(missed, level)
    if q is None:
        return measured
    change, low, high = measured
    return change, min(low, change - q), max(high, change + q)


def _against_early_change(est: Estimate, reference_exact: float, measured: tuple[float, float, float] | None,
                          level: float) -> str | None:
    """Why a paired line's estimate contradicts the early rows' own evidence, or None: the
    change it implies (its value minus the reference's exact figure) lies outside the early
    rows' paired interval for the change. The history's line shrinks every change towards
    the history's typical step; a loss spike's early change, far larger, is what the early
    rows measure directly (``measured``: ``_early_change``)."""
    if measured is None:
        return None
    change, low, high = measured
    implied = est.value - reference_exact
    if low <= implied <= high:
        return None
    return (f"the history's line implies a change of {100 * implied:+.1f} points, outside the early rows' own "
            f"{level:.0%} interval for it ({100 * low:+.1f} to {100 * high:+.1f}, measured {100 * change:+.1f})")


def _holding_early_change(est: Estimate, reference_exact: float, measured: tuple[float, float, float] | None,
                          bounded: bool) -> tuple[Estimate, str]:
    """A line's estimate with its interval reaching, on the side the early rows point to,
    as far as their own interval for the change does (from the reference's exact figure),
    and what it says of that. A line fitted on steady progress shrinks every change towards
    the history's typical gain; a loss spike the early rows barely see (a few dozen test
    rows) is not like the history, and its line interval, narrow, can exclude a drop the
    early rows leave open. The line's point stays (it was the better one on the history);
    its interval may narrow the early rows' on the line's own side, never shut out theirs."""
    if measured is None:
        return est, ""
    change, low, high = (reference_exact + v for v in measured)
    if bounded:
        low, high = max(low, 0.0), min(high, 1.0)
    if change < est.value and low < est.low:
        widened = dataclasses.replace(est, low=low, covers=est.covers + _HOLDS_EARLY_CHANGE)
    elif change > est.value and high > est.high:
        widened = dataclasses.replace(est, high=high, covers=est.covers + _HOLDS_EARLY_CHANGE)
    else:
        return est, ""
    return widened, (f"; its interval reaches the early rows' own for the change on their side "
                     f"({100 * measured[1]:+.1f} to {100 * measured[2]:+.1f} points, measured {100 * measured[0]:+.1f})")


_HOLDS_EARLY_CHANGE = ", or as far as the early rows' own change since it leaves open on the side they point to"


def _change_estimate(reference_exact: float, measured: tuple[float, float, float], n_rows: int, level: float,
                     bounded: bool) -> Estimate:
    """The reference's exact figure plus the early rows' own change since it, with that
    change's interval (``measured``: ``_early_change``, widened by ``_with_history_misses``):
    an estimate of the full figure without a history line, unlike the plain early-row
    estimate (which is of the early fit, usually below the full one: the smaller train set's
    cost cancels in the change)."""
    value, low, high = (reference_exact + v for v in measured)
    if bounded:
        value, low, high = (min(max(v, 0.0), 1.0) for v in (value, low, high))
    return Estimate(value, low, high, level, "change", int(n_rows), _CHANGE_COVERS)


_CHANGE_COVERS = ("the full figure, if the full fits changed since the reference as the early fits did, give or "
                  "take the history's misses of such changes (and the sampling of the early test rows)")


def _stratified(result: Mapping[str, Any], subset: Subset, labels: np.ndarray, test: str, level: float) -> Estimate:
    """The plain early-row estimate: the stratified estimator over the early test rows."""
    rows = subset.rows[test]
    classes, counts = np.unique(labels, return_counts=True)
    correct = (np.asarray(result["predictions"]) == labels[rows]).astype(int)
    return stratified_estimate(correct, labels[rows], dict(zip(classes.tolist(), counts.tolist())), level,
                               mean_per_class=result.get("metric") == "mean_per_class")


def _plain_of(result: Mapping[str, Any], subset: Subset, labels: np.ndarray | None, test: str,
              level: float) -> Estimate:
    """An earlier encoder's plain estimate, which a history line must beat: the stratified
    one where the new cell would get one, else its early score read as the full figure."""
    if labels is not None and result.get("predictions") is not None:
        return _stratified(result, subset, labels, test, level)
    # no plain estimate to fall back on: the line must still beat reading the early score as it is
    return Estimate(float(result["score"]), None, None, level, "sampling", int(result.get("n_test") or 0), "")


def _against(cfg: BenchmarkConfig, model: str, history: Mapping[str, Mapping[str, Any]],
             lower_is_better: bool) -> list[tuple[str, str]]:
    """(kind, encoder) the new checkpoint is compared with: its series' previous checkpoint
    with an exact figure, and the best so far (ties keep the earlier)."""
    members, step = _series_of(cfg, model)
    if step is None:
        return []
    before = [(e, s) for e, s in members if s < step and e in history]
    if not before:
        return []
    out = [("previous", before[-1][0])]
    best = None
    for e, _ in before:
        score = record_score(history[e])
        if best is None or (score < best[1] if lower_is_better else score > best[1]):
            best = (e, score)
    if best[0] != before[-1][0]:
        out.append(("best", best[0]))
    return out


def _reference(cfg: BenchmarkConfig, model: str, history: Mapping[str, Mapping[str, Any]],
               results: Mapping[str, Mapping[str, Any]], result: Mapping[str, Any],
               alpha: float = 0.05) -> str | None:
    """The earlier checkpoint of the series the estimate starts from, of those with an exact
    figure and an early result: the latest, unless another one predicts as the new
    checkpoint does on significantly more early test rows (then the one that agrees most;
    ties: the later step). After a loss spike the next checkpoint, trained on from the
    unspiked weights, is far from the spike and near the checkpoint before it: a change
    measured from the spike would be a recovery of tens of points, which early fits on a
    tenth of the rows understate and a history line shrinks.

    Significantly: a sign test on the rows where exactly one of the two agrees with the new
    checkpoint, one-sided at ``alpha`` shared among the candidates (on a few dozen early rows
    one checkpoint or the next is nearer by chance)."""
    members, step = _series_of(cfg, model)
    before = [e for e, s in members if step is not None and s < step and e in history and e in results]
    if not before:
        return None
    latest = before[-1]
    mine = result.get("predictions")
    if mine is None or any(results[e].get("predictions") is None for e in before):
        return latest
    mine = np.asarray(mine)
    agrees = {e: np.asarray(results[e]["predictions"]) == mine for e in before}
    nearest = max(reversed(before), key=lambda e: int(np.count_nonzero(agrees[e])))
    only_nearest = int(np.count_nonzero(agrees[nearest] & ~agrees[latest]))
    only_latest = int(np.count_nonzero(agrees[latest] & ~agrees[nearest]))
    if nearest == latest or only_nearest <= only_latest:
        return latest
    z = (only_nearest - only_latest) / np.sqrt(only_nearest + only_latest)
    return nearest if z >= NormalDist().inv_cdf(1 - alpha / (len(before) - 1)) else latest


def estimate_encoder(store: FeatureStore, cfg: BenchmarkConfig, cells: list[Cell], subsets: Mapping[str, Subset],
                     results: Mapping[CellKey, Mapping[str, Any]], records: list[Mapping[str, Any]],
                     off: Mapping[tuple[str, str], str] | None = None, *, alpha: float = 0.05,
                     uncalibrated: Mapping[tuple[str, str], str] | None = None) -> list[dict[str, Any]]:
    """The early estimate of each cell of one new encoder, with its early verdicts (recorded).
    ``off``: settings whose early pass is off; ``uncalibrated``: settings whose history
    lines are not used (a gross miss not yet followed by an interval that held)."""
    off, uncalibrated = off or {}, uncalibrated or {}
    out, pending = [], []
    for cell in cells:
        key = (cell.setting, cell.dataset, cell.layer)
        result = results.get(key)
        base = {"model": cell.model, "dataset": cell.dataset, "layer": cell.layer, "setting": cell.setting,
                "protocol": cell.protocol}
        if result is None or result.get("error") or result.get("score") is None:
            why = (result or {}).get("error") or ("no early result" if result is None else "its early fit gave no score")
            out.append({**base, "status": "failed", "reason": why})
            continue
        entry = cell.entry
        metric = entry.primary_metric
        bounded = metric not in entry.unbounded
        lower = metric in entry.lower_is_better and result.get("predictions") is None
        why_off = off.get((cell.protocol, result["config_hash"]))
        subset = subsets[cell.dataset]
        common = {**base, "subset": subset.id, "result": result["id"], "early_score": result["score"],
                  "config_hash": result["config_hash"], "protocol_version": result["protocol_version"],
                  WEIGHTS_FIELD: result.get(WEIGHTS_FIELD), "metric": result.get("metric"),
                  "unreliable": list(result.get("unreliable") or [])}
        if why_off:
            out.append({**common, "status": "off", "reason": why_off})
            continue
        history = cell_history(records, cell, result, subset.labels[cell.test_split])
        against = _against(cfg, cell.model, history, lower)
        hist_results = _history_results(store, cell, subset, history)
        reference = _reference(cfg, cell.model, history, hist_results, result)
        try:
            est, how, rests_on = _estimate(cell, result, subset, store, cfg, history, hist_results, reference, bounded,
                                           uncalibrated.get((cell.protocol, result["config_hash"])))
        except RepevalError as exc:
            out.append({**common, "status": "none", "reason": f"no estimate: {exc}"})
            continue
        if est is None:
            out.append({**common, "status": "none", "reason": how})
            continue
        rec = {**common, "status": "estimated", "estimate": to_plain(est), "how": how,
               "history": [{"model": m, "cell_id": history[m].get("cell_id")} for m in rests_on],
               "verdicts": []}
        for kind, model in against:
            rec["verdicts"].append(_comparison(cell, result, est, kind, model, history, hist_results, store, subset,
                                               lower))
        pending.append(rec)
        out.append(rec)
    _decide(pending, alpha)
    records_store = EarlyRecords(store)
    for rec in out:
        if rec.get("status") in ("estimated", "none", "off"):
            rec["id"] = early_id("estimate", rec.get("result"), rec.get("status"),
                                 (rec.get("estimate") or {}).get("method"),
                                 [h["cell_id"] for h in rec.get("history", [])], cfg.early.level)
            rec["level"] = cfg.early.level
            if not store.read_only:
                records_store.put("estimates", rec)
    return out


def _comparison(cell: Cell, result: Mapping[str, Any], est: Estimate, kind: str, model: str,
                history: Mapping[str, Mapping[str, Any]], hist_results: Mapping[str, Mapping[str, Any]],
                store: FeatureStore, subset: Subset, lower: bool) -> dict[str, Any]:
    """One early comparison, before the family's adjustment: what it is against, the value
    on the estimate's scale, the paired test on the early rows, what makes it unreliable."""
    theirs = hist_results.get(model)
    value = record_score(history[model]) if est.method != "sampling" else (theirs or {}).get("full_split_score")
    why = [f"{cell.model} (early fit) {r}" for r in result.get("unreliable") or []]
    why += [f"{model} {r}" for r in unreliable_reasons(history[model])]
    why += [f"{model} (early fit) {r}" for r in (theirs or {}).get("unreliable") or []]
    out = {"kind": kind, "against": model, "against_value": value,
           "against_what": "exact" if est.method != "sampling" else "early fit over the whole test split",
           "difference": None, "p_value": None, "detectable": None,
           "unreliable": " | ".join(why) or None, "higher_is_better": not lower}
    if theirs is not None and result.get("predictions") is not None and theirs.get("predictions") is not None:
        every_label = store.labels(cell.dataset, cell.test_split).read()
        labels = every_label[subset.rows[cell.test_split]]
        comp = compare_predictions(labels, result["predictions"], theirs["predictions"],
                                   "mean_per_class" if result.get("metric") == "mean_per_class" else "top1",
                                   n_resamples=200, n_permutations=999)
        out["difference"], out["p_value"], out["test"] = comp.difference, comp.p_value, comp.test
        # what the exact test could tell apart on the whole split, from how often the two disagree here
        disagree = (np.asarray(result["predictions"]) == labels) != (np.asarray(theirs["predictions"]) == labels)
        discordant = float(np.average(disagree, weights=subset.weights))  # each row for the rows it stands for
        out["detectable"] = detectable_difference(discordant, int(every_label.size))
    return out


def _decide(pending: list[dict[str, Any]], alpha: float) -> None:
    """Adjust the family's p-values (Benjamini-Hochberg) and draw each early verdict."""
    tested = [v for rec in pending for v in rec["verdicts"] if v["p_value"] is not None and not v["unreliable"]]
    adjusted = benjamini_hochberg([v["p_value"] for v in tested]) if tested else []
    for v, p in zip(tested, adjusted):
        v["p_adjusted"] = float(p)
    for rec in pending:
        est = Estimate(**{k: rec["estimate"][k] for k in ("value", "low", "high", "level", "method", "n", "covers")})
        for v in rec["verdicts"]:
            if v["against_value"] is None:
                v["verdict"], v["reason"] = "no verdict", f"no figure of {v['against']} on the estimate's scale"
                continue
            v["verdict"], v["reason"] = early_verdict(
                est, float(v["against_value"]), difference=v["difference"], p_adjusted=v.get("p_adjusted"),
                alpha=alpha, higher_is_better=v["higher_is_better"], unreliable=v["unreliable"],
                detectable=v.get("detectable") or 0.0)
