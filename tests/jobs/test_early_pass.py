"""The early pass's jobs on a real store: the early rows extracted once and copied (never
computed twice) into the full arrays, a subset chosen once, estimates drawn from a history
of earlier encoders, early verdicts under the exact cells' no-verdict rules, checks and the
coverage that turns a setting's early pass off, and nothing early ever in the ledger.

The history is imported features (no forward pass): checkpoints of one series on a
three-class blob dataset, the same images sharpening towards their class with the step."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from jobs.config import BenchmarkConfig, DatasetConfig, EncoderConfig, ExtractConfig, ProtocolConfig
from jobs.config.early import EarlyConfig
from jobs.config.typed import from_plain
from jobs.early.checks import check_estimates
from jobs.early.coverage import coverage_by_setting, off_settings
from jobs.early.estimates import estimate_encoder
from jobs.early.results import early_result
from jobs.early.run import early_unit
from jobs.early.subsets import current_subset
from jobs.evaluation.evaluate import Cell, evaluate_cell
from jobs.extraction.extract import extract
from jobs.extraction.import_features import import_features
from jobs.report.results import results_frame
from pipeline.analysis.early import stratified_change, stratified_estimate
from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords
from storage_schema.ledger import Ledger

KNN = {"n_neighbors": 5}
N_HISTORY = 12


def _blobs(path, y, quality: float, seed: int):
    # checkpoints of one series see the same images: what the early rows favour is shared by
    # consecutive ones (the paired estimate's control variate), each step moving them a little
    shared = np.random.default_rng(0)
    centres = shared.normal(size=(3, 8))
    images = {s: shared.normal(size=(len(y[s]), 8)) for s in y}
    rng = np.random.default_rng(seed)
    feats = {f"{s}_features": (images[s] + 0.1 * rng.normal(size=images[s].shape) + quality * centres[y[s]])
             .astype(np.float32) for s in y}
    np.savez(path, **{f"{s}_labels": y[s] for s in y}, **feats)
    return make_dataset("features", name="blobs", path=str(path))


def _cell(model: str) -> Cell:
    return Cell(model, "blobs", "pre_logits", "knn5", "knn", dict(KNN))


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A store with N_HISTORY + 1 imported encoders of one series (steps 1..13, quality
    rising with the step) and the exact knn record of each."""
    tmp = tmp_path_factory.mktemp("early-history")
    rng = np.random.default_rng(0)
    y = {"train": rng.integers(0, 3, 300), "test": rng.integers(0, 3, 200)}
    store = FeatureStore(str(tmp / "store"))
    for step in range(1, N_HISTORY + 2):
        data = _blobs(tmp / f"s{step}.npz", y, 0.15 + 0.05 * step, step)
        for split in ("train", "test"):
            import_features(store, f"s{step:02d}", data, split)
        evaluate_cell(store, _cell(f"s{step:02d}"))
    plain = {"store": str(tmp / "store"), "datasets": [{"name": "blobs", "adapter": "features",
                                                       "params": {"path": str(tmp / "s1.npz")}}],
             "protocols": [{"name": "knn5", "protocol": "knn", "settings": KNN}],
             "encoders": [{"name": f"s{step:02d}", "source": "store", "series": "s", "step": step}
                          for step in range(1, N_HISTORY + 2)],
             "early": {"fraction": 0.2, "min_history": 10}}
    cfg = from_plain(BenchmarkConfig, plain, "config")
    return store, cfg, y


def _estimate(store, cfg, model: str, records=None, off=None):
    subset = current_subset(store, cfg.datasets[0], cfg.early)
    result = early_result(store, _cell(model), subset, "store")  # what an early extraction of it would give
    records = list(Ledger(store)) if records is None else records
    records = [r for r in records if r["model"] != model]  # its exact figure does not exist yet
    return estimate_encoder(store, cfg, [_cell(model)], {"blobs": subset}, {("knn5", "blobs", "pre_logits"): result},
                            records, off)[0], subset, result


def test_the_early_rows_are_extracted_once_and_copied_into_the_full_arrays(tmp_path):
    store = FeatureStore(str(tmp_path / "store"))
    tex = {"train": 40, "test": 20}
    adapter = make_dataset("textures", name="tex", n_per_class=tex)
    dataset = DatasetConfig(name="tex", adapter="textures", params={"n_per_class": tex})
    encoder = EncoderConfig(name="r18", arch="resnet18", input_size=32, seed=0)
    settings = ExtractConfig(batch_size=16, chunk_batches=2, progress=False)
    cell = Cell("r18", "tex", "pre_logits", "knn5", "knn", dict(KNN))
    out = early_unit(store, encoder, dataset, [cell], EarlyConfig(fraction=0.25), settings)
    subset = current_subset(store, dataset, EarlyConfig(fraction=0.25))
    assert out["extraction"]["images"] == subset.size() == round(0.25 * 160) + round(0.25 * 80)
    assert out["results"]["knn5/tex/pre_logits"]["n_test"] == len(subset.rows["test"])
    assert len(Ledger(store)) == 0  # an early result is not a record
    for split in ("train", "test"):
        report = extract(store, encoder.spec(), adapter, split, settings)
        assert report.early_rows == len(subset.rows[split])
        assert report.images == adapter.num_samples(split) - report.early_rows  # no image passed twice
        full = store.features("r18", "tex", split, "pre_logits")
        assert full.attrs["early_rows"] == {"subset": subset.id, "rows": len(subset.rows[split])}
    # the same encoder extracted without an early pass: the same features (one image per row,
    # whichever batch it rode in)
    plain = FeatureStore(str(tmp_path / "plain"))
    for split in ("train", "test"):
        extract(plain, encoder.spec(), adapter, split, settings)
        a = store.features("r18", "tex", split, "pre_logits").read()
        b = plain.features("r18", "tex", split, "pre_logits").read()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not any(key.startswith("early/") for key in store.iter_feature_keys())


def test_a_subset_is_chosen_once_per_labels_and_settings(history):
    store, cfg, y = history
    early = cfg.early
    first = current_subset(store, cfg.datasets[0], early)
    again = current_subset(store, cfg.datasets[0], early)
    assert again.id == first.id and all(np.array_equal(first.rows[s], again.rows[s]) for s in first.rows)
    assert {s: len(r) for s, r in first.rows.items()} == {"train": 60, "test": 40}
    other = current_subset(store, cfg.datasets[0], EarlyConfig(fraction=0.1, min_history=10))
    assert other.id != first.id
    stored = {r["id"] for r in EarlyRecords(store).iter("subsets", "blobs")}
    assert {first.id, other.id} <= stored


def test_anchor_rows_are_chosen_from_the_history_and_chosen_again_only_when_it_grew_by_half(history):
    from jobs.early.run import anchor_profiles

    store, cfg, y = history
    early = EarlyConfig(fraction=0.2, rows="anchors", min_history=10)
    profiles = anchor_profiles(store, cfg.datasets[0], exclude="none")
    assert profiles[0].shape == (200, N_HISTORY + 1)
    anchors = current_subset(store, cfg.datasets[0], early, profiles)
    assert anchors.method == "anchors" and anchors.weights.sum() == pytest.approx(200)
    fewer = (profiles[0][:, :11], profiles[1][:11])  # 11 < 13 * 1.5: the same subset stands
    assert current_subset(store, cfg.datasets[0], early, fewer).id == anchors.id
    no_history = (profiles[0][:, :3], profiles[1][:3])  # too little history: a stratified subset
    assert current_subset(store, cfg.datasets[0], early, no_history).method == "stratified"


def test_an_estimate_from_the_history_with_early_verdicts_and_nothing_in_the_ledger(history):
    store, cfg, _ = history
    before = len(Ledger(store))
    est, subset, result = _estimate(store, cfg, "s13")
    assert est["status"] == "estimated" and est["estimate"]["method"] == "paired"
    assert "s12's exact figure" in est["how"]
    e = est["estimate"]
    assert e["low"] <= e["value"] <= e["high"] and e["level"] == 0.9
    kinds = {v["kind"]: v for v in est["verdicts"]}
    assert kinds["previous"]["against"] == "s12"
    for v in est["verdicts"]:
        assert v["verdict"] in ("better", "worse", "indistinguishable")
        assert v["test"] == "mcnemar-exact" and v["p_adjusted"] >= v["p_value"]
    assert len(Ledger(store)) == before  # estimates live apart from the exact records
    assert EarlyRecords(store).get("estimates", est["id"])["estimate"] == e
    frame = results_frame(cfg)
    assert len(frame) == before and "early" not in " ".join(frame.columns)


def test_a_line_no_better_than_the_estimate_without_it_on_its_history_is_set_aside(history):
    store, cfg, _ = history
    kept, subset, _ = _estimate(store, cfg, "s13")
    assert "leave-one-out error" in kept["how"] and "vs change" in kept["how"], kept["how"]
    # every earlier exact figure made equal to its plain estimate: no line can do better
    labels = store.labels("blobs", "test").read()
    rows = subset.rows["test"]
    population = dict(zip(*(v.tolist() for v in np.unique(labels, return_counts=True))))
    records = copy.deepcopy(list(Ledger(store)))
    for rec in records:
        res = early_result(store, _cell(rec["model"]), subset, "store")
        correct = (np.asarray(res["predictions"]) == labels[rows]).astype(int)
        rec["metrics"]["score"] = stratified_estimate(correct, labels[rows], population, cfg.early.level).value
    est, _, _ = _estimate(store, cfg, "s13", records=records)
    # without the line: the previous checkpoint's exact figure plus the early rows' own change
    assert est["estimate"]["method"] == "change" and [h["model"] for h in est["history"]] == ["s12"]
    assert "paired line set aside: leave-one-out error" in est["how"] and "vs change 0.0 points" in est["how"], \
        est["how"]


def test_too_little_history_gives_the_previous_figure_plus_the_early_rows_own_change(history):
    store, cfg, _ = history
    few = copy.deepcopy(cfg)
    few.early = EarlyConfig(fraction=0.2, min_history=40)
    est, subset, result = _estimate(store, few, "s13")
    assert est["estimate"]["method"] == "change" and "s12's exact figure plus the early rows' own change" in est["how"]
    # the change: the stratified mean of per-row differences of being right, s13 against s12 on
    # the same early rows, added to s12's exact figure
    labels = store.labels("blobs", "test").read()
    rows = labels[subset.rows["test"]]
    prev = early_result(store, _cell("s12"), subset, "store")
    population = dict(zip(*(v.tolist() for v in np.unique(labels, return_counts=True))))
    change, low, high = stratified_change((np.asarray(result["predictions"]) == rows).astype(int),
                                          (np.asarray(prev["predictions"]) == rows).astype(int), rows, population, 0.9)
    exact = {r["model"]: r["metrics"]["score"] for r in Ledger(store)}
    half = max((high - low) / 2, 1 / rows.size)
    # at least as wide as the history's own misses of the change: the 11 earlier pairs' full
    # change minus their early rows' change, the ceil(12 * 0.9) = 11th smallest size
    right = {m: (np.asarray(early_result(store, _cell(m), subset, "store")["predictions"]) == rows).astype(int)
             for m in (f"s{i:02d}" for i in range(1, 13))}
    missed = [(exact[f"s{i + 1:02d}"] - exact[f"s{i:02d}"])
              - stratified_change(right[f"s{i + 1:02d}"], right[f"s{i:02d}"], rows, population, 0.9)[0]
              for i in range(1, 12)]
    half = max(half, max(abs(m) for m in missed))
    s12 = exact["s12"]
    e = est["estimate"]
    assert e["value"] == pytest.approx(min(max(s12 + change, 0), 1))
    assert (e["low"], e["high"]) == pytest.approx((max(s12 + change - half, 0), min(s12 + change + half, 1)))
    # it is of the full figure: compared with the previous checkpoint's exact one, by the early rows' test
    assert est["verdicts"][0]["against_what"] == "exact" and est["verdicts"][0]["against_value"] == s12


def test_without_a_previous_exact_figure_a_sampling_estimate_of_the_early_fit(history):
    store, cfg, _ = history
    est, subset, result = _estimate(store, cfg, "s13", records=[])
    assert est["estimate"]["method"] == "sampling" and "early rows" in est["how"] and est["verdicts"] == []
    labels = store.labels("blobs", "test").read()
    rows = subset.rows["test"]
    population = dict(zip(*(v.tolist() for v in np.unique(labels, return_counts=True))))
    plain = stratified_estimate((np.asarray(result["predictions"]) == labels[rows]).astype(int), labels[rows],
                                population, 0.9)
    assert est["estimate"]["value"] == pytest.approx(plain.value)


def test_an_unreliable_record_gives_no_early_verdict(history):
    store, cfg, _ = history
    records = list(Ledger(store))
    for rec in records:
        if rec["model"] == "s12":
            rec["warnings"] = [{"code": "grid_edge", "message": "k at the edge of its grid"}]
    est, _, _ = _estimate(store, cfg, "s13", records=records)
    previous = next(v for v in est["verdicts"] if v["kind"] == "previous")
    assert previous["verdict"] == "unreliable" and "s12 grid_edge" in previous["reason"]


def test_checks_and_coverage_turn_a_setting_off_below_nominal(history):
    store, cfg, _ = history
    est, _, _ = _estimate(store, cfg, "s13")
    checks = check_estimates(store, list(Ledger(store)), [est])
    assert len(checks) == 1
    exact = next(r for r in Ledger(store) if r["model"] == "s13")["metrics"]["score"]
    assert checks[0]["exact"] == exact and checks[0]["error"] == pytest.approx(est["estimate"]["value"] - exact)
    assert checks[0]["covered"] == (est["estimate"]["low"] <= exact <= est["estimate"]["high"])
    assert check_estimates(store, list(Ledger(store)), [est]) == []  # checked once
    key = ("knn", est["config_hash"])
    for i in range(12):  # a run of misses: the setting's intervals no longer hold
        EarlyRecords(store).put("checks", {**checks[0], "id": f"{i:032x}", "covered": False})
    assert coverage_by_setting(EarlyRecords(store).iter("checks"))[key].off
    why = off_settings(store)[key]
    assert "early pass off" in why
    off, _, _ = _estimate(store, cfg, "s13", off={key: why})
    assert off["status"] == "off" and "estimate" not in off


def _est(model, dataset, value, low, high, method="paired", setting="knn5"):
    return {"model": model, "setting": setting, "dataset": dataset, "layer": "pre_logits", "status": "estimated",
            "estimate": {"value": value, "low": low, "high": high, "method": method, "level": 0.9}}


def test_early_ranks_place_calibrated_estimates_among_the_exact_figures_and_each_other():
    from jobs.early.lines import early_ranks, rank_line

    exact = [{"model": m, "setting": "knn5", "dataset": d, "layer": "pre_logits", "metrics": {"score": s}}
             for m, s in (("a", 0.9), ("b", 0.7), ("c", 0.5)) for d in ("x", "y")]
    ranks = early_ranks([_est("new", "x", 0.8, 0.6, 0.95), _est("new", "y", 0.8, 0.6, 0.95),
                         _est("other", "x", 0.4, 0.3, 0.5), _est("other", "y", 0.4, 0.3, 0.5),
                         _est("sampled", "x", 0.99, 0.9, 1.0, method="sampling")], exact)
    by = {r["model"]: r for r in ranks}
    assert set(by) == {"new", "other"}  # a sampling estimate is of the early fit: it does not rank
    assert (by["new"]["rank"], by["new"]["best_rank"], by["new"]["worst_rank"], by["new"]["of"]) == (2, 1, 3, 5)
    assert by["other"]["rank"] == 5
    assert rank_line(by["new"]) == "early rank of new on knn5 (x, y): 2 of 5 by its estimate, 1 to 3 within its intervals"


def test_a_line_contradicted_by_the_early_rows_falls_back_to_their_own_interval(history):
    # the paired line's implied change (its estimate minus the previous checkpoint's exact
    # figure) against the early rows' own paired interval for the change: a loss spike's
    # early drop, which the line would shrink towards the history's typical step
    from jobs.early.estimates import _against_early_change, _early_change
    from pipeline.analysis.early import Estimate

    store, cfg, _ = history
    subset = current_subset(store, cfg.datasets[0], cfg.early)
    labels = store.labels("blobs", "test").read()
    rows = labels[subset.rows["test"]]
    ref = {"predictions": rows.copy()}  # the previous checkpoint right on every early row
    spiked = {"predictions": np.where(np.arange(rows.size) % 2 == 0, (rows + 1) % 3, rows)}  # wrong on half
    line = Estimate(0.92, 0.88, 0.95, 0.9, "paired", 11, "")
    why = _against_early_change(line, 0.90, _early_change(spiked, ref, subset, labels, "test", 0.9), 0.9)
    assert why.startswith("the history's line implies a change of +2.0 points, outside the early rows' own 90% "
                          "interval") and "measured -50.0" in why, why
    drop = Estimate(0.42, 0.3, 0.5, 0.9, "paired", 11, "")
    assert _against_early_change(drop, 0.90, _early_change(spiked, ref, subset, labels, "test", 0.9), 0.9) is None
    # identical early predictions: one early row's worth of change is not a contradiction
    small = Estimate(0.90 + 0.9 / rows.size, 0.8, 0.95, 0.9, "paired", 11, "")
    assert _against_early_change(small, 0.90, _early_change(ref, ref, subset, labels, "test", 0.9), 0.9) is None
    more = Estimate(0.90 + 2.0 / rows.size, 0.8, 0.95, 0.9, "paired", 11, "")
    assert _against_early_change(more, 0.90, _early_change(ref, ref, subset, labels, "test", 0.9), 0.9) is not None
    # without per-image predictions there is nothing to compare
    assert _early_change({"predictions": None}, ref, subset, labels, "test", 0.9) is None
    assert _against_early_change(line, 0.90, None, 0.9) is None


def test_after_a_loss_spike_the_estimate_starts_from_the_checkpoint_significantly_nearest_in_its_predictions(history):
    # the checkpoint after a spike is trained on from the unspiked weights: measured from the
    # spike, its change would be a recovery the early fits understate; the checkpoint before
    # the spike predicts as it does
    from jobs.early.estimates import _reference

    store, cfg, _ = history
    subset = current_subset(store, cfg.datasets[0], cfg.early)
    rows = store.labels("blobs", "test").read()[subset.rows["test"]]
    n = rows.size

    def differing(k):  # predictions that differ from the new checkpoint's on the first k early rows
        return {"predictions": np.where(np.arange(n) < k, (rows + 1) % 3, rows)}

    earlier = {f"s{s:02d}": differing(n // 2) for s in range(1, 13)}
    new = {"predictions": rows.copy()}
    before = {m: {} for m in earlier}  # each has an exact record
    assert _reference(cfg, "s13", before, earlier, new) == "s12"  # all alike: the latest
    spiked = {**earlier, "s12": differing(n * 3 // 4), "s11": differing(n // 10)}
    assert _reference(cfg, "s13", before, spiked, new) == "s11"
    # nearer by a few rows only, as chance makes one or the other on a few dozen rows: the latest
    close = {**earlier, "s12": differing(3), "s11": differing(1)}
    assert _reference(cfg, "s13", before, close, new) == "s12"
    # the sign test on the rows where only one of the two agrees with the new checkpoint,
    # alpha 0.05 shared among the 11 others: z >= 2.61 (40 early rows here)
    assert n == 40
    assert _reference(cfg, "s13", before, {**earlier, "s12": differing(7), "s11": differing(0)}, new) == "s11"  # 2.65
    assert _reference(cfg, "s13", before, {**earlier, "s12": differing(6), "s11": differing(0)}, new) == "s12"  # 2.45
    # without per-image predictions (a retrieval score): the latest; without an exact record: not a candidate
    assert _reference(cfg, "s13", before, {**spiked, "s11": {"predictions": None}}, new) == "s12"
    assert _reference(cfg, "s13", {m: {} for m in earlier if m != "s11"}, spiked, new) == "s10"  # the latest nearest
    assert _reference(cfg, "s01", before, earlier, new) is None


def test_a_line_interval_reaches_the_early_rows_own_change_on_the_side_they_point_to():
    # a loss spike the early rows barely see: the line (steady progress) says +2 points, the
    # early rows -5 with a wide interval; the line's interval must not shut out the drop they
    # leave open, and keeps its own narrower side
    from jobs.early.estimates import _holding_early_change
    from pipeline.analysis.early import Estimate

    line = Estimate(0.60, 0.55, 0.65, 0.9, "paired", 18, "the full figure")
    drop, why = _holding_early_change(line, 0.58, (-0.05, -0.17, 0.07), bounded=True)
    assert (drop.value, drop.low, drop.high) == (0.60, pytest.approx(0.41), 0.65) and drop.method == "paired"
    assert "reaches the early rows' own for the change on their side (-17.0 to +7.0 points, measured -5.0)" in why
    assert drop.covers.startswith("the full figure, or as far as the early rows' own change")
    gain, _ = _holding_early_change(line, 0.58, (0.10, 0.02, 0.18), bounded=True)
    assert (gain.low, gain.high) == (0.55, pytest.approx(0.76))
    # the early rows' interval inside the line's on their side: nothing to reach
    assert _holding_early_change(line, 0.58, (0.01, -0.02, 0.04), bounded=True) == (line, "")
    assert _holding_early_change(line, 0.58, None, bounded=True) == (line, "")
    # fractions stay within [0, 1]
    assert _holding_early_change(line, 0.58, (0.5, 0.4, 0.6), bounded=True)[0].high == 1.0


def test_the_early_rows_change_is_at_least_as_wide_as_the_history_missed_it():
    # split conformal: of n earlier pairs' misses (full change minus early change), the
    # ceil((n + 1) * level)-th smallest size is the least half-width either way
    from jobs.early.estimates import _with_history_misses

    missed = [0.01, -0.02, 0.03, -0.04, 0.05, -0.06, 0.07, -0.08, 0.09, -0.10]  # n = 10: the 10th smallest
    assert _with_history_misses((-0.05, -0.09, -0.01), missed, 0.9) == pytest.approx((-0.05, -0.15, 0.05))
    assert _with_history_misses((-0.05, -0.09, -0.01), missed, 0.8) == pytest.approx((-0.05, -0.14, 0.04))  # 9th
    # a sampling interval already wider on one side keeps that side
    assert _with_history_misses((-0.05, -0.30, -0.01), missed, 0.9) == pytest.approx((-0.05, -0.30, 0.05))
    # too few pairs for the quantile (ceil(10 * 0.9) = 9 > 8), or none: the sampling interval stands
    assert _with_history_misses((-0.05, -0.09, -0.01), missed[:8], 0.9) == (-0.05, -0.09, -0.01)
    assert _with_history_misses((-0.05, -0.09, -0.01), [], 0.9) == (-0.05, -0.09, -0.01)
    # n = 9 at 0.9: the 9th smallest (0.9 * 10 is 9 here, not the float's 9.000000000000002)
    assert _with_history_misses((-0.05, -0.09, -0.01), missed[:9], 0.9) == pytest.approx((-0.05, -0.14, 0.04))


def test_every_early_verdict_is_said_with_its_reason_on_the_terminal_and_in_the_report():
    from jobs.early.lines import estimate_line
    from jobs.report.sections.early import _verdicts

    reason = "interval 0.3492..0.5168 below 0.623, paired test on the early rows p = 0.0094"
    rec = {"model": "s13", "setting": "knn5", "dataset": "blobs", "layer": "pre_logits", "status": "estimated",
           "estimate": {"value": 0.43, "low": 0.35, "high": 0.52, "level": 0.9, "method": "change"},
           "how": "s12's exact figure plus the early rows' own change since it (-19.0 points)",
           "unreliable": [], "verdicts": [{"kind": "previous", "against": "s12", "against_value": 0.623,
                                           "against_what": "exact", "verdict": "worse", "reason": reason}]}
    line = estimate_line(rec)
    assert line.endswith(f"; vs previous s12 (62.3 %): worse ({reason})"), line
    cell = str(_verdicts(rec))
    assert "<b>worse</b>" in cell and f"<small> ({reason})</small>" in cell  # in view, not only on hover
    # an early fit with a warning and no comparison to carry it: said on the estimate's line
    alone = {**rec, "verdicts": [], "unreliable": ["at_chance: score 0.22 is at or below chance (0.25)"]}
    assert estimate_line(alone).endswith("; its early fit is unreliable: at_chance: score 0.22 is at or below "
                                         "chance (0.25)")
