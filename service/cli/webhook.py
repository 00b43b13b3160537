"""``ci-sizer webhook``: ``serve`` the mutating admission webhook over TLS, or make its ``certs``
(docs/integrations/webhook.md). Each flag also reads a ``CI_SIZER_WEBHOOK_*`` variable."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from service.cli.common import CliError, configure_logging

SECRET_PREFIX = "cis_"  # service/auth.py's, not imported here (the CLI imports only the stdlib at import)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    webhook = sub.add_parser("webhook", help="the mutating admission webhook: serve it, or make its certificates")
    commands = webhook.add_subparsers(dest="webhook_command", parser_class=type(webhook))
    env = os.environ.get

    serve = commands.add_parser("serve", help="serve AdmissionReviews over TLS, asking the sizer for each pod")
    serve.add_argument("--sizer-url", default=env("CI_SIZER_WEBHOOK_SIZER_URL"), help="the sizer, http(s)://host:port")
    serve.add_argument(
        "--token-file",
        type=Path,
        default=env("CI_SIZER_WEBHOOK_TOKEN_FILE"),
        help="a file holding a token with the read role (ci-sizer token create NAME --role read)",
    )
    serve.add_argument(
        "--deadline-ms",
        type=int,
        default=int(env("CI_SIZER_WEBHOOK_DEADLINE_MS") or 1000),
        help="answer 'allowed, no patch' when the sizer has not answered within this (default 1000)",
    )
    serve.add_argument("--host", default=env("CI_SIZER_WEBHOOK_HOST") or "127.0.0.1", help="bind address")
    serve.add_argument("--port", type=int, default=int(env("CI_SIZER_WEBHOOK_PORT") or 8443), help="port (8443)")
    serve.add_argument("--tls-cert-file", type=Path, default=env("CI_SIZER_WEBHOOK_TLS_CERT_FILE"), help="PEM")
    serve.add_argument("--tls-key-file", type=Path, default=env("CI_SIZER_WEBHOOK_TLS_KEY_FILE"), help="PEM")
    serve.add_argument(
        "--sizer-ca-file", type=Path, default=env("CI_SIZER_WEBHOOK_SIZER_CA_FILE"), help="CA of an https sizer"
    )
    serve.add_argument(
        "--identity-file",
        type=Path,
        default=env("CI_SIZER_WEBHOOK_IDENTITY_FILE"),
        help="rules of your own that tell a pod's job (TOML/YAML, docs/integrations/webhook.md)",
    )
    serve.add_argument(
        "--namespace",
        default=env("CI_SIZER_WEBHOOK_NAMESPACE") or env("POD_NAMESPACE"),
        help="the webhook's own namespace, whose pods it never changes (default POD_NAMESPACE)",
    )
    serve.add_argument(
        "--cert-reload-seconds",
        type=float,
        default=float(env("CI_SIZER_WEBHOOK_CERT_RELOAD_SECONDS") or 30),
        help="how often a renewed certificate is looked for (default 30)",
    )
    serve.add_argument("--log-level", default=env("CI_SIZER_WEBHOOK_LOG_LEVEL") or "info")
    serve.set_defaults(handler=run_serve)

    made = commands.add_parser("certs", help="make a self-signed CA and the webhook's serving certificate")
    made.add_argument("--service", default="ci-sizer-webhook", help="the webhook's Service (ci-sizer-webhook)")
    made.add_argument("--namespace", default="ci-sizer", help="its namespace (ci-sizer)")
    made.add_argument(
        "--output-dir",
        type=Path,
        default=Path("."),
        help="where tls.crt, tls.key, ca.crt and ca-bundle.yaml go (deploy/kubernetes/webhook/self-signed)",
    )
    made.add_argument("--days", type=int, default=5 * 365, help="how long the certificates last (5 years)")
    made.set_defaults(handler=run_certs)


def run_serve(args: argparse.Namespace) -> int:
    from service.webhook.identity import IdentityFileError, load_rules
    from service.webhook.server import Options, serve

    if not args.sizer_url or not args.sizer_url.startswith(("http://", "https://")):
        raise CliError("--sizer-url (CI_SIZER_WEBHOOK_SIZER_URL): give the sizer's http:// or https:// URL")
    for flag, path in (("--tls-cert-file", args.tls_cert_file), ("--tls-key-file", args.tls_key_file)):
        if path is None or not Path(path).is_file():
            raise CliError(f"{flag}: no such file {path} (make them with `ci-sizer webhook certs`)")
    if not args.cert_reload_seconds > 0:
        raise CliError("--cert-reload-seconds: more than 0")
    if not 1 <= args.deadline_ms <= 29_000:
        raise CliError("--deadline-ms: 1 to 29000 (under the API server's 30 s ceiling on timeoutSeconds)")
    token = None
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"--token-file: cannot read {args.token_file}: {exc.strerror}") from None
        if not token.startswith(SECRET_PREFIX):
            raise CliError(
                f"--token-file: {args.token_file} holds no ci-sizer token ({SECRET_PREFIX}...): "
                "make one with `ci-sizer token create ci-sizer-webhook --role read`"
            )
    try:
        rules = load_rules(args.identity_file)
    except IdentityFileError as exc:
        raise CliError(str(exc)) from None
    configure_logging(args.log_level)
    serve(
        Options(
            sizer_url=args.sizer_url,
            token=token,
            deadline=args.deadline_ms / 1000,
            host=args.host,
            port=args.port,
            cert_file=Path(args.tls_cert_file),
            key_file=Path(args.tls_key_file),
            own_namespace=args.namespace or None,
            rules=rules,
            sizer_ca_file=args.sizer_ca_file,
            log_level=args.log_level,
            reload_seconds=args.cert_reload_seconds,
        )
    )
    return 0


def run_certs(args: argparse.Namespace) -> int:
    from service.webhook import certs

    if args.days < 1:
        raise CliError("--days: at least 1")
    try:
        made = certs.make(args.service, args.namespace, days=args.days)
    except certs.CertsUnavailable as exc:
        raise CliError(str(exc)) from None
    try:
        written = certs.write(made, args.output_dir)
    except OSError as exc:
        raise CliError(f"--output-dir: cannot write to {args.output_dir}: {exc.strerror}") from None
    for path in written:
        print(f"wrote {path}")
    print(f"the certificate names {', '.join(certs.dns_names(args.service, args.namespace))}")
    return 0
