"""Early verdicts against the full run, on a history of real checkpoints.

The history: resnet18 trained on the demo's source task (``flows.demo_sources``, as
``make demo`` does) for three seeds, a checkpoint saved at nine steps each (27 checkpoints,
three series). Three of them are loss spikes (``SPIKES``: Gaussian noise added to the weights, 1 to 1.5
times each tensor's RMS; seed 2 at steps 26 and 40, seed 1 at step 50: on the texture sets, the nearest to the
source task, 1.5 times cost the logistic probe 4 to 12 points against the previous
checkpoint in the run of benchmarks/RESULTS.md), the rest smooth progress. Each is
extracted and evaluated in full (the jobs of ``repeval run``, one process, no Prefect) on the demo's datasets (``digits``: 1,797 images; ``textures``: 1,200)
and two more generated ones (``textures-2x``: other texture images, 2,000 of them, half of
them test images; ``textures-3k``: 5,000, of them 3,000 test images), with the settings
``linear`` (logistic), ``knn20`` and ``ridge``. That full pass of each checkpoint, timed, is
the full run.

The latest ``--held-out`` checkpoints of each seed are then judged as a nightly run with
``--early`` would judge them, one at a time in step order: the store's records of the
held-out checkpoint and of every later one are hidden from the estimate, so its history
is exactly the checkpoints of earlier steps (of every seed). The timed early pass: its
early rows extracted (``jobs.early.run.early_unit``: a tenth of each split, stratified),
its early fits, its estimates and early verdicts (``jobs.early.estimates``; the history's
early results are computed once per subset before, as earlier nights would have left them).

Printed per setting: the share of the images the early pass read, the time to the
setting's early verdicts against the full run's (the early extraction, the setting's early
fits and estimates, against the full extraction and the setting's full cells; in brackets
the extractions alone), the estimates' median absolute error against the exact
figures (points), the coverage of their 90 % intervals, Kendall's tau between the held-out
checkpoints' ranking by estimate and by exact figure (per dataset and layer, averaged),
and the agreement of the early verdicts with the exact ones (each held-out checkpoint
against its series' previous checkpoint and best so far: McNemar's test on the exact
records, Benjamini-Hochberg over the checkpoint's comparisons, as the series analysis),
with the count of opposite verdicts (one says better, the other worse), the share of the
exact regressions said early, how many coverage misses fell on spiked checkpoints, and how
the estimates order the pairs of held-out checkpoints the exact test separates (McNemar,
Benjamini-Hochberg over the pairs; (right - wrong) / pairs). A label-free baseline on the
same early rows beside it: RankMe, the effective rank of the ``pre_logits`` embeddings (its
direction against the compared checkpoint as its verdict). Then the same with anchor rows
(``early.rows: anchors``; ``--rows`` picks one), and the errors per dataset.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_early.py [--out DIR] [--quick] [--markdown]``.
Checkpoints, the store and a JSON of the figures are kept in ``--out`` (default
``bench-early-out``): a second run reuses what is there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import limit_threads, machine_line  # noqa: E402

SEEDS = (0, 1, 2)
STEPS = (3, 6, 10, 15, 20, 26, 33, 40, 50)
QUICK_STEPS = (3, 6, 10, 15, 20, 26, 33, 40)  # --quick: and a smaller third dataset
SETTINGS = {"linear": ("logistic", {}), "knn20": ("knn", {"n_neighbors": 20}), "ridge": ("ridge", {})}
INPUT_SIZE = 32
#: Loss spikes, as a lab's run has them: (seed, step) -> the size of the noise added to each
#: weight matrix and kernel, relative to that tensor's root mean square. The series' later
#: checkpoints are trained on from the unspiked weights, as a run that recovers.
SPIKES = {(2, 26): 1.0, (2, 40): 1.5, (1, 50): 1.5}
#: RankMe (the label-free baseline) calls a direction only where the effective rank moves by
#: more than this share.
RANKME_STEP = 0.01


def datasets(quick: bool) -> list[dict]:
    big = {"train": 250, "test": 250} if not quick else {"train": 100, "test": 100}
    # thousands of test images, as a lab's downstream sets have (750 per class; 250 --quick)
    large = {"train": 500, "test": 750} if not quick else {"train": 150, "test": 250}
    return [{"name": "digits", "adapter": "digits"},
            {"name": "textures", "adapter": "textures", "params": {"n_per_class": {"train": 200, "test": 100}}},
            {"name": "textures-2x", "adapter": "textures", "params": {"n_per_class": big, "seed": 7}},
            {"name": "textures-3k", "adapter": "textures", "params": {"n_per_class": large, "seed": 11}}]


def train(out: Path, steps) -> dict[str, dict]:
    """The checkpoints (trained once; kept in ``out``): name -> {path, seed, step}."""
    from flows.demo_sources import train_checkpoints
    from pipeline.datasets import make_dataset

    folder = out / "checkpoints"
    source = make_dataset("textures", name="source", seed=12345, n_per_class={"train": 300, "test": 100})
    out_map = {}
    for seed in SEEDS:
        files = [folder / f"seed{seed}-resnet18-step{s:04d}.safetensors" for s in steps]
        if not all(f.exists() for f in files):
            print(f"training seed {seed} for {max(steps)} steps ...", file=sys.stderr, flush=True)
            train_checkpoints("resnet18", source, list(steps), str(folder), input_size=INPUT_SIZE, batch_size=32,
                              seed=seed, prefix=f"seed{seed}-")
        for f, s in zip(files, steps):
            if (seed, s) in SPIKES:
                f = spike(f, SPIKES[(seed, s)], seed * 1000 + s)
            out_map[f.stem] = {"path": str(f), "seed": seed, "step": s, "spiked": (seed, s) in SPIKES}
    return out_map


def spike(path: Path, strength: float, seed: int) -> Path:
    """A loss spike at this checkpoint: its weights with Gaussian noise of ``strength`` times
    each weight matrix's and kernel's root mean square (biases and norms left alone); kept
    beside it as ``<name>-spike``."""
    import torch
    from safetensors.torch import load_file, save_file

    out = path.with_name(f"{path.stem}-spike{path.suffix}")
    if not out.exists():
        tensors = load_file(str(path))
        noise = torch.Generator().manual_seed(seed)
        for name, t in sorted(tensors.items()):
            if t.is_floating_point() and t.ndim >= 2:
                rms = t.pow(2).mean().sqrt()
                tensors[name] = (t + strength * rms * torch.randn(t.shape, generator=noise)).contiguous()
        save_file(tensors, str(out))
    return out


def rankme(features) -> float:
    """RankMe (Garrido et al. 2023): the effective rank of the embeddings, exp of the entropy
    of their singular values normalised to sum 1; label-free."""
    import numpy as np

    s = np.linalg.svd(np.asarray(features, dtype=np.float64), compute_uv=False)
    p = s / s.sum() + 1e-7
    return float(np.exp(-np.sum(p * np.log(p))))


def rankme_of(store, model: str, subset, dataset, early: bool) -> float:
    """RankMe of ``model``'s ``pre_logits`` on the subset's rows of every split: from its
    early arrays (``early``, as the early pass has them) or from its full ones."""
    import numpy as np
    from jobs.early.rows import read_early

    blocks = []
    for split in dataset.splits():
        rows = subset.rows[split]
        blocks.append(read_early(store, model, subset, split, "pre_logits").read() if early else
                      store.features(model, dataset.name, split, "pre_logits").read_rows(np.sort(rows)))
    return rankme(np.concatenate(blocks))


def config(out: Path, checkpoints: dict[str, dict], names: list[str], quick: bool, rows: str = "stratified"):
    """A config of ``names`` (each in its seed's series) as the run's plan would hold them."""
    from jobs.config import BenchmarkConfig
    from jobs.config.typed import from_plain

    plain = {
        "store": str(out / "store"),
        "encoders": [{"name": n, "arch": "resnet18", "weights": checkpoints[n]["path"], "input_size": INPUT_SIZE,
                      "series": f"seed{checkpoints[n]['seed']}", "step": checkpoints[n]["step"]} for n in names],
        "datasets": datasets(quick),
        "protocols": [{"name": k, "protocol": p, "settings": s} for k, (p, s) in SETTINGS.items()],
        "extract": {"batch_size": 64, "chunk_batches": 4, "progress": False},
        "early": {"fraction": 0.1, "rows": rows},
    }
    return from_plain(BenchmarkConfig, plain, "config")


def full_pass(cfg, name: str) -> dict[str, float]:
    """Extract and evaluate one checkpoint in full (once: a kept store answers at once):
    seconds of the extraction, and of each setting's cells."""
    from jobs.evaluation.evaluate import evaluate_cell
    from jobs.run.plan import evaluation_cells, extraction_units, run_extract_unit

    store = cfg.open_store()
    started = time.perf_counter()
    for unit in extraction_units(cfg):
        if unit.encoder.name == name:
            run_extract_unit(store, unit, cfg)
    out = {"extract": time.perf_counter() - started, **{k: 0.0 for k in SETTINGS}}
    for cell in evaluation_cells(cfg):
        if cell.model == name:
            started = time.perf_counter()
            evaluate_cell(store, cell)
            out[cell.setting] += time.perf_counter() - started
    return out


def _exact(store, names: set[str]) -> list[dict]:
    from storage_schema.ledger import Ledger

    return [r for r in Ledger(store) if r["model"] in names]


def forget_early(store, name: str) -> None:
    """What an earlier run of this benchmark left of ``name``'s early pass (its early arrays
    and fits): the timed pass must extract and fit as a new checkpoint's would."""
    from storage_schema import record_keys
    from storage_schema.early import EarlyRecords
    from storage_schema.keys import EARLY, SIDE

    for key in (f"{EARLY}/{name}", f"{SIDE}/state/{EARLY}/{name}"):
        store.backend.delete(key, recursive=True)
    for kind in ("results", "estimates"):
        for rec in list(EarlyRecords(store).iter(kind)):
            if rec.get("model") == name and rec.get("source", "early") == "early":
                store.backend.delete(record_keys.early_record_key(kind, rec["id"]))


def early_pass(cfg, name: str, history: set[str], records: list[dict]) -> tuple[dict, list[dict], int, dict]:
    """The held-out checkpoint's early pass as a run does it: (seconds of the early
    extraction and of each setting's early fits and estimates, estimates, images read, the
    subsets by dataset)."""
    from jobs.early.estimates import estimate_encoder
    from jobs.early.run import early_unit
    from jobs.early.subsets import Subset
    from jobs.evaluation.cell import Cell

    store = cfg.open_store()
    forget_early(store, name)
    enc = next(e for e in cfg.encoders if e.name == name)
    cells = [Cell(name, d.name, "pre_logits", k, p, dict(s), d.train_split, d.test_split, d.val_split)
             for d in cfg.datasets for k, (p, s) in SETTINGS.items()]
    started = time.perf_counter()
    units = [early_unit(store, enc, d, [c for c in cells if c.dataset == d.name], cfg.early, cfg.extract)
             for d in cfg.datasets]
    unit_seconds = time.perf_counter() - started
    subsets = {u["dataset"]: Subset.from_record(u["subset"]) for u in units}
    results = {tuple(k.split("/")): r for u in units for k, r in u["results"].items()}
    fits = {k: sum(r.get("seconds", 0.0) for (setting, _, _), r in results.items() if setting == k) for k in SETTINGS}
    seconds = {"extract": unit_seconds - sum(fits.values())}  # the subsets, labels, model loads and forward passes
    estimates = []
    for k in SETTINGS:  # each setting's verdicts as soon as its own fits are in
        started = time.perf_counter()
        estimates += estimate_encoder(store, cfg, [c for c in cells if c.setting == k], subsets, results,
                                      [r for r in records if r["model"] in history])
        seconds[k] = fits[k] + time.perf_counter() - started
    return seconds, estimates, sum(u["extraction"]["images"] for u in units), subsets


def warm_history(cfg, history: set[str], rows: str) -> None:
    """The history's early results on the datasets' subsets, as earlier nights leave them."""
    from jobs.early.results import early_result
    from jobs.early.run import anchor_profiles
    from jobs.early.subsets import current_subset
    from jobs.evaluation.cell import Cell
    from jobs.extraction.labels import store_labels
    from jobs.run.plan import make_adapter

    store = cfg.open_store()
    for d in cfg.datasets:
        adapter = make_adapter(d)
        for split in d.splits():
            store_labels(store, adapter, split)
        profiles = anchor_profiles(store, d, exclude="") if rows == "anchors" else None
        if profiles is not None:  # only the history's columns: a held-out checkpoint's own must not choose rows
            keep = [i for i, m in enumerate(profiles[1]) if m in history]
            profiles = (profiles[0][:, keep], [profiles[1][i] for i in keep])
        subset = current_subset(store, d, cfg.early, profiles)
        for model in sorted(history):
            for k, (p, s) in SETTINGS.items():
                early_result(store, Cell(model, d.name, "pre_logits", k, p, dict(s)), subset, "store")


def exact_verdicts(store, name: str, estimates: list[dict], records: list[dict]) -> dict[tuple, str]:
    """(setting, dataset, against) -> the exact verdict of the same comparison (McNemar on the
    exact records, Benjamini-Hochberg over the checkpoint's comparisons, as the series')."""
    from jobs.analysis.compare import compare_records, unreliable_reason
    from pipeline.analysis.compare import decide_verdicts

    by = {(r["model"], r["setting"], r["dataset"]): r for r in records}
    comparisons, unreliable = {}, {}
    for est in estimates:
        for v in est.get("verdicts") or []:
            key = (est["setting"], est["dataset"], v["against"])
            a, b = by[(name, est["setting"], est["dataset"])], by[(v["against"], est["setting"], est["dataset"])]
            comparisons[key] = compare_records(store, a, b)
            why = unreliable_reason(a, b)
            if why:
                unreliable[key] = why
    return {k: v.verdict for k, v in decide_verdicts(comparisons, 0.05, unreliable).items()} if comparisons else {}


def kendall(early: dict, exact: dict) -> float | None:
    from scipy.stats import kendalltau

    keys = sorted(early)
    if len(keys) < 3:
        return None
    tau = kendalltau([early[k] for k in keys], [exact[k] for k in keys]).statistic
    return None if tau != tau else float(tau)


def summarise(rows: list[dict], times: dict, images: dict, total_images: int,
              separated: dict[tuple[str, str], list]) -> list[dict]:
    """One line per setting from every held-out estimate, and one of the RankMe baseline."""
    import numpy as np

    out = []
    for setting in SETTINGS:
        mine = [r for r in rows if r["setting"] == setting and r["value"] is not None]
        errors = [abs(r["value"] - r["exact"]) for r in mine]
        covered = [r["low"] <= r["exact"] <= r["high"] for r in mine if r["low"] is not None]
        missed_spikes = sum(r["spiked"] and not r["low"] <= r["exact"] <= r["high"] for r in mine
                            if r["low"] is not None)
        taus, rank_taus, order, rank_order = [], [], [0, 0], [0, 0]
        for d in {r["dataset"] for r in mine}:
            these = [r for r in mine if r["dataset"] == d]
            exact = {r["model"]: r["exact"] for r in these}
            for values, into in (({r["model"]: r["value"] for r in these}, taus),
                                 ({r["model"]: r["rankme"] for r in these}, rank_taus)):
                tau = kendall(values, exact)
                if tau is not None:
                    into.append(tau)
            for values, into in (({r["model"]: r["value"] for r in these}, order),
                                 ({r["model"]: r["rankme"] for r in these}, rank_order)):
                right, wrong = ordered_share(values, separated.get((setting, d), []))
                into[0] += right
                into[1] += wrong
        n_separated = sum(len(separated.get((setting, d), [])) for d in {r["dataset"] for r in mine})
        pairs = [(e, x) for r in rows if r["setting"] == setting for e, x in r["verdicts"]]
        rank_pairs = [(e, x) for r in rows if r["setting"] == setting for e, x in r["rankme_verdicts"]]
        agree = [e == x or (e in ("indistinguishable", "no verdict", "unreliable")
                            and x in ("indistinguishable", "unreliable")) for e, x in pairs]
        opposite = sum({e, x} == {"better", "worse"} for e, x in pairs)
        regressions = [e for e, x in pairs if x == "worse"]
        out.append({
            "setting": setting, "estimates": len(mine),
            "missed_on_spikes": missed_spikes, "misses": sum(not c for c in covered),
            "regressions": len(regressions), "regressions_said": sum(e == "worse" for e in regressions),
            "separated_pairs": n_separated,
            "separated_tau": (order[0] - order[1]) / n_separated if n_separated else None,
            "rankme": {"kendall_tau": float(np.mean(rank_taus)) if rank_taus else None,
                       "separated_tau": (rank_order[0] - rank_order[1]) / n_separated if n_separated else None,
                       "opposite": sum({e, x} == {"better", "worse"} for e, x in rank_pairs),
                       "regressions_said": sum(e == "worse" for e, x in rank_pairs if x == "worse"),
                       "agreement": float(np.mean([e == x or (e == "no verdict" and x in ("indistinguishable",
                                                                                       "unreliable"))
                                                   for e, x in rank_pairs])) if rank_pairs else None},
            "methods": ", ".join(f"{m} {sum(r['method'] == m for r in mine)}" for m in sorted({r["method"] for r in mine})),
            "images_share": sum(images.values()) / (total_images * len(images)),
            # the early extraction and this setting's early fits and estimates, against the full
            # extraction and this setting's full cells
            "time_ratio": float(np.median([(t["early"]["extract"] + t["early"][setting])
                                           / (t["full"]["extract"] + t["full"][setting]) for t in times.values()])),
            "extract_ratio": float(np.median([t["early"]["extract"] / t["full"]["extract"] for t in times.values()])),
            "median_abs_error": float(np.median(errors)) if errors else None,
            "coverage": float(np.mean(covered)) if covered else None,
            "kendall_tau": float(np.mean(taus)) if taus else None,
            "agreement": float(np.mean(agree)) if agree else None, "comparisons": len(pairs),
            "opposite": opposite})
    return out


def full_times(out: Path, quick: bool) -> tuple[dict, list[str], dict]:
    """Every checkpoint extracted and evaluated in full, timed once (the times are kept
    beside the store: a kept store answers from its ledger in no time)."""
    steps = QUICK_STEPS if quick else STEPS
    checkpoints = train(out, steps)
    order = sorted(checkpoints, key=lambda n: (checkpoints[n]["step"], checkpoints[n]["seed"]))
    cfg = config(out, checkpoints, order, quick)
    kept = out / "full_times.json"
    times = json.loads(kept.read_text()) if kept.exists() else {}
    for name in order:
        if name not in times:
            times[name] = full_pass(cfg, name)
            print(f"  {name}: full run {sum(times[name].values()):.1f} s", file=sys.stderr, flush=True)
            kept.write_text(json.dumps(times, indent=1))
    return checkpoints, order, times


def run(out: Path, quick: bool, held_out: int, rows: str) -> dict:
    from jobs.analysis.compare import record_score

    checkpoints, order, full = full_times(out, quick)
    steps = QUICK_STEPS if quick else STEPS
    times = {name: {"full": full[name]} for name in order}
    store = config(out, checkpoints, order, quick, rows).open_store()
    latest = set(sorted(steps)[-held_out:])
    judged = [n for n in order if checkpoints[n]["step"] in latest]
    rows_out, images, total, rankmes = [], {}, None, {}
    for name in judged:
        history = {n for n in order if checkpoints[n]["step"] < checkpoints[name]["step"]}
        records = _exact(store, history | {name})
        hcfg = config(out, checkpoints, sorted(history) + [name], quick, rows)
        warm_history(hcfg, history, rows)
        seconds, estimates, read, subsets = early_pass(hcfg, name, history, records)
        times[name]["early"] = seconds
        # the label-free baseline on the same early rows: this checkpoint's early arrays, the
        # checkpoints it is compared with from their full arrays at those rows
        rank = {}
        for d in hcfg.datasets:
            rank[(name, d.name)] = rankme_of(store, name, subsets[d.name], d, early=True)
            for est in estimates:
                for v in est.get("verdicts") or []:
                    if est["dataset"] == d.name and (v["against"], d.name) not in rank:
                        rank[(v["against"], d.name)] = rankme_of(store, v["against"], subsets[d.name], d, early=False)
        rankmes.update(rank)
        images[name] = read
        if total is None:
            from jobs.run.plan import make_adapter

            total = sum(make_adapter(d).num_samples(s) for d in hcfg.datasets for s in d.splits())
        exact = {(r["setting"], r["dataset"]): record_score(r) for r in records if r["model"] == name}
        verdicts = exact_verdicts(store, name, [e for e in estimates if e.get("status") == "estimated"],
                                  records)
        for est in estimates:
            e = est.get("estimate") or {}
            mine = rankmes[(name, est["dataset"])]
            rows_out.append({
                "model": name, "setting": est["setting"], "dataset": est["dataset"], "status": est.get("status"),
                "spiked": checkpoints[name]["spiked"],
                "method": e.get("method"), "how": est.get("how") or est.get("reason"),
                "value": e.get("value"), "low": e.get("low"), "high": e.get("high"),
                "exact": exact[(est["setting"], est["dataset"])], "rankme": mine,
                "verdicts": [(v["verdict"], verdicts.get((est["setting"], est["dataset"], v["against"])))
                             for v in est.get("verdicts") or []],
                "rankme_verdicts": [(_direction(mine, rankmes[(v["against"], est["dataset"])]),
                                     verdicts.get((est["setting"], est["dataset"], v["against"])))
                                    for v in est.get("verdicts") or []],
                "comparisons": [{"kind": v["kind"], "against": v["against"], "against_value": v["against_value"],
                                 "early": v["verdict"], "early_reason": v.get("reason"), "early_p": v.get("p_adjusted"),
                                 "early_difference": v.get("difference"), "detectable": v.get("detectable"),
                                 "exact": verdicts.get((est["setting"], est["dataset"], v["against"]))}
                                for v in est.get("verdicts") or []]})
        print(f"  {name}: early {sum(seconds.values()):.1f} s against full {sum(times[name]['full'].values()):.1f} s",
              file=sys.stderr, flush=True)
    times = {n: t for n, t in times.items() if "early" in t}
    separated = separated_pairs(store, judged)
    return {"summary": summarise(rows_out, times, images, total, separated), "estimates": rows_out,
            "times": times, "separated": {"/".join(k): v for k, v in separated.items()}}


def _direction(new: float, old: float) -> str:
    """RankMe's verdict: better or worse where the effective rank moved by more than RANKME_STEP."""
    if abs(new - old) <= RANKME_STEP * max(abs(old), 1e-12):
        return "no verdict"
    return "better" if new > old else "worse"


def separated_pairs(store, judged: list[str]) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    """(setting, dataset) -> the pairs (a, b, exact verdict of a against b) of held-out
    checkpoints that the exact test separates (McNemar on the exact records,
    Benjamini-Hochberg over the pairs of the cell): where a ranking must get the order right."""
    from itertools import combinations

    from jobs.analysis.compare import compare_records, unreliable_reason
    from pipeline.analysis.compare import decide_verdicts

    by = {(r["model"], r["setting"], r["dataset"]): r for r in _exact(store, set(judged))}
    out = {}
    for setting, dataset in sorted({(k[1], k[2]) for k in by}):
        comparisons, unreliable = {}, {}
        for a, b in combinations(judged, 2):
            ra, rb = by.get((a, setting, dataset)), by.get((b, setting, dataset))
            if ra is None or rb is None:
                continue
            comparisons[(a, b)] = compare_records(store, ra, rb)
            why = unreliable_reason(ra, rb)
            if why:
                unreliable[(a, b)] = why
        verdicts = decide_verdicts(comparisons, 0.05, unreliable) if comparisons else {}
        out[(setting, dataset)] = [(a, b, v.verdict) for (a, b), v in verdicts.items()
                                   if v.verdict in ("better", "worse")]
    return out


def ordered_share(values: dict[str, float], pairs: list[tuple[str, str, str]]) -> tuple[int, int]:
    """How many of the separated ``pairs`` ``values`` orders as the exact test does, and the
    opposite way (ties neither)."""
    right = wrong = 0
    for a, b, verdict in pairs:
        if a not in values or b not in values or values[a] == values[b]:
            continue
        if (values[a] > values[b]) == (verdict == "better"):
            right += 1
        else:
            wrong += 1
    return right, wrong


def per_dataset(rows: list[dict]) -> list[dict]:
    import numpy as np

    out = []
    for setting in SETTINGS:
        for d in sorted({r["dataset"] for r in rows}):
            mine = [r for r in rows if r["setting"] == setting and r["dataset"] == d and r["value"] is not None]
            if mine:
                out.append({"setting": setting, "dataset": d,
                            "median_abs_error": float(np.median([abs(r["value"] - r["exact"]) for r in mine])),
                            "coverage": float(np.mean([r["low"] <= r["exact"] <= r["high"] for r in mine
                                                       if r["low"] is not None]))})
    return out


def _pct(v, digits=1):
    return "n/a" if v is None else f"{100 * v:.{digits}f}"


def print_summary(title: str, summary: list[dict], markdown: bool) -> None:
    head = ["setting", "estimates (method)", "images read", "time to early verdict / full run (extraction alone)",
            "median abs. error (points)", "90 % coverage (misses on spikes)", "Kendall tau",
            "order of separated pairs (tau)", "verdict agreement", "exact regressions said early",
            "opposite verdicts"]
    lines = []
    for s in summary:
        lines.append([s["setting"], f"{s['estimates']} ({s['methods']})", f"{_pct(s['images_share'])} %",
                      f"{s['time_ratio']:.3f} ({s['extract_ratio']:.3f})", _pct(s["median_abs_error"], 2),
                      f"{_pct(s['coverage'], 0)} % ({s['missed_on_spikes']} of {s['misses']})", _tau(s["kendall_tau"]),
                      f"{_tau(s['separated_tau'])} of {s['separated_pairs']}",
                      f"{_pct(s['agreement'], 0)} % of {s['comparisons']}",
                      f"{s['regressions_said']} of {s['regressions']}", str(s["opposite"])])
    _table(title, head, lines, markdown)
    head = ["setting", "Kendall tau", "order of separated pairs (tau)", "verdict agreement",
            "exact regressions said", "opposite verdicts"]
    lines = [[s["setting"], _tau(s["rankme"]["kendall_tau"]),
              f"{_tau(s['rankme']['separated_tau'])} of {s['separated_pairs']}",
              f"{_pct(s['rankme']['agreement'], 0)} % of {s['comparisons']}",
              f"{s['rankme']['regressions_said']} of {s['regressions']}", str(s["rankme"]["opposite"])]
             for s in summary]
    _table(f"Baseline on the same early rows: RankMe (label-free; a direction where it moves by more than "
           f"{100 * RANKME_STEP:g} %)", head, lines, markdown)


def _tau(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _table(title: str, head: list[str], lines: list[list[str]], markdown: bool) -> None:
    print(f"\n{title}\n")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for cells in lines:
        print(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-early-out", help="checkpoints, store and figures (kept)")
    parser.add_argument("--quick", action="store_true", help="8 steps per seed and a smaller third dataset")
    parser.add_argument("--held-out", type=int, default=3, help="latest steps of each seed judged early")
    parser.add_argument("--threads", type=int, default=None, help="torch and BLAS threads")
    parser.add_argument("--rows", nargs="+", choices=("stratified", "anchors"), default=["stratified", "anchors"],
                        help="the early rows' choices to measure")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(machine_line())
    print(f"threads: {limit_threads(args.threads)}")
    results = {}
    for rows in args.rows:
        results[rows] = run(out, args.quick, args.held_out, rows)
        print_summary(f"Early pass with `rows: {rows}` (10 % of each split; held out: the latest {args.held_out} "
                      f"steps of each of {len(SEEDS)} seeds)", results[rows]["summary"], args.markdown)
    print(f"\nMedian absolute error (points) and coverage per dataset, `rows: {args.rows[0]}`:\n")
    for r in per_dataset(results[args.rows[0]]["estimates"]):
        print(f"  {r['setting']:8s} {r['dataset']:12s} {_pct(r['median_abs_error'], 2):>6s}  {_pct(r['coverage'], 0)} %")
    (out / "figures.json").write_text(json.dumps(results, indent=1))
    print(f"\nfigures: {out / 'figures.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
