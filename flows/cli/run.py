"""``repeval`` commands that run or report a config: run, report, serve, deploy."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys

from flows.cli.printing import note, print_json, print_line, say
from flows.runtime import prefect_api, prepare_environment
from jobs.config import load_config
from jobs.report.inputs import correlate_and_report
from jobs.report.results import config_cells
from jobs.run.spine import Run, all_skipped_lines
from pipeline.terminal import printable
from storage_schema.ledger import failure_id

EXIT_CELLS_FAILED = 3  # `repeval run`: some cells, extractions, checkpoints or the correlation failed
EXIT_SERVER_LOST = 1  # `repeval serve`: its Prefect server went away under it


def cmd_run(args: argparse.Namespace) -> int:
    """Plan (one check of the config, before Prefect or Dask start), run, summarise; end with
    the correlation figures and the report's path."""
    # Exits 3 when something failed (listed in the summary and recorded for
    # ``repeval results --failed``), a checkpoint of a ``checkpoints:`` folder was still
    # being written after waiting up to its ``settle_seconds`` (named), or every file of the
    # folders was skipped as failed before and unchanged (said prominently), unless
    # ``--allow-failures``. A rerun with nothing to do is answered from the store and the
    # ledger (``jobs.run.ledger_answer``) without Prefect, Dask or torch.
    prepare_environment(args.verbose)
    # SIGTERM (a scheduler's timeout, docker stop, kill) stops like Ctrl-C: the embedded Dask
    # workers and Prefect server are shut down with the run instead of outliving it
    signal.signal(signal.SIGTERM, _interrupt)
    run = Run(args.config, retry_failed=args.retry_failed, say=lambda line: say("run", line))
    run.settle()  # a file written just before this run is evaluated by it, once settled
    summary = run.go(functools.partial(_execute_here, config_path=run.path), dask_address=args.dask_address,
                     early=True if getattr(args, "early", False) else None)
    if args.json:
        print_json({k: v for k, v in summary.details.items() if k not in ("extractions", "outcomes")}, default=str)
    elif summary.nothing_to_do:
        print_line(summary.said)
    if not args.json:
        for line in summary.figures:  # what the run found, as the demo prints it
            print_line(line)
        if summary.ran:
            print_line(f"report: {summary.report}")
    if summary.waiting:
        note(f"{len(summary.waiting)} checkpoint(s) still being written after their settle_seconds were not "
             f"evaluated: {printable(', '.join(summary.waiting))}")
    if summary.all_skipped and summary.ran:
        for line in all_skipped_lines(summary.all_skipped):  # again at the end, where the exit code is said
            note(line)
    problems = summary.problems()
    if problems and not args.allow_failures:
        note(f"{problems if summary.ran else 'nothing evaluated'}; exit code {EXIT_CELLS_FAILED} "
             "(--allow-failures exits 0)")
        return EXIT_CELLS_FAILED
    return 0


def _execute_here(plan, *, config_path: str, **kwargs):
    # deferred: Prefect and Dask, once the plan is checked (a rerun answered by the ledger never loads them)
    from flows.benchmark import run_here

    return run_here(plan, config_path=config_path, **kwargs)


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
    """``repeval serve``: the checkpoint scan and the protocol watch, served until stopped."""
    # SIGTERM or SIGINT (to serve or its process group) stops it in seconds with one line;
    # exit 143 or 130, as a process ended by that signal. What a killed serve left behind is
    # reclaimed when the next one starts (``flows.reclaim``).
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
    Run(config_path).check()


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
