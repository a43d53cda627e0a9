"""``repeval cog-levels``: the ImageNet-CoG concept-generalisation levels from the files
that ship with ImageNet-21K (``pipeline.analysis.cog_build``), a summary of the levels printed, and
with images a config fragment evaluating them the paper's way. No Prefect, no torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cli.printing import print_table
from pipeline.errors import RepevalError

SHOTS = [1, 2, 4, 8, 16, 32, 64, 128]  # training images per concept (Sariyildiz et al. 2021)
N_SEEDS = 5
FRAGMENT = "cog.yaml"
SUMMARY_COLUMNS = ("level", "n_concepts", "similarity_max", "similarity_min", "similarity_mean", "n_train_images",
                   "n_test_images")


def add_cog_parser(sub: Any) -> None:
    """Register ``cog-levels`` on the CLI's subparsers."""
    c = sub.add_parser("cog-levels", help="build the ImageNet-CoG levels (unseen concepts ranked by similarity "
                                          "to ImageNet-1K) and their manifests")
    c.add_argument("--is-a", required=True, help="WordNet is_a pairs 'parent child' (wordnet.is_a.txt)")
    c.add_argument("--words", required=True, help="synset words 'id<TAB>words' (words.txt)")
    c.add_argument("--counts", required=True, help="images per ImageNet-21K synset, 'id count' per line")
    c.add_argument("--seen", required=True, help="the ImageNet-1K synset ids (first field of each line)")
    c.add_argument("--out", required=True, help="output folder: manifests, concepts.csv, summary.csv, cog.yaml")
    c.add_argument("--images", help="ImageNet-21K images, one folder per synset id (without: no manifests)")
    c.add_argument("--exclude", action="extend", nargs="+", default=[],
                   help="lists of synset ids to leave out (repeatable)")
    c.add_argument("--seed", type=int, default=0, help="seed of the per-concept image draw")
    # defaults: pipeline.analysis.cog's (the paper's), applied there; not imported here to keep the CLI's start fast
    c.add_argument("--n-test", type=int, help="test images per concept (default 50)")
    c.add_argument("--max-train", type=int, help="most train images per concept (default 1300)")
    c.add_argument("--min-images", type=int, help="fewest images of an eligible concept (default 782)")
    c.add_argument("--n-levels", type=int, help="number of levels (default 5)")
    c.add_argument("--level-size", type=int, help="concepts per level (default 1000)")
    c.add_argument("--root", help="top synset (default n00001740, entity)")
    c.add_argument("--person", help="subtree left out, 'none' for none (default n00007846, person)")
    c.set_defaults(func=cmd_cog_levels)


def cog_fragment(out: Path, n_levels: int) -> dict[str, Any]:
    """The config entries that evaluate the levels as the paper does: each level a
    ``csv_manifest`` dataset; logistic regression on L2-normalised features with every
    training image, and with N in {1, 2, 4, ..., 128} images per concept, 5 seeds each."""
    names = [f"cog-l{k}" for k in range(1, n_levels + 1)]
    datasets = [{"name": name, "adapter": "csv_manifest", "params": {"csv_path": str(out / f"level_{k}.csv")}}
                for k, name in enumerate(names, start=1)]
    protocols = [
        {"name": "cog-linear", "protocol": "logistic", "settings": {"transform": "l2"}, "datasets": names},
        {"name": "cog-lowshot", "protocol": "lowshot", "datasets": names,
         "settings": {"probe": "logistic", "transform": "l2", "shots": [*SHOTS, "all"], "n_seeds": N_SEEDS}},
    ]
    return {"datasets": datasets, "protocols": protocols}


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line (the others keep pipeline.analysis.cog's defaults)."""
    names = ("seed", "n_test", "max_train", "min_images", "n_levels", "level_size", "root", "person")
    options = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    if str(options.get("person", "")).lower() == "none":
        options["person"] = None
    return options


def cmd_cog_levels(args: argparse.Namespace) -> int:
    """Build and write the levels; print their summary (and where the manifests are)."""
    import yaml

    # deferred: the dataset adapters and PIL load for this command only
    from pipeline.analysis.cog_build import build_cog_levels

    for name in ("is_a", "words", "counts", "seen"):
        if not Path(getattr(args, name)).is_file():
            raise RepevalError(f"--{name.replace('_', '-')} {getattr(args, name)!r} is not a file")
    if args.images is not None and not Path(args.images).is_dir():
        raise RepevalError(f"--images {args.images!r} is not a folder")
    out = Path(args.out).resolve()
    result = build_cog_levels(args.is_a, args.words, args.counts, args.seen, out, images_root=args.images,
                              excluded=args.exclude, **_options(args))
    rows = [{k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()} for row in result.summary]
    print_table(rows, [c for c in SUMMARY_COLUMNS if c in result.summary[0]])
    print(f"{sum(len(level) for level in result.levels)} concepts in {len(result.levels)} levels, "
          f"{len(result.eligible)} eligible; written to {out}")
    if args.images:
        fragment = cog_fragment(out, len(result.levels))
        (out / FRAGMENT).write_text(yaml.safe_dump(fragment, sort_keys=False))
        print(f"manifests level_1.csv .. level_{len(result.levels)}.csv; config entries to evaluate them: "
              f"{out / FRAGMENT}")
    return 0
