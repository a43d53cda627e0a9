"""``repeval compare A B``: two encoders cell by cell, from the evidence in the store."""

from __future__ import annotations

import argparse
import math

from flows.cli.printing import print_json, print_line, print_table
from flows.cli.store import add_store_options, open_store_of
from jobs.analysis.compare import CompareOptions, compare_encoders
from jobs.evaluation.encoder_identity import names_of_several
from jobs.report.results import config_records, store_records
from pipeline.analysis.compare.agreement import decided_by
from pipeline.errors import RepevalError
from storage_schema.ledger import Ledger


def add_compare_parser(sub) -> None:
    """The ``compare`` subcommand on the CLI's subparsers."""
    c = sub.add_parser("compare", help="is encoder A better or worse than B, cell by cell, beyond noise?",
                       description="Compare encoder A with encoder B on every cell both have (same dataset, "
                                   "layer and protocol setting): the score difference A - B with a paired "
                                   "bootstrap interval, an exact McNemar test (accuracies; its own exact "
                                   "interval beside the bootstrap one), a randomization "
                                   "test (mean per-class accuracy, mAP) or a paired t test (few-shot episodes, "
                                   "low-shot fits), and a verdict per cell with the false discovery rate "
                                   "controlled over the cells compared (Benjamini-Hochberg).")
    c.add_argument("a", help="encoder A (judged against B)")
    c.add_argument("b", help="encoder B")
    add_store_options(c, "the config's store and its names and current settings")
    c.add_argument("--setting", action="append", help="only this protocol setting (repeatable)")
    c.add_argument("--alpha", type=float, default=0.05,
                   help="false discovery rate; the intervals are at 1 - alpha (default %(default)s)")
    c.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default %(default)s)")
    c.add_argument("--permutations", type=int, default=9999,
                   help="random swaps of the randomization test (default %(default)s)")
    c.add_argument("--seed", type=int, default=0, help="seed of the resampling (default %(default)s)")
    c.add_argument("--json", action="store_true", help="print every cell's statistics as JSON")
    c.set_defaults(func=cmd_compare)


def _pct(value: float) -> str:
    return f"{100 * value:.2f}"


def _mean_text(s) -> str:
    """A setting's mean difference, or why it has none (every cell's score untrusted)."""
    if math.isfinite(s.mean_difference):
        return f"mean difference {_pct(s.mean_difference)} points"
    return "no mean difference: no cell has a verdict (a score there is not to be trusted)"


def cmd_compare(args: argparse.Namespace) -> int:
    """``repeval compare A B``: the paired comparison of two encoders, a table (or JSON) and a summary per setting."""
    cfg, store = open_store_of(args)
    if cfg is not None:
        records, _ = config_records(store, cfg)
    else:
        every = list(Ledger(store))
        records = store_records(store, records=every)
        for line in names_of_several(r for r in every if r.get("model") in (args.a, args.b)):
            print_line(line, err=True)  # by name alone either config's record may be compared
    options = CompareOptions(alpha=args.alpha, n_resamples=args.resamples, n_permutations=args.permutations,
                             seed=args.seed)
    result = compare_encoders(store, records, args.a, args.b, options, settings=args.setting)
    decided = {cell: decided_by(v.comparison, v.verdict, v.p_adjusted, args.alpha) for cell, v in result.verdicts.items()}
    if args.json:
        out = result.to_dict()
        for entry, how in zip(out["cells"], decided.values()):  # the same order: the verdicts'
            entry.update({k: how[k] for k in ("test_ci_low", "test_ci_high", "agreement")})
        print_json(out, default=float)
        return 0
    if not result.verdicts:
        reasons = "; ".join(f"{n['cell']}: {n['reason']}" for n in result.not_compared[:5])
        raise RepevalError(f"no cell of {args.a} and {args.b} could be compared: {reasons}")
    rows = []
    for (setting, dataset, layer), v in result.verdicts.items():
        c, how = v.comparison, decided[setting, dataset, layer]
        exact = how["test_ci_low"] is not None
        rows.append({"setting": setting, "dataset": dataset, "layer": layer, "metric": c.metric,
                     "A %": _pct(c.score_a), "B %": _pct(c.score_b), "A-B": _pct(c.difference),
                     f"{100 * c.confidence:g}% bootstrap": f"[{_pct(c.ci_low)}, {_pct(c.ci_high)}]",
                     f"{100 * c.confidence:g}% test's interval": f"[{_pct(how['test_ci_low'])}, "
                                                                 f"{_pct(how['test_ci_high'])}]" if exact
                     else "\u2013",
                     "test": c.test + (f" ({c.a_only + c.b_only} of {c.n} discordant)" if exact else ""),
                     "p": f"{c.p_value:.3g}",
                     "p adj": "\u2013" if v.verdict == "unreliable" else f"{v.p_adjusted:.3g}",
                     "verdict": v.verdict})
    print(f"{args.a} (A) against {args.b} (B): {len(rows)} cell(s), false discovery rate {args.alpha:g} "
          f"(Benjamini-Hochberg over these cells), intervals at {100 * options.confidence:g} %")
    print_table(rows, list(rows[0]))
    print()
    for s in result.settings.values():
        print(f"{s.setting}: {args.a} better on {s.better}, worse on {s.worse}, indistinguishable on "
              f"{s.indistinguishable} of {s.n_cells} cell(s)" + (f", no verdict on {s.unreliable} (unreliable)"
                                                                  if s.unreliable else "")
              + "; " + _mean_text(s))
    for (setting, dataset, layer), v in result.verdicts.items():
        if v.verdict == "unreliable":  # a side's score is not to be trusted: say why, claim nothing
            print(f"{setting}/{dataset}/{layer}: {v.text}")
        elif decided[setting, dataset, layer]["agreement"]:  # interval and verdict read differently: say why
            print(f"{setting}/{dataset}/{layer}: {decided[setting, dataset, layer]['agreement']}")
    for n in result.not_compared:
        print_line(f"not compared: {n['cell']}: {n['reason']}")
    return 0
