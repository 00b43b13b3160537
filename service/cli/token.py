"""``ci-sizer token create``: print a new secret once, and the entry for the tokens file."""

from __future__ import annotations

import argparse

from service.cli.common import Parser


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = sub.add_parser("token", help="manage bearer tokens")
    # no handler on `token` itself: without a subcommand, main prints the help and exits 2
    token_sub = token.add_subparsers(dest="token_command", parser_class=Parser)
    create = token_sub.add_parser("create", help="print a new secret once, and the entry for the tokens file")
    create.add_argument("name")
    create.add_argument("--role", action="append", required=True, choices=["ingest", "read", "admin"])
    create.add_argument("--org", action="append", help="limit the token to this org (repeatable)")
    create.add_argument("--format", choices=["toml", "yaml"], default="toml")
    create.set_defaults(handler=create_token)


def create_token(args: argparse.Namespace) -> int:
    from service.auth import new_secret, token_line

    secret = new_secret()
    roles = list(dict.fromkeys(args.role))
    print(f"secret (shown once; give it to the client as 'Authorization: Bearer <secret>'):\n{secret}\n")
    print(f"add this to the tokens file ({args.format.upper()}):")
    print(token_line(args.name, secret, roles, args.org, toml=args.format == "toml"))
    return 0
