"""The ``repeval`` command line: ``main`` parses and dispatches; one module per command group."""

from flows.cli.main import main

__all__ = ["main"]
