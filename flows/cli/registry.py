"""``repeval protocols`` and ``repeval datasets``: what the registries hold, with defaults."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from flows.cli.printing import print_json
from pipeline.protocols import describe
from pipeline.protocols.registry import get_protocol, list_protocols


def add_registry_commands(sub: Any, show_dataset_command: Callable[[argparse.Namespace], int]) -> None:
    """Add ``protocols`` and ``datasets`` (``list`` and ``show``) to the CLI's subcommands."""
    pro = sub.add_parser("protocols", help="the registered protocols and their settings, with defaults")
    pro.add_argument("name", nargs="?", help="one protocol: its settings with defaults and valid values")
    pro.add_argument("--json", action="store_true", help="print JSON")
    pro.set_defaults(func=cmd_protocols)

    dsp = sub.add_parser("datasets", help="the dataset adapters and their parameters; inspect a copy")
    dsp.add_argument("--json", action="store_true", help="print the adapters as JSON")
    dsp.set_defaults(func=cmd_datasets_list)
    dsub = dsp.add_subparsers(dest="datasets_command")
    lst = dsub.add_parser("list", help="every adapter: metric, splits, parameters with defaults (the default)")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(func=cmd_datasets_list)
    show = dsub.add_parser(
        "show", help="splits, image counts, classes, metric, validation, skipped and undecodable files, "
                     "warnings and fingerprint")
    show.add_argument("adapter", help="dataset adapter, e.g. aircraft, imagenet, webdataset, hf")
    show.add_argument("--param", action="extend", nargs="+", default=[], help="adapter parameters as key=value")
    show.add_argument("--name", help="dataset name (default: the adapter's)")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.add_argument("--no-decode", action="store_true", help="do not decode every image (a quick look)")
    show.set_defaults(func=show_dataset_command)


def cmd_protocols(args: argparse.Namespace) -> int:
    """Every protocol with its settings' defaults, or one with their valid values too."""
    if args.name is not None:
        get_protocol(args.name)  # an unknown name: one line naming every protocol
    if args.json:
        records = [describe.protocol_record(n) for n in list_protocols()]
        print_json(next(r for r in records if r["name"] == args.name) if args.name else records, indent=1)
    elif args.name:
        print(describe.protocol_summary(args.name))
    else:
        print(describe.protocol_listing())
    return 0


def cmd_datasets_list(args: argparse.Namespace) -> int:
    """Every dataset adapter with its metric, splits and parameters."""
    # deferred: the dataset adapters and PIL load for the dataset commands only
    from pipeline.datasets import list_datasets
    from pipeline.datasets.catalog import adapter_listing, adapter_record

    if args.json:
        print_json([adapter_record(a) for a in list_datasets()], indent=1)
    else:
        print(adapter_listing())
    return 0
