"""The ``repeval`` command line. Store-only commands never import Prefect (fast start)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports timm

from pipeline.errors import RepevalError  # noqa: E402
from storage_schema.store import DEFAULT_STORE  # noqa: E402


def _kv(pairs: Sequence[str]) -> dict:
    """``key=value`` pairs; values parsed as JSON when they parse (numbers, true, lists)."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise RepevalError(f"expected key=value, got {pair!r}")
        k, v = pair.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def cmd_extract(args: argparse.Namespace) -> int:
    from jobs.extract import ExtractConfig, extract
    from pipeline.datasets import make_dataset
    from pipeline.encoders import EncoderSpec, check_checkpoint_fits, check_layers_available, load_encoder
    from storage_schema import FeatureStore

    spec = EncoderSpec(name=args.name or args.arch, arch=args.arch, weights=args.weights, seed=args.seed,
                       layers=tuple(args.layers), input_size=args.input_size)
    check_layers_available(spec)  # architecture and layers, before the store is touched
    check_checkpoint_fits(spec)
    dataset = make_dataset(args.dataset, name=args.dataset_name, **_kv(args.param))
    splits = args.split or list(dataset.splits)
    config = ExtractConfig(batch_size=args.batch_size, chunk_batches=args.chunk_batches,
                           num_workers=args.workers, dtype=args.dtype, device=args.device,
                           wait=not args.no_wait, progress=not args.quiet, lease_ttl=args.lease_ttl)
    config.validate()
    bad = [s for s in splits if s not in dataset.splits]
    if bad:
        raise RepevalError(f"dataset {dataset.name!r} has no split {bad[0]!r}; splits: {', '.join(dataset.splits)}")
    store = FeatureStore(args.store)
    encoder = load_encoder(spec, device=args.device)
    for split in splits:
        report = extract(store, encoder, dataset, split, config)
        print(json.dumps(report.to_dict()) if args.json else
              f"{report.status:9s} {report.model}/{report.dataset}/{split}: {report.images} images, "
              f"{report.forward_batches} batches, {report.images_per_s:.0f} img/s")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from storage_schema import FeatureStore

    store = FeatureStore(args.store, read_only=True)
    rows = []
    for st in store.list_arrays():
        enc = st.attrs.get("encoder", {})
        rows.append({
            "key": st.key, "shape": list(st.shape), "dtype": st.dtype,
            "status": "complete" if st.complete else f"partial {100 * st.fraction_done:.0f}%",
            "fingerprint": st.fingerprint[:12], "arch": enc.get("arch", ""),
            "weights": str(enc.get("weights_fingerprint", ""))[:12], "pooling": st.attrs.get("pooling", ""),
            "created": st.attrs.get("created", ""),
        })
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"store {store.url} is empty")
        return 0
    cols = ["key", "shape", "dtype", "status", "arch", "weights", "pooling", "fingerprint"]
    table = [[str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Read every chunk of every array; exit 1 if any is damaged or incomplete."""
    from storage_schema import FeatureStore

    store = FeatureStore(args.store, read_only=True)
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
    print(f"{problems} problem(s) in {store.url}")
    return 1 if problems else 0


def cmd_repair(args: argparse.Namespace) -> int:
    """Recompute the chunks that fail their checksum; exit 1 if incomplete arrays remain."""
    from jobs.repair import repair
    from storage_schema import FeatureStore

    store = FeatureStore(args.store)
    summary = repair(store, args.key or None, weights=args.weights, device=args.device, lease_ttl=args.lease_ttl)
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        for r in summary.repaired:
            print(f"repaired   {r.key}: chunk(s) {r.chunks}")
        for key in summary.incomplete:
            print(f"incomplete {key}: not repaired; rerun its extraction to resume it")
        for failure in summary.failed:
            print(f"failed     {failure}")
        print(f"{summary.chunks} chunk(s) of {len(summary.repaired)} array(s) recomputed and verified "
              f"({summary.forward_batches} forward batches); {summary.checked} array(s) checked in {store.url}")
    if summary.failed:
        return 2
    return 1 if summary.incomplete else 0


def cmd_import(args: argparse.Namespace) -> int:
    from jobs.import_features import import_features
    from pipeline.datasets import make_dataset
    from storage_schema import FeatureStore

    dataset = make_dataset("features", name=args.dataset_name, path=args.path)
    store = FeatureStore(args.store)
    for split in args.split or dataset.splits:
        rep = import_features(store, args.model, dataset, split, layer=args.layer)
        print(f"{rep.status:8s} {rep.key}: {rep.rows} x {rep.dim}")
    return 0


def cmd_datasets_show(args: argparse.Namespace) -> int:
    from pipeline.datasets import show_dataset

    print(show_dataset(args.adapter, _kv(args.param), name=args.name, as_json=args.json))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from flows.runtime import prepare_environment

    prepare_environment()
    from flows.benchmark import run_benchmark
    from jobs.config import load_config
    from jobs.plan import check_plan

    cfg = load_config(args.config)
    check_plan(cfg)  # bad config: fail before starting Prefect or Dask
    summary = run_benchmark(cfg, dask_address=args.dask_address)
    if args.json:
        print(json.dumps({k: v for k, v in summary.items() if k not in ("extractions", "outcomes")}, default=str))
    else:
        print(f"extracted {summary['extracted']} of {summary['units']} encoder/dataset splits "
              f"({summary['images']} images), evaluated {summary['computed']} of {summary['cells']} cells "
              f"({summary['cached']} from the ledger) in {summary['seconds']:.1f} s")
        print(f"report: {summary['report']}")
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    from storage_schema.ledger import EXPORT_FORMATS, Ledger

    if args.format not in EXPORT_FORMATS:
        raise RepevalError(f"--format {args.format!r} is not one of {', '.join(EXPORT_FORMATS)}")
    ledger = Ledger(_open_store_of(args))
    if args.format == "table":
        frame = ledger.to_frame()
        cols = [c for c in ("model", "dataset", "layer", "setting", "metric.score", "metric.top1",
                            "converged", "cell_id") if c in frame]
        print(frame[cols].to_string(index=False) if not frame.empty else "the ledger is empty")
        return 0
    if not args.output:
        raise RepevalError(f"--format {args.format} needs --output PATH")
    ledger.export(args.output, args.format)
    print(f"wrote {args.output}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from jobs.checkpoint_scan import with_scanned_checkpoints
    from jobs.config import load_config
    from jobs.evaluate import cell_identity
    from jobs.plan import evaluation_cells
    from jobs.report_inputs import correlate_and_report
    from storage_schema.ledger import Ledger

    cfg = with_scanned_checkpoints(load_config(args.config))
    store = cfg.open_store(read_only=True)
    ledger = Ledger(store)
    cells, missing = [], 0
    for cell in evaluation_cells(cfg):
        try:
            cid = cell_identity(store, cell)[0]
        except RepevalError:  # features not extracted yet
            missing += 1
            continue
        if ledger.has(cid):
            cells.append((cid, cell.setting))
        else:
            missing += 1
    out = correlate_and_report(store, cfg, cells, path=args.output)
    print(f"report: {out['report']} ({out['records']} cells; {missing} not evaluated yet)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from flows.runtime import prepare_environment

    prepare_environment()
    from flows.runtime import prefect_api
    from flows.schedules import serve_schedules
    from jobs.config import load_config
    from jobs.plan import check_plan

    path = os.path.abspath(args.config)
    check_plan(load_config(path))  # refuse a broken config before serving it forever
    with prefect_api(scheduler=True) as api:
        print(f"serving schedules for {path} on {api} (Ctrl-C stops)", file=sys.stderr, flush=True)
        serve_schedules(path, cron=args.cron, interval=args.interval, watch_interval=args.watch_interval)
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    # No prepare_environment(): the deployment goes to the user's Prefect server, taken
    # from their own Prefect profile or PREFECT_API_URL, never to an embedded one.
    from flows.deploy import deploy_config

    d = deploy_config(args.config, args.pool, name=args.name, cron=args.cron, timezone=args.timezone)
    print(f"deployed {d.name} ({d.id}) on {d.api_url}: cron {args.cron!r} "
          f"({args.timezone or 'UTC'}), reruns on protocol changes of {d.config_path}")
    print(f"runs go to work pool {args.pool!r}; start a worker: prefect worker start --pool {args.pool}")
    print(f"run now: prefect deployment run '{d.name}'")
    print(f"after editing protocol settings: {d.emit_command()}")
    return 0


def _open_store_of(args: argparse.Namespace):
    """``--config``'s store (with its storage options), else ``--store``; read-only."""
    if getattr(args, "config", None):
        from jobs.config import load_config

        return load_config(args.config).open_store(read_only=True)
    from storage_schema import FeatureStore

    return FeatureStore(args.store, read_only=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="repeval", description="Judge frozen image encoders from a feature store.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("extract", help="extract an encoder's features on a dataset into the store")
    e.add_argument("--store", default=DEFAULT_STORE, help="store path or fsspec URL (default %(default)s)")
    e.add_argument("--arch", required=True, help="timm architecture, e.g. resnet18")
    e.add_argument("--name", help="encoder name in the store (default: the architecture)")
    e.add_argument("--weights", default="random", help="'random', a checkpoint path, or 'pretrained'")
    e.add_argument("--seed", type=int, default=0, help="seed of random-init weights")
    e.add_argument("--layers", nargs="+", default=["pre_logits"], help="pre_logits and/or block<i>")
    e.add_argument("--input-size", type=int, help="override the model's input size")
    e.add_argument("--dataset", required=True, help="dataset adapter: digits, textures, image_folder, ...")
    e.add_argument("--dataset-name", help="dataset name in the store (default: the adapter's)")
    e.add_argument("--param", nargs="*", default=[], help="adapter parameters as key=value")
    e.add_argument("--split", nargs="*", help="splits to extract (default: all)")
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--chunk-batches", type=int, default=4, help="batches per stored chunk")
    e.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    e.add_argument("--dtype", default="float32", help="float32 or float16")
    e.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    e.add_argument("--no-wait", action="store_true", help="skip arrays another process is extracting")
    e.add_argument("--lease-ttl", type=float, default=60.0,
                   help="seconds without heartbeat after which a writer counts as dead (default %(default)s)")
    e.add_argument("--json", action="store_true", help="print one JSON report per split")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=cmd_extract)

    ls = sub.add_parser("ls", help="list what the store holds")
    ls.add_argument("--store", default=DEFAULT_STORE)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)

    ver = sub.add_parser("verify", help="read every chunk: report damaged (checksum) or incomplete arrays")
    ver.add_argument("--store", default=DEFAULT_STORE)
    ver.add_argument("--all", dest="verbose_ok", action="store_true", help="also list the arrays that are fine")
    ver.set_defaults(func=cmd_verify)

    rp = sub.add_parser("repair", help="recompute exactly the chunks that fail their checksum, then verify")
    rp.add_argument("--store", default=DEFAULT_STORE)
    rp.add_argument("--key", nargs="*", help="arrays to repair (default: every array of the store)")
    rp.add_argument("--weights", help="checkpoint to use where an array's recorded one moved (same weights)")
    rp.add_argument("--device", help="torch device (default: the device type of the extraction)")
    rp.add_argument("--lease-ttl", type=float, default=60.0, help="lease TTL in seconds (default %(default)s)")
    rp.add_argument("--json", action="store_true", help="print the summary as JSON")
    rp.set_defaults(func=cmd_repair)

    imp = sub.add_parser("import-features", help="import precomputed features from .npz/.npy")
    imp.add_argument("--store", default=DEFAULT_STORE)
    imp.add_argument("--model", required=True, help="encoder name to file the features under")
    imp.add_argument("--path", required=True, help=".npz file or folder of .npy files")
    imp.add_argument("--dataset-name", required=True)
    imp.add_argument("--layer", default="pre_logits")
    imp.add_argument("--split", nargs="*")
    imp.set_defaults(func=cmd_import)
    dsp = sub.add_parser("datasets", help="inspect a dataset copy before a long run")
    show = dsp.add_subparsers(dest="datasets_command", required=True).add_parser(
        "show", help="splits, image counts, classes, metric, validation, skipped files and fingerprint")
    show.add_argument("adapter", help="dataset adapter, e.g. aircraft, imagenet, webdataset, hf")
    show.add_argument("--param", action="extend", nargs="+", default=[], help="adapter parameters as key=value")
    show.add_argument("--name", help="dataset name (default: the adapter's)")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.set_defaults(func=cmd_datasets_show)

    run = sub.add_parser("run", help="extract, evaluate, correlate and report what a config asks for")
    run.add_argument("config", help="benchmark config (YAML)")
    run.add_argument("--dask-address", help="an existing Dask scheduler, e.g. tcp://host:8786")
    run.add_argument("--json", action="store_true", help="print the run summary as JSON")
    run.set_defaults(func=cmd_run)

    res = sub.add_parser("results", help="the results ledger as a table, CSV or Parquet")
    res.add_argument("--store", default=DEFAULT_STORE)
    res.add_argument("--config", help="take the store from this config")
    res.add_argument("--format", default="table", help="table, csv, parquet or json")
    res.add_argument("--output", help="file to write (csv, parquet, json)")
    res.set_defaults(func=cmd_results)

    rep = sub.add_parser("report", help="write the HTML report of a config from the ledger")
    rep.add_argument("config")
    rep.add_argument("--output", help="HTML path (default: the config's report.path)")
    rep.set_defaults(func=cmd_report)

    srv = sub.add_parser("serve", help="run the schedules: checkpoint scan (cron) and protocol watch")
    srv.add_argument("config")
    srv.add_argument("--cron", default="0 2 * * *", help="checkpoint scan schedule (default: %(default)s)")
    srv.add_argument("--interval", type=float, help="scan every so many seconds instead of --cron")
    srv.add_argument("--watch-interval", type=float, default=60.0,
                     help="seconds between checks for changed protocol settings (default %(default)s)")
    srv.set_defaults(func=cmd_serve)

    dep = sub.add_parser("deploy", help="deploy a config's benchmark to a Prefect server's work pool")
    dep.add_argument("config")
    dep.add_argument("--pool", required=True, help="work pool whose workers run it (e.g. a process pool)")
    dep.add_argument("--cron", default="0 2 * * *", help="schedule (default: %(default)s)")
    dep.add_argument("--timezone", help="IANA time zone of --cron (default: UTC)")
    dep.add_argument("--name", help="deployment name (default: the config file's name without suffix)")
    dep.set_defaults(func=cmd_deploy)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except RepevalError as exc:
        print(f"repeval: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
