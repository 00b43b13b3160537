"""``ci-sizer webhook serve``: the app on uvicorn over TLS, its certificate reloaded when the files change
(a Secret that cert-manager renews, or a new ``ci-sizer webhook certs``), with no restart: the server's
SSL context loads the new pair, and each new connection gets it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from service.webhook import certs
from service.webhook.app import WebhookApp
from service.webhook.identity import Rule
from service.webhook.review import Reviewer
from service.webhook.sizer import Sizer

log = logging.getLogger("ci_sizer.webhook")
RELOAD_SECONDS = 30.0


@dataclass(frozen=True)
class Options:
    sizer_url: str
    token: str | None
    deadline: float
    host: str
    port: int
    cert_file: Path
    key_file: Path
    own_namespace: str | None
    rules: tuple[Rule, ...]
    sizer_ca_file: Path | None = None
    log_level: str = "info"
    #: how often the certificate files are looked at (a renewed Secret reaches the pod within a minute or two)
    reload_seconds: float = RELOAD_SECONDS


def reviewer(options: Options) -> Reviewer:
    context = None
    if options.sizer_ca_file is not None:
        context = ssl.create_default_context(cafile=str(options.sizer_ca_file))
    sizer = Sizer(options.sizer_url, options.token, context)
    return Reviewer(sizer, options.deadline, options.own_namespace, options.rules)


def serve(options: Options) -> None:
    import uvicorn

    config = uvicorn.Config(
        WebhookApp(reviewer(options)),
        host=options.host,
        port=options.port,
        ssl_certfile=str(options.cert_file),
        ssl_keyfile=str(options.key_file),
        log_level=options.log_level,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        watcher = asyncio.create_task(
            _reload_on_change(config, options.cert_file, options.key_file, options.reload_seconds)
        )
        try:
            await server.serve()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    log.info(
        "ci-sizer webhook on https://%s:%d/mutate, asking %s within %gs",
        options.host,
        options.port,
        options.sizer_url,
        options.deadline,
    )
    _warn_if_ending(options.cert_file)
    asyncio.run(main())


def _stamp(*files: Path) -> tuple[float, ...]:
    try:
        return tuple(os.stat(f).st_mtime for f in files)
    except OSError:
        return ()


async def _reload_on_change(config: object, cert_file: Path, key_file: Path, every: float) -> None:
    seen = _stamp(cert_file, key_file)
    while True:
        await asyncio.sleep(every)
        now = _stamp(cert_file, key_file)
        context = getattr(config, "ssl", None)
        if not now or now == seen or context is None:
            continue
        try:
            context.load_cert_chain(str(cert_file), str(key_file))
        except (OSError, ssl.SSLError) as exc:  # half-written (the two files change one after the other)
            log.warning("the new certificate could not be loaded yet: %s", exc)
            continue
        seen = now
        log.info("certificate reloaded from %s", cert_file)
        _warn_if_ending(cert_file)


def _warn_if_ending(cert_file: Path) -> None:
    end = certs.not_after(cert_file)
    if end is not None and end - datetime.datetime.now(datetime.UTC) < datetime.timedelta(days=certs.WARN_DAYS):
        log.warning("the webhook's certificate ends on %s: run `ci-sizer webhook certs` again", end.date())
