"""The ``repeval`` command line. Store-only commands never import Prefect (fast start)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports timm

from flows.cli.cog import add_cog_parser  # noqa: E402
from flows.cli.compare import add_compare_parser  # noqa: E402
from flows.cli.printing import cut, error_lines, note  # noqa: E402
from flows.cli.registry import add_registry_commands  # noqa: E402
from flows.cli.run import cmd_deploy, cmd_report, cmd_run, cmd_serve  # noqa: E402
from flows.cli.store import (  # noqa: E402
    add_store_options, cmd_datasets_show, cmd_extract, cmd_import, cmd_ls, cmd_repair, cmd_results, cmd_verify,
)
from pipeline.errors import RepevalError  # noqa: E402
from pipeline.terminal import TerminalStream  # noqa: E402
from storage_schema.leases import DEFAULT_TTL  # noqa: E402

EXIT_ERROR = 2
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
EXIT_PIPE = 128 + 13  # SIGPIPE's: the reader of the output went away (`| head`), as Unix tools exit


class Repeated(argparse.Action):
    """A list option that may be given several times, its values merged in order
    (``--param root=DIR --param test_fraction=0.25``); the first use replaces the default."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, f"_{self.dest}_given", False)
        items = list(getattr(namespace, self.dest, None) or []) if given else []
        setattr(namespace, self.dest, items + list(values))
        setattr(namespace, f"_{self.dest}_given", True)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: every command, its options and its help."""
    p = argparse.ArgumentParser(prog="repeval", description="Judge frozen image encoders from a feature store.",
                                epilog="exit codes: 0 done, 1 verify/repair found problems, 2 a mistake (config, "
                                       "data, arguments), 3 run finished with failures, 4 internal error, 141 the "
                                       "output's reader went away (| head)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level, show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("extract", help="extract an encoder's features on a dataset into the store")
    add_store_options(e, "a config whose store (and storage options) to extract into")
    e.add_argument("--arch", required=True, help="timm architecture, e.g. resnet18")
    e.add_argument("--name", help="encoder name in the store (default: the architecture)")
    e.add_argument("--weights", default="random", help="'random', a checkpoint path, or 'pretrained'")
    e.add_argument("--seed", type=int, default=0, help="seed of random-init weights")
    e.add_argument("--layers", action=Repeated, nargs="+", default=["pre_logits"],
                   help="pre_logits, block<i> and/or block<i>.tokens (repeatable)")
    e.add_argument("--input-size", type=int, help="override the model's input size")
    e.add_argument("--checkpoint-key", help="where a checkpoint holding several state dicts keeps the weights "
                                            "(e.g. teacher; default: found from the architecture)")
    e.add_argument("--strip-prefixes", action=Repeated, nargs="+", default=[],
                   help="name prefixes tried besides the usual ones (module., backbone., encoder_q., ...)")
    e.add_argument("--dataset", required=True, help="dataset adapter: digits, textures, image_folder, ...")
    e.add_argument("--dataset-name", help="dataset name in the store (default: the adapter's)")
    e.add_argument("--param", action=Repeated, nargs="*", default=[],
                   help="adapter parameters as key=value (repeatable)")
    e.add_argument("--split", action=Repeated, nargs="*", help="splits to extract (repeatable; default: all)")
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--chunk-batches", type=int, default=4, help="batches per stored chunk")
    e.add_argument("--workers", default="auto",
                   help="DataLoader worker processes, or auto (none on the CPU, one per core on a GPU)")
    e.add_argument("--precision", default="auto", help="auto, float32, float16 or bfloat16 (autocast)")
    e.add_argument("--decode", default="pil", help="pil, or device: JPEG files decoded on the GPU")
    e.add_argument("--dtype", default="float32", help="float32 or float16")
    e.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    e.add_argument("--no-wait", action="store_true", help="skip arrays another process is extracting")
    e.add_argument("--lease-ttl", type=float, default=DEFAULT_TTL,
                   help="seconds without heartbeat after which a writer counts as dead (default %(default)s)")
    e.add_argument("--json", action="store_true", help="print one JSON report per split")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=cmd_extract)

    ls = sub.add_parser("ls", help="list what the store holds (and the images adapters left out)")
    add_store_options(ls)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)

    ver = sub.add_parser("verify", help="read every chunk: report damaged (checksum) or incomplete arrays, "
                                        "and evidence that differs from its record")
    add_store_options(ver)
    ver.add_argument("--all", dest="verbose_ok", action="store_true", help="also list the arrays that are fine")
    ver.set_defaults(func=cmd_verify)

    rp = sub.add_parser("repair", help="recompute exactly the chunks that fail their checksum, then verify")
    add_store_options(rp)
    rp.add_argument("--key", action=Repeated, nargs="*",
                    help="arrays to repair (repeatable; default: every array of the store)")
    rp.add_argument("--weights", help="checkpoint to use where an array's recorded one moved (same weights)")
    rp.add_argument("--device", help="torch device (default: the device type of the extraction)")
    rp.add_argument("--lease-ttl", type=float, default=DEFAULT_TTL,
                    help="lease TTL in seconds (default %(default)s)")
    rp.add_argument("--json", action="store_true", help="print the summary as JSON")
    rp.set_defaults(func=cmd_repair)

    imp = sub.add_parser("import-features", help="import precomputed features from .npz/.npy")
    add_store_options(imp, "a config whose store (and storage options) to import into")
    imp.add_argument("--model", required=True, help="encoder name to file the features under")
    imp.add_argument("--path", required=True, help=".npz file or folder of .npy files")
    imp.add_argument("--dataset-name", required=True)
    imp.add_argument("--layer", default="pre_logits")
    imp.add_argument("--split", action=Repeated, nargs="*", help="splits to import (repeatable; default: all)")
    imp.add_argument("--dtype", choices=("float16", "float32"),
                     help="stored dtype (default: float16 features stay float16, others become float32)")
    imp.set_defaults(func=cmd_import)
    add_registry_commands(sub, cmd_datasets_show)  # protocols, datasets [list|show]

    run = sub.add_parser("run", help="extract, evaluate, correlate and report what a config asks for")
    run.add_argument("config", help="benchmark config (YAML)")
    run.add_argument("--dask-address", help="an existing Dask scheduler, e.g. tcp://host:8786")
    run.add_argument("--json", action="store_true", help="print the run summary as JSON")
    run.add_argument("--allow-failures", action="store_true",
                     help="exit 0 even when some cells, extractions or checkpoints failed (default: exit 3)")
    run.add_argument("--retry-failed", action="store_true",
                     help="take scanned checkpoints that failed before even if unchanged")
    run.add_argument("--early", action="store_true",
                     help="judge new encoders from a part of each dataset first (the config's early: section)")
    run.set_defaults(func=cmd_run)

    res = sub.add_parser("results", help="the results of the current settings as a table, CSV or Parquet")
    add_store_options(res, "the config's store, its names and its current settings")
    res.add_argument("--all", action="store_true", help="every record, with 'current', 'settings', 'recorded'")
    res.add_argument("--failed", action="store_true", help="what failed (cells, extractions, checkpoints)")
    res.add_argument("--ranks", action="store_true",
                     help="each encoder's rank per dataset and setting, and how the settings' rankings agree")
    res.add_argument("--early", action="store_true",
                     help="the early estimates of the config's encoders, each beside its exact figure once known")
    res.add_argument("--format", default="table", help="table, csv, parquet or json")
    res.add_argument("--output", help="file to write (csv, parquet, json)")
    res.set_defaults(func=cmd_results)

    add_compare_parser(sub)

    rep = sub.add_parser("report", help="write the HTML report of a config from the ledger")
    rep.add_argument("config")
    rep.add_argument("--output", help="HTML path (default: the config's report.path)")
    rep.set_defaults(func=cmd_report)

    srv = sub.add_parser("serve", help="run the schedules: checkpoint scan (cron) and protocol watch")
    srv.add_argument("config")
    srv.add_argument("--cron", help="checkpoint scan schedule (default: daily at 02:00)")
    srv.add_argument("--interval", type=float, help="scan every so many seconds instead of --cron")
    srv.add_argument("--watch-interval", type=float, default=60.0,
                     help="seconds between checks for changed protocol settings (default %(default)s)")
    srv.add_argument("--early", action="store_true",
                     help="judge each new checkpoint from a part of each dataset first (the config's early: section)")
    srv.set_defaults(func=cmd_serve)

    dep = sub.add_parser("deploy", help="deploy a config's benchmark to a Prefect server's work pool")
    dep.add_argument("config")
    dep.add_argument("--pool", required=True, help="work pool whose workers run it (e.g. a process pool)")
    dep.add_argument("--cron", help="schedule (default: daily at 02:00)")
    dep.add_argument("--timezone", help="IANA time zone of --cron (default: UTC)")
    dep.add_argument("--name", help="deployment name (default: the config file's name without suffix)")
    dep.set_defaults(func=cmd_deploy)
    add_cog_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command (the ``repeval`` entry point). What it prints passes through
    pipeline.terminal (control characters from data escaped), and a closed pipe
    (``repeval ls | head -1``) ends it quietly, as Unix tools end: exit 141, nothing on stderr.

    Parameters
    ----------
    argv : sequence of str or None
        The arguments (None: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code.
    """
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalStream(sys.stdout), TerminalStream(sys.stderr)
    try:
        try:
            return _dispatch(argv)
        finally:
            sys.stdout.flush()  # a reader that left shows here, not in the interpreter's last flush
            sys.stderr.flush()
    except BrokenPipeError:
        _silence_closed_pipes(streams)
        return EXIT_PIPE
    finally:
        sys.stdout, sys.stderr = streams


def _prefect_machinery_quiet(record: logging.LogRecord) -> bool:
    """Without -v, Prefect's own machinery (its clients, observers, the runner) stays off the
    terminal: a server that stops first (SIGTERM to serve's process group) makes its event
    observer log a websocket traceback. repeval's records and the runs' own logs pass."""
    name = record.name
    return not (name == "prefect" or name.startswith("prefect.")) or name.startswith(
        ("prefect.flow_runs", "prefect.task_runs"))


def _dispatch(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # records propagated from Prefect's run loggers too
        handler.setLevel(level)
        if not args.verbose:
            handler.addFilter(_prefect_machinery_quiet)
    try:
        return args.func(args)
    except BrokenPipeError:
        raise
    except RepevalError as exc:
        if args.verbose:
            logging.getLogger("repeval").exception("the error's traceback")
        error_lines(exc)  # a config's mistakes: one line each, all at once
        return EXIT_ERROR
    except KeyboardInterrupt:
        note("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001  no command ends in a raw traceback
        if args.verbose:
            logging.getLogger("repeval").exception("internal error")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        error_lines(f"{type(exc).__name__}: {cut(first, 500)} (run with -v for the traceback)", kind="internal error")
        return EXIT_INTERNAL


def _silence_closed_pipes(streams) -> None:
    """Point whichever of ``streams`` lost its reader at /dev/null, so that what is left in
    its buffer (and the interpreter's flush at exit) goes nowhere instead of failing again."""
    for stream in streams:
        try:
            stream.flush()
            continue
        except BrokenPipeError:
            pass
        except (OSError, ValueError):
            continue
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


if __name__ == "__main__":
    sys.exit(main())
