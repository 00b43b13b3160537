"""``ci-sizer openapi``: print (or write) the OpenAPI document, as openapi/openapi.json holds it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    openapi = sub.add_parser("openapi", help="print the OpenAPI document")
    openapi.add_argument("--output", type=Path, help="write to this file instead of stdout")
    openapi.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from service.main import create_app
    from service.settings import Settings

    doc = json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(doc)
    else:
        sys.stdout.write(doc)
    return 0
