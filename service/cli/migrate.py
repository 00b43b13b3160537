"""``ci-sizer migrate``: apply database migrations."""

from __future__ import annotations

import argparse

from service.cli.common import add_settings_flags, configure_logging, migrate_database, settings_from


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    migrate = sub.add_parser("migrate", help="apply database migrations")
    add_settings_flags(migrate, serve=False)
    migrate.add_argument("--revision", default="head", help="target revision (default head)")
    migrate.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    configure_logging(settings.log_level)
    from service.db import redacted

    migrate_database(settings.database_url, args.revision, redacted(settings.database_url))
    return 0
