"""The ``ci-sizer`` command: serve, migrate, token create, collect, stage, simulate, backtest, openapi, webhook.

One module per command; each ``register(sub)`` adds its subparser and sets its handler, which returns
the exit code. Command modules import only the standard library and this package at import time
(``collect`` runs in build images with nothing else); the rest is imported inside the handlers."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable

from service import __version__
from service.cli import backtest, collect, migrate, openapi, serve, simulate, stage, token, webhook
from service.cli.common import CliError, Parser

__all__ = ["build_parser", "main"]

#: In the order ``ci-sizer --help`` lists them.
COMMANDS = (serve, migrate, token, collect, stage, simulate, backtest, openapi, webhook)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ci-sizer",
        description="Right-sizes Kubernetes requests and limits for CI jobs.",
    )
    parser.add_argument("--version", action="version", version=f"ci-sizer {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
        if handler is None:  # no command, or `token` without `create`
            parser.print_help()
            return 2
        return handler(args)
    except CliError as exc:
        for log_handler in logging.getLogger().handlers:  # lines logged before the error come first
            with contextlib.suppress(Exception):  # a handler whose stream is gone (a test's capture)
                log_handler.flush()
        print(f"ci-sizer: error: {exc}", file=sys.stderr)
        return exc.code
