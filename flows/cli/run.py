"""``repeval`` commands that run or report a config: run, report, serve, deploy."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from flows.cli.printing import note, print_json, print_line, say
from flows.runtime import prefect_api, prepare_environment
from jobs.analysis.correlate import figure_lines
from jobs.config import load_config
from jobs.config.checkpoint_files import alias_line
from jobs.config.checkpoint_folders import wait_for_settled
from jobs.encoder_identity import name_clash_lines
from jobs.plan import make_plan
from jobs.report.inputs import correlate_and_report
from jobs.rerun import ledger_answer, record_run
from jobs.results import config_cells
from pipeline.errors import ArrayNotFoundError, RepevalError, StoreError
from pipeline.terminal import printable
from storage_schema.ledger import failure_id

EXIT_CELLS_FAILED = 3  # `repeval run`: some cells, extractions, checkpoints or the correlation failed
EXIT_SERVER_LOST = 1  # `repeval serve`: its Prefect server went away under it


def cmd_run(args: argparse.Namespace) -> int:
    """Plan (one check of the config, before Prefect or Dask start), run, summarise; end with
    the correlation figures and the report's path.

    Exits 3 when something failed (listed in the summary and recorded for
    ``repeval results --failed``), a checkpoint of a ``checkpoints:`` folder was still
    being written after waiting up to its ``settle_seconds`` (named), or every file of the
    folders was skipped as failed before and unchanged (said prominently), unless
    ``--allow-failures``. A rerun with nothing to do is answered from the store and the
    ledger (``jobs.rerun``) without Prefect, Dask or torch.
    """
    prepare_environment(args.verbose)
    # SIGTERM (a scheduler's timeout, docker stop, kill) stops like Ctrl-C: the embedded Dask
    # workers and Prefect server are shut down with the run instead of outliving it
    signal.signal(signal.SIGTERM, _interrupt)
    cfg = load_config(args.config)
    if cfg.checkpoints:  # a file written just before this run is evaluated by it, once settled
        wait_for_settled(cfg, say=lambda line: say("run", line))
    answer = None if args.retry_failed else ledger_answer(cfg)
    if answer is not None:
        if args.json:
            print_json(answer.summary(), default=str)
        else:
            print_line(answer.line())
            for line in answer.figures:
                print_line(line)
        return 0
    plan = make_plan(cfg, retry_failed=args.retry_failed)
    for rec in plan.checkpoint_failures:
        say("run", f"checkpoint refused: {rec['file']}: {rec['reason']}")
    for alias in plan.scan.aliases:  # DINO's checkpoint.pth beside checkpoint0005.pth: one encoder
        say("run", alias_line(alias))
    for line in name_clash_lines(_existing_store(cfg), plan.cells):  # two configs, one name, other weights
        say("run", line)
    if plan.scan.all_skipped:  # the folders give this run nothing: never a quiet exit 0
        _say_all_skipped(plan.scan.skipped)
        if not plan.cells and not plan.units:  # nothing else to run: said at once, without the flow
            if args.json:
                print_json({"all_skipped": True, "skipped_checkpoints": plan.scan.skipped}, default=str)
            if args.allow_failures:
                return 0
            note(f"nothing evaluated; exit code {EXIT_CELLS_FAILED} (--allow-failures exits 0)")
            return EXIT_CELLS_FAILED
    from flows.benchmark import run_benchmark  # deferred: Prefect and Dask, once the config is known good

    # deferred: the dataset adapters and PIL, once a plan has built the datasets
    from pipeline.datasets.inspection import note_line

    for data_note in plan.data_notes:  # an empty class is never learned from, or never scored
        say("run", f"data warning: {note_line(data_note)}")
    summary = run_benchmark(cfg, dask_address=args.dask_address, plan=plan, config_path=os.path.abspath(args.config),
                            early=True if getattr(args, "early", False) else None)
    _note_clean_run(cfg, summary, record_run)
    if args.json:
        print_json({k: v for k, v in summary.items() if k not in ("extractions", "outcomes")}, default=str)
    else:
        for line in figure_lines(summary.get("correlation")):  # what the run found, as the demo prints it
            print_line(line)
        print_line(f"report: {summary['report']}")
    left = list(plan.scan.waiting)
    if left:
        note(f"{len(left)} checkpoint(s) still being written after their settle_seconds were not "
             f"evaluated: {printable(', '.join(left))}")
    skipped = len(plan.scan.skipped) if plan.scan.all_skipped else 0
    if skipped:
        _say_all_skipped(plan.scan.skipped)  # again at the end, where the exit code is said
    if (summary["failures"] or left or skipped) and not args.allow_failures:
        what = f"{len(summary['failures'])} failure(s)" + (f", {len(left)} checkpoint(s) left out" if left else "") + (
            f", every checkpoint file ({skipped}) skipped as failed before" if skipped else "")
        note(f"{what}; exit code {EXIT_CELLS_FAILED} (--allow-failures exits 0)")
        return EXIT_CELLS_FAILED
    return 0


def _say_all_skipped(skipped: list[dict]) -> None:
    """Every folder file was skipped as failed before, unchanged, under unchanged settings."""
    note(f"NOTHING EVALUATED FROM THE CHECKPOINT FOLDERS: every file ({len(skipped)}) failed before and neither "
         "the file nor the settings that read it (arch, checkpoint_key, strip_prefixes, input_size, layers, "
         "extract) changed since:")
    for rec in skipped[:10]:
        note(f"  {printable(str(rec.get('file')))}: {printable(str(rec.get('reason')))}")
    if len(skipped) > 10:
        note(f"  ... ({len(skipped)} in all: repeval results --failed)")
    note("fix the config or the files (a changed setting or file is taken again), or try them again as they "
         "are: repeval run --retry-failed")


def _note_clean_run(cfg, summary: dict, record_run) -> None:
    """Note a run without failures for the next rerun; a store that refuses the note only
    costs that rerun its full check."""
    import logging

    try:
        record_run(cfg, summary)
    except (RepevalError, OSError) as exc:
        logging.getLogger("repeval").warning("the run's note for a rerun was not written: %s", exc)


def _existing_store(cfg):
    """The config's store, read-only, or None when there is none yet."""
    try:
        return cfg.open_store(read_only=True)
    except (StoreError, ArrayNotFoundError):
        return None


def cmd_report(args: argparse.Namespace) -> int:
    """``repeval report``: the HTML report of a config, from the ledger (no run)."""
    cfg = load_config(args.config)
    store = cfg.open_store(read_only=True)
    cells, missing, plan = config_cells(store, cfg)
    # re-rendering a report leaves the run summary alone: the next run compares with the last run
    out = correlate_and_report(store, plan.config, cells, path=args.output, plan=plan, write_summary=False)
    failed_ids = {f["id"] for f in out["failures"] if f.get("kind") == "cell"}
    failed = sum(failure_id(c.model, c.dataset, c.layer, c.setting) in failed_ids for c in missing)
    print_line(f"report: {out['report']} ({out['records']} cells; {failed} failed; "
               f"{len(missing) - failed} not evaluated yet; {len(out['failures'])} failure(s) on record)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """``repeval serve``: the checkpoint scan and the protocol watch, served until stopped.

    SIGTERM or SIGINT (to serve or its process group) stops it in seconds with one line;
    exit 143 or 130, as a process ended by that signal. What a killed serve left behind is
    reclaimed when the next one starts (``flows.reclaim``)."""
    prepare_environment(args.verbose)
    # deferred: Prefect loads for `repeval serve` only
    from flows.schedules import DEFAULT_CRON
    from flows.serving import ServerLost, end_children, serve_schedules

    path = os.path.abspath(args.config)
    load_config(path)  # a config mistake: one line, before any work (no torch, no server)
    # the full check (architectures, checkpoints) refuses a broken config before serving it
    # forever; it imports torch and timm, in a child, while the local server starts
    pool, check = _check_in_child(path)
    cron = args.cron or DEFAULT_CRON
    # SIGTERM (systemd, docker stop, kill) while starting stops like Ctrl-C, so the local
    # server is shut down; once serving, flows.serving handles both signals.
    signal.signal(signal.SIGTERM, _interrupt)
    stopped_by = signal.SIGINT
    try:
        with prefect_api(scheduler=True) as api:
            check.result()
            pool.shutdown()
            what = f"every {args.interval:g} s" if args.interval else f"cron {cron!r}"
            print(f"repeval serve: {path}\n"
                  f"  checkpoint scan: {what}{' (early pass first)' if getattr(args, 'early', False) else ''}; "
                  f"protocol watch: every {args.watch_interval:g} s\n"
                  f"  run history: {api.removesuffix('/api')} (Prefect UI), or "
                  f"PREFECT_API_URL={api} prefect flow-run ls\n"
                  "  stop: Ctrl-C or SIGTERM", file=sys.stderr, flush=True)
            stopped_by = serve_schedules(path, cron=cron, interval=args.interval, watch_interval=args.watch_interval,
                                         say=lambda line: say("serve", line),
                                         early=True if getattr(args, "early", False) else None)
    except KeyboardInterrupt:  # stopped while starting
        stopped_by = _received[0] if _received else signal.SIGINT
    except ServerLost as exc:  # nothing is served without it: said in one line, never a page of tracebacks
        end_children()
        print(f"repeval serve: stopped: its Prefect server stopped answering ({printable(str(exc))[:200]}; "
              f"its log: {os.environ['PREFECT_HOME']}/server.log); start serve again", file=sys.stderr, flush=True)
        return EXIT_SERVER_LOST
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # stopped while checking: end_children ends it
    if stopped_by:  # what the runner could not stop (its server gone) ends before the last line
        end_children()
    how = f"stopped by {signal.Signals(stopped_by).name}" if stopped_by else "stopped"
    print(f"repeval serve: {how}; the store and Prefect's run history are kept (list past runs: "
          f"PREFECT_HOME={os.environ['PREFECT_HOME']} prefect flow-run ls)", file=sys.stderr, flush=True)
    return 128 + stopped_by if stopped_by else 0  # as a process ended by that signal


_received: list[int] = []


def _interrupt(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one clean stop
    _received.append(signum)
    raise KeyboardInterrupt


def _check_in_child(config_path: str):
    """The config's full check (architectures, checkpoints: torch and timm) started in a
    process of its own, so the long-lived serving process never holds those libraries; the
    pool and the check's future (its result raises the config's mistake)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    return pool, pool.submit(check_config_file, config_path)


def check_config_file(config_path: str) -> None:
    """The full check of a config file (the plan's, with torch and timm); raises on a mistake."""
    make_plan(load_config(config_path), record=False)


def cmd_deploy(args: argparse.Namespace) -> int:
    # No prepare_environment(): the deployment goes to the user's Prefect server, taken
    # from their own Prefect profile or PREFECT_API_URL, never to an embedded one.
    """``repeval deploy``: the benchmark as a deployment on the user's Prefect server, with how to run it."""
    # deferred: Prefect loads for `repeval deploy` only
    from flows.deploy import deploy_config
    from flows.schedules import DEFAULT_CRON

    cron = args.cron or DEFAULT_CRON
    d = deploy_config(args.config, args.pool, name=args.name, cron=cron, timezone=args.timezone)
    print(f"deployed {d.name} ({d.id}) on {d.api_url}: cron {cron!r} "
          f"({args.timezone or 'UTC'}), reruns on protocol changes of {d.config_path}")
    print(f"runs go to work pool {args.pool!r}; start a worker: prefect worker start --pool {args.pool}")
    print(f"run now: prefect deployment run '{d.name}'")
    print(f"after editing protocol settings: {d.emit_command()}")
    return 0
