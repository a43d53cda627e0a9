"""``repeval`` commands that read or write the store directly: extract, ls, verify, repair,
import-features, results. None of them imports Prefect, and only ``extract`` and
``repair`` import torch (they run a forward pass), so they answer quickly."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from flows.cli.printing import print_json, print_line, print_table
from flows.cli.ranks import print_ranks
from jobs.config import ExtractConfig, load_config
from jobs.config.encoders import check_weights
from jobs.evaluation.encoder_identity import names_of_several
from jobs.early.view import early_part, early_view
from jobs.report.results import config_cells, failed_rows, result_rows
from pipeline.errors import ArrayNotFoundError, CorruptImageError, RepevalError
from pipeline.plain import to_plain
from pipeline.protocols.fit_warnings import unreliable_reasons
from pipeline.protocols.registry import headline_metric, headline_value
from pipeline.terminal import printable
from storage_schema import FeatureStore
from storage_schema.evidence import verify_evidence
from storage_schema.ledger import Ledger
from storage_schema.tables import EXPORT_FORMATS, export_records, records_frame
from storage_schema.provenance import array_weights, short_weights, weights_summary
from storage_schema.store import DEFAULT_STORE
from storage_schema.weights_check import verify_weights

EXIT_PROBLEMS = 1  # verify / repair: damaged or incomplete arrays remain


def add_store_options(parser: argparse.ArgumentParser, config_help: str | None = None) -> None:
    """``--store`` and ``--config`` (the config's ``store:``, with its storage options): every
    command that reads or writes the store takes both; a config wins over ``--store``."""
    parser.add_argument("--store", default=DEFAULT_STORE,
                        help="store path or fsspec URL, when no --config is given (default %(default)s)")
    parser.add_argument("--config", help=config_help or "a config whose store (and storage options) to read")


def kv_pairs(pairs: Sequence[str]) -> dict:
    """``key=value`` pairs, from every ``--param`` given; values parsed as JSON when they
    parse (numbers, true, lists). A key given twice with different values is refused."""
    out: dict = {}
    for pair in pairs:
        if "=" not in pair:
            raise RepevalError(f"expected key=value, got {pair!r}")
        k, v = pair.split("=", 1)
        try:
            value = json.loads(v)
        except json.JSONDecodeError:
            value = v
        if k in out and out[k] != value:
            raise RepevalError(f"--param {k} given twice with different values: {out[k]!r} and {value!r}")
        out[k] = value
    return out


def cmd_extract(args: argparse.Namespace) -> int:
    """``repeval extract``: one encoder's features on a dataset's splits, written to the store."""
    # deferred: torch, timm and the dataset adapters load for `repeval extract` only
    from jobs.extraction.extract import extract
    from pipeline.datasets import make_dataset
    from pipeline.encoders import EncoderSpec, check_layers_available, load_encoder

    spec = EncoderSpec(name=args.name or args.arch, arch=args.arch, weights=args.weights, seed=args.seed,
                       layers=tuple(args.layers), input_size=args.input_size,
                       checkpoint_key=args.checkpoint_key, strip_prefixes=tuple(args.strip_prefixes))
    check_layers_available(spec)  # architecture and layers, before the store is touched
    check_weights(spec)
    dataset = make_dataset(args.dataset, name=args.dataset_name, **kv_pairs(args.param))
    splits = args.split or list(dataset.splits)
    config = ExtractConfig(batch_size=args.batch_size, chunk_batches=args.chunk_batches,
                           num_workers=int(args.workers) if args.workers.isdigit() else args.workers,
                           dtype=args.dtype, device=args.device, precision=args.precision, decode=args.decode,
                           wait=not args.no_wait, progress=not args.quiet, lease_ttl=args.lease_ttl)
    config.validate()
    bad = [s for s in splits if s not in dataset.splits]
    if bad:
        raise RepevalError(f"dataset {dataset.name!r} has no split {bad[0]!r}; splits: {', '.join(dataset.splits)}")
    _, store = open_store_of(args, read_only=False)
    encoder = load_encoder(spec, device=args.device, precision=config.precision, channels_last=config.channels_last)
    for split in splits:
        try:
            report = extract(store, encoder, dataset, split, config)
        except CorruptImageError as exc:
            if dataset.describe().get("skip_bad") is False:  # an adapter that can leave them out
                raise CorruptImageError(f"{exc}; to leave unreadable images out, add --param skip_bad=true "
                                        "(`repeval datasets show` names every one)") from exc
            raise
        if args.json:
            print_json(to_plain(report))
        elif report.status in ("cached", "aliased"):  # no forward pass: "0 images" would read as an empty split
            same = sorted(set(report.aliases.values()))
            print(f"{report.status:9s} {report.model}/{report.dataset}/{split}: {report.rows} images already in "
                  "the store" + (f" (identical weights: {same[0].split('/')[1]}'s features)" if same else ""))
        else:
            print(f"{report.status:9s} {report.model}/{report.dataset}/{split}: {report.images} images, "
                  f"{report.forward_batches} batches, {report.images_per_s:.0f} img/s")
        if report.skipped_ids and not args.json:
            print(f"          {len(report.skipped_ids)} unreadable image(s) left out: "
                  f"{', '.join(map(printable, report.skipped_ids[:5]))}{', ...' if len(report.skipped_ids) > 5 else ''}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    """``repeval ls``: the store's arrays, with the images adapters left out and what was done to checkpoints."""
    _, store = open_store_of(args)
    rows = []
    for st in store.list_arrays():
        enc = st.attrs.get("encoder", {})
        skipped = list(st.attrs.get("skipped_ids") or [])
        rows.append({
            "key": st.key, "shape": list(st.shape), "dtype": st.dtype,
            "status": "complete" if st.complete else f"partial {100 * st.fraction_done:.0f}%",
            "fingerprint": st.fingerprint[:12], "arch": enc.get("arch", ""),
            # the weights this array's extraction loaded (unknown: imported, or no record of them)
            "weights": short_weights(array_weights(st.attrs)) if st.key.startswith("features/") else "",
            "pooling": st.attrs.get("pooling", ""),
            "created": st.attrs.get("created", ""), "skipped": len(skipped), "skipped_ids": skipped,
            **({"checkpoint": enc["weights"]} if _from_checkpoint(enc.get("weights")) else {}),
        })
    if args.json:
        print_json(rows, indent=1)
        return 0
    if not rows:
        print(f"store {store.url} is empty")
        return 0
    print_table(rows, ["key", "shape", "dtype", "status", "arch", "weights", "pooling", "skipped", "fingerprint"])
    for r in rows:  # the data a dataset adapter left out is named, not only counted
        if r["skipped"] and r["key"].startswith("datasets/"):
            shown = ", ".join(map(printable, r["skipped_ids"][:10])) + (", ..." if r["skipped"] > 10 else "")
            print(f"{r['key']}: {r['skipped']} unreadable image(s) left out: {shown}")
    _print_checkpoints(rows)
    return 0


def _from_checkpoint(weights: object) -> bool:
    return isinstance(weights, dict) and weights.get("source") == "checkpoint"


def _print_checkpoints(rows: list[dict]) -> None:
    """What was done to each encoder's checkpoint file (inner key, prefix, dropped tensors,
    resampling), once per encoder and file."""
    seen = set()
    for r in rows:
        ck = r.get("checkpoint")
        model = r["key"].split("/")[1] if r["key"].startswith("features/") else r["key"]
        if ck is None or (model, ck.get("file")) in seen:
            continue
        seen.add((model, ck.get("file")))
        print(f"{model}: checkpoint {ck.get('file')}: {weights_summary(ck) or 'read as it is'}")


def cmd_verify(args: argparse.Namespace) -> int:
    """Read every chunk of every array; exit 1 if any is damaged or incomplete."""
    _, store = open_store_of(args)
    problems = 0
    for st in store.list_arrays():
        if not st.complete:
            problems += 1
            print(f"incomplete {st.key}: {len(st.done_chunks)} of {st.n_chunks} chunks written")
            continue
        bad = store.damaged_chunks(st.key)
        if bad:
            problems += 1
            print(f"damaged    {st.key}: chunk(s) {bad} fail their checksum")
        elif args.verbose_ok:
            print(f"ok         {st.key}")
    # each cell's evidence: chunks intact and still the bytes its record was made from
    checked, wrong = verify_evidence(store, Ledger(store))
    for problem in wrong:
        print_line(problem.line())
    if args.verbose_ok and checked:
        print(f"ok         {checked - len(wrong)} of {checked} cells' evidence (predictions, scores, episodes)")
    problems += len(wrong)
    # each record's arrays: from one set of weights, the one the record says
    weighed, findings = verify_weights(store, Ledger(store))
    for finding in findings:
        print_line(finding.line())
    mixed = sum(f.problem for f in findings)
    if args.verbose_ok and weighed:
        print(f"ok         {weighed - mixed} of {weighed} records' weights agree with their arrays")
    problems += mixed
    print(f"{problems} problem(s) in {store.url}")
    return EXIT_PROBLEMS if problems else 0


def cmd_repair(args: argparse.Namespace) -> int:
    """Recompute the chunks that fail their checksum; exit 1 if incomplete arrays remain."""
    # deferred: torch and timm load for `repeval repair` only
    from jobs.extraction.repair import repair

    _, store = open_store_of(args, read_only=False)
    summary = repair(store, args.key or None, weights=args.weights, device=args.device, lease_ttl=args.lease_ttl)
    if args.json:
        print_json(summary.to_dict())
    else:
        for r in summary.repaired:
            print(f"repaired   {r.key}: chunk(s) {r.chunks}")
        for key in summary.incomplete:
            print(f"incomplete {key}: not repaired; rerun its extraction to resume it")
        for failure in summary.failed:
            print(f"failed     {printable(failure)}")
        print(f"{summary.chunks} chunk(s) of {len(summary.repaired)} array(s) recomputed and verified "
              f"({summary.forward_batches} forward batches); {summary.checked} array(s) checked in {store.url}")
    if summary.failed:
        return 2
    return EXIT_PROBLEMS if summary.incomplete else 0


def cmd_import(args: argparse.Namespace) -> int:
    """``repeval import-features``: precomputed features (.npz/.npy) filed in the store."""
    # deferred: the dataset adapters and PIL load for `repeval import-features` only
    from jobs.extraction.import_features import import_features
    from pipeline.datasets import make_dataset

    dataset = make_dataset("features", name=args.dataset_name, path=args.path)
    _, store = open_store_of(args, read_only=False)
    for split in args.split or dataset.splits:
        rep = import_features(store, args.model, dataset, split, layer=args.layer, dtype=args.dtype)
        print(f"{rep.status:8s} {rep.key}: {rep.rows} x {rep.dim}")
    return 0


# each protocol's headline by its own name (the entry's primary metric), not fixed metric columns
RESULT_COLUMNS = ("model", "dataset", "layer", "setting", "headline", "value", "converged", "warnings")
HISTORY_COLUMNS = ("current", "settings", "recorded")
FAILURE_COLUMNS = ("kind", "label", "reason", "attempts", "first_failed", "recorded")


def cmd_datasets_show(args: argparse.Namespace) -> int:
    """``repeval datasets show``: one dataset copy's splits, counts, classes and problems;
    exit 1 when a dense dataset holds a target a run would refuse (each one named)."""
    # deferred: the dataset adapters and PIL load for `repeval datasets show` only
    from pipeline.datasets import dataset_summary, format_summary, make_dataset

    summary = dataset_summary(make_dataset(args.adapter, name=args.name, **kv_pairs(args.param)),
                              decode=not args.no_decode)
    print(json.dumps(summary, indent=1) if args.json else format_summary(summary))
    return 1 if any((summary.get("bad_targets") or {}).values()) else 0


def cmd_results(args: argparse.Namespace) -> int:
    """The records of the config's current settings (or the store's latest per cell); with
    --all the history too; with --failed the failures on record."""
    if args.format not in EXPORT_FORMATS:
        raise RepevalError(f"--format {args.format!r} is not one of {', '.join(EXPORT_FORMATS)}")
    if args.format != "table" and not args.output:
        raise RepevalError(f"--format {args.format} needs --output PATH")
    cfg, store = open_store_of(args)
    if args.failed:
        return _failed(store, cfg, args)
    if getattr(args, "early", False):
        return _early(store, cfg, args)

    rows, missing = result_rows(store, cfg, args.all)
    if cfg is None:
        for line in names_of_several(list(Ledger(store))):  # two configs, one name: by name, either may show
            print_line(line, err=True)
    if args.ranks:
        return print_ranks([r for r in rows if r.get("current", True)], args,
                           cfg.correlation if cfg is not None else None)
    if args.format != "table":
        export_records(rows, args.output, args.format)
        print(f"wrote {args.output} ({len(rows)} records)")
        return 0
    if not rows:
        print("no records" + (f"; {missing} cell(s) of the config not evaluated yet" if missing else ""))
        return 0
    frame = records_frame([{**r, "headline": headline_metric(r.get("protocol")), "value": headline_value(r)}
                           for r in rows])  # an audit's row has none (its metrics: --format csv)
    cols = [c for c in RESULT_COLUMNS if c in frame]
    if "step" in frame and frame["step"].notna().any():
        cols.insert(1, "step")  # a series' checkpoints, read in training order
    if "recorded_as" in frame and frame["recorded_as"].notna().any():
        cols.append("recorded_as")  # a name sharing the record of identical weights
    cols += [c for c in HISTORY_COLUMNS if args.all and c in frame] + ["cell_id"]
    print(frame[cols].map(lambda v: printable(v) if isinstance(v, str) else v).to_string(index=False))

    for r in rows:  # the warnings column names the codes; an untrusted score also says why
        reasons = unreliable_reasons(r)
        if reasons:
            print_line(f"unreliable: {r.get('model')}/{r.get('dataset')}/{r.get('layer')}:{r.get('setting')}: "
                       + "; ".join(reasons))
    if missing:
        print(f"{missing} cell(s) of the config not evaluated yet (or failed: repeval results --failed)")
    return 0


EARLY_COLUMNS = ("encoder", "cell", "status", "estimate", "low", "high", "method", "early verdicts", "exact",
                 "interval held")


def _early(store, cfg, args: argparse.Namespace) -> int:
    """The early estimates of the config's encoders (or the store's), each beside its exact
    figure once known: never mixed with the exact records."""
    planned = config_cells(store, cfg)[2].config if cfg is not None else None  # its scanned checkpoints too
    part = early_part(early_view(store, planned))
    rows = [{**r, "early verdicts": "; ".join(f"{v['kind']} {v['against']}: {v['verdict']}" for v in r["verdicts"])
             or "-"} for r in part["estimates"]]
    if args.format == "json":
        with open(args.output, "w") as f:
            json.dump(part, f, indent=1)
        print(f"wrote {args.output} ({len(rows)} early estimates)")
    elif args.format != "table":
        raise RepevalError("--early writes a table or json (early estimates are never exported with the exact "
                           "records)")
    elif not rows:
        print("no early estimates on record (repeval run --early makes them)")
    else:
        for r in rows:
            for k in ("estimate", "low", "high", "exact"):
                r[k] = "-" if r.get(k) is None else f"{r[k]:.4f}"
            held = {True: "yes", False: "no", None: "-"}[r.get("held")]
            # a sampling interval is of the early fit over the whole test split, not of the exact figure
            r["interval held"] = held if r.get("method") != "sampling" or r.get("target") is None else \
                f"{held} (early fit: {r['target']:.4f})"
        print("early estimates (not exact figures; the exact column once the full run recorded it):")
        print_table(rows, EARLY_COLUMNS)
        for c in part["coverage"]:
            print_line(f"coverage of {c['setting']} ({c['protocol']}): {c['line']}")
    return 0


def _failed(store, cfg, args: argparse.Namespace) -> int:
    rows = failed_rows(store, cfg)
    if args.format == "json":
        with open(args.output, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {args.output} ({len(rows)} failures)")
    elif args.format != "table":
        raise RepevalError("--failed writes a table or json")
    elif not rows:
        print("no failures on record")
    else:
        print_table(rows, FAILURE_COLUMNS)
    return 0


def open_store_of(args: argparse.Namespace, read_only: bool = True):
    """(config or None, store): ``--config``'s store (with its storage options), else ``--store``."""
    if getattr(args, "config", None):
        cfg = load_config(args.config)
        return cfg, cfg.open_store(read_only=read_only)
    try:
        return None, FeatureStore(args.store, read_only=read_only)
    except ArrayNotFoundError:
        if args.store != DEFAULT_STORE:
            raise
        raise ArrayNotFoundError(f"no repeval store at {DEFAULT_STORE!r} (the default); name one with "
                                 "--store PATH or --config CONFIG (its store:)") from None
