"""``repeval results --ranks``: each encoder's rank per dataset and protocol setting, then
how every pair of settings agrees (Kendall's tau, Spearman's rho with bootstrap
intervals, order flips). No Prefect; scipy only once there are records to rank."""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli.printing import print_line, print_table
from jobs.analysis.ranks import rank_agreement_of, rank_rows
from pipeline.errors import RepevalError
from storage_schema.ledger import export_records

RANK_COLUMNS = ("dataset", "setting", "rank", "model", "layer", "score")
PAIR_COLUMNS = ("dataset", "settings", "n", "kendall_tau", "kendall_ci", "spearman_rho", "spearman_ci", "flips")


def _ci(ci: Any) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "-"


def print_ranks(records: list[dict[str, Any]], args: argparse.Namespace, correlation: Any = None) -> int:
    """Print (or, with ``--format``, write) the ranks and the settings' agreement."""
    rows = rank_rows(records)
    if args.format != "table":
        if args.format not in ("csv", "json"):
            raise RepevalError(f"--ranks writes a table, csv or json, not {args.format!r}")

        export_records(rows, args.output, args.format)
        print(f"wrote {args.output} ({len(rows)} ranks)")
        return 0
    if not rows:
        print("no scored records to rank")
        return 0
    print_table([{**r, "rank": f"{r['rank']:g}", "score": f"{r['score']:.4f}"} for r in rows], RANK_COLUMNS)
    n_bootstrap = correlation.bootstrap if correlation is not None else 1000
    seed = correlation.seed if correlation is not None else 0
    pairs, skipped = [], []
    for agreement in rank_agreement_of(records, n_bootstrap, seed):
        for p in agreement.pairs:
            pairs.append({"dataset": p["dataset"], "settings": f"{p['setting_a']} vs {p['setting_b']}", "n": p["n"],
                          "kendall_tau": f"{p['kendall_tau']:.3f}", "kendall_ci": _ci(p["kendall_ci"]),
                          "spearman_rho": f"{p['spearman_rho']:.3f}", "spearman_ci": _ci(p["spearman_ci"]),
                          "flips": f"{p['flips']} of {p['n_pairs']}"})
        skipped += [f"{agreement.dataset}: {a} vs {b}: {why}" for a, b, why in agreement.skipped]
    print()
    if pairs:
        print(f"agreement between settings ({n_bootstrap} bootstrap resamples over encoders, seed {seed}):")
        print_table(pairs, PAIR_COLUMNS)
    if skipped:
        print("not compared:")
        for line in skipped:
            print_line(f"  {line}")
    return 0
