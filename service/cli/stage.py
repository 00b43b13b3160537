"""``ci-sizer stage``: a pipeline stage's pod totals from its steps, as POST /api/v1/stages:compute answers."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from service.cli.common import CliError, first_line, read_database, validated

#: The flags that switch an option of the stage file on.
STAGE_FLAGS = (
    "increase_default_resources",
    "conservative_addon_limits",
    "use_recommendations",
    "disable_resource_optimization",
    "extra_addon_resource",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stage = sub.add_parser(
        "stage",
        help="a pipeline stage's pod totals from its steps (as POST /api/v1/stages:compute)",
        description="FILE is YAML or JSON: the body of POST /api/v1/stages:compute ({stage: [...], "
        "options: {...}}) or just the list of items. The flags switch options on.",
    )
    stage.add_argument("file", type=Path, help="the stage file ('-' reads stdin)")
    stage.add_argument("--increase-default-resources", action="store_true", help="default steps 1000m/3000Mi (H1)")
    stage.add_argument(
        "--conservative-addon-limits", action="store_true", help="a flat 100m/100Mi stage container (H3)"
    )
    stage.add_argument(
        "--use-recommendations",
        action="store_true",
        help="steps with a job reference take the sizer's recommended limits, read from --database-url",
    )
    stage.add_argument(
        "--generation",
        choices=("doc", "harness"),
        help="doc: the rules as documented (H1-H7); harness: as Harness CI's source does it (H8-H14)",
    )
    stage.add_argument(
        "--disable-resource-optimization",
        action="store_true",
        help="CI_DISABLE_RESOURCE_OPTIMIZATION: every step's limit is its own (H12)",
    )
    stage.add_argument(
        "--extra-addon-resource", action="store_true", help="CI_EXTRA_ADDON_RESOURCE: a 300m/400Mi setup-addon (H13)"
    )
    stage.add_argument("--database-url", help="SQLAlchemy URL (default: sqlite file ./ci-sizer.db)")
    stage.add_argument("--json", action="store_true", help="print the API's JSON answer instead of a table")
    stage.set_defaults(handler=run)


def _stage_body(args: argparse.Namespace) -> Any:
    """The validated stage file, with the flags' options switched on."""
    import yaml

    from service.stages.schemas import StageCompute

    name = str(args.file)
    try:
        text = sys.stdin.read() if name == "-" else args.file.read_text()
        raw = yaml.safe_load(text)
    except OSError as exc:
        raise CliError(f"{name}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"{name}: not YAML or JSON: {first_line(exc)}") from None
    if isinstance(raw, list):
        raw = {"stage": raw}
    if not isinstance(raw, dict):
        raise CliError(f"{name}: expected a mapping with a 'stage' list, or a list of items")
    options = raw.get("options", {})
    if isinstance(options, dict):
        flags: dict[str, Any] = {f: True for f in STAGE_FLAGS if getattr(args, f)}
        if args.generation is not None:
            flags["generation"] = args.generation
        raw = {**raw, "options": {**options, **flags}}
    return validated(StageCompute, raw, f"{name}: invalid stage", pointer=True)


def run(args: argparse.Namespace) -> int:
    from service.errors import ServiceError
    from service.sizing import service as sizing_service
    from service.stages import service as stages
    from service.stages.flatten import flatten
    from service.stages.render import render

    body = _stage_body(args)
    try:
        items = flatten(body.stage)
        keys = stages.wanted_jobs(body, items)
        answers = (
            read_database(args, lambda conn, _, policy: sizing_service.fetch_many(conn=conn, keys=keys, policy=policy))
            if keys
            else {}
        )
        answer = stages.compose(body, items, answers)
    except ServiceError as exc:
        lines = [f"{e['field'].removeprefix('body')}: {e['message']}" for e in exc.errors or []]
        raise CliError("\n  ".join([f"{args.file}: {exc.detail}", *lines])) from None
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(render(answer))
    return 0
