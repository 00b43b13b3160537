"""What the admission webhook adds to a pod's creation: a review of a GitLab build pod, over TLS on a
kept-alive connection as the API server sends it, against the recipe's own call, the sizer's
``GET /api/v1/sizing/...`` (JSON) for the same job, side by side in alternating rounds so that noise on
this shared machine falls on both alike. A live ``ci-sizer serve`` (SQLite, one worker) has learned the
job; the webhook is a real ``ci-sizer webhook serve`` with a certificate from ``ci-sizer webhook certs``.

Printed: p50 and p99 of each, the ratio of the medians and the milliseconds the webhook adds (its TLS
hop, its review, its own connection to the sizer). No target: a pod's creation is not a hot path, and
the webhook's deadline (1 s) bounds it whatever the sizer does.

    python bench/webhook.py [--requests 300] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the repository root (bench/http.py shadows http)

import argparse
import statistics
import tempfile
import time
from urllib.parse import quote

import httpx

from service.auth import hash_secret as _hash
from tests.helpers import container, run
from tests.live import LiveServer
from tests.webhook import pods
from tests.webhook.conftest import INGEST_TOKEN, READ_TOKEN, make_certs, start_webhook, stop, wait_until_serving

JOB = {"org": "acme", "repo": "web", "workflow": ".gitlab-ci.yml", "job": "build"}


def timed(call: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "tokens.toml").write_text(
            f'[[tokens]]\nname = "w"\nsha256 = "{_hash(READ_TOKEN)}"\nroles = ["read"]\n\n'
            f'[[tokens]]\nname = "r"\nsha256 = "{_hash(INGEST_TOKEN)}"\nroles = ["ingest"]\n'
        )
        (d / "token").write_text(READ_TOKEN)
        sizer = LiveServer(f"sqlite:///{d / 'sizer.db'}", "--tokens-file", str(d / "tokens.toml"), log=d / "sizer.log")
        sizer.start()
        hook = None
        try:
            with httpx.Client(base_url=sizer.url, headers={"Authorization": f"Bearer {INGEST_TOKEN}"}) as c:
                for n in range(1, 6):
                    assert (
                        c.post("/api/v1/runs", json=run(n, container("build", cpu=800.0), job=JOB)).status_code == 201
                    )
            hook = wait_until_serving(
                start_webhook(sizer.url, make_certs(d / "certs"), d / "hook.log", token_file=d / "token")
            )
            path = "/api/v1/sizing/" + "/".join(quote(JOB[f], safe="") for f in ("org", "repo", "workflow", "job"))
            pod = pods.gitlab()
            gets: list[float] = []
            reviews: list[float] = []
            with (
                httpx.Client(base_url=sizer.url, headers={"Authorization": f"Bearer {READ_TOKEN}"}) as direct,
                hook.client() as tls,
            ):

                def get() -> None:
                    assert direct.get(path).status_code == 200

                def review() -> None:
                    r = hook.post(tls, pods.review(pod, "ci"))
                    assert r.json()["response"]["auditAnnotations"] == {"result": "patched"}

                get(), review()  # connections open, caches warm
                for _ in range(args.rounds):
                    gets += timed(get, args.requests)
                    reviews += timed(review, args.requests)
        finally:
            if hook is not None:
                stop(hook)
            sizer.stop()

    def q(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1]

    print(f"{len(gets)} calls each, {args.rounds} alternating rounds")
    print(f"recipe's GET sizing     p50 {statistics.median(gets):6.2f} ms   p99 {q(gets, 99):6.2f} ms")
    print(f"webhook review (TLS)    p50 {statistics.median(reviews):6.2f} ms   p99 {q(reviews, 99):6.2f} ms")
    print(
        f"review / GET (medians)  {statistics.median(reviews) / statistics.median(gets):.2f}x, "
        f"+{statistics.median(reviews) - statistics.median(gets):.2f} ms at the median"
    )


if __name__ == "__main__":
    main()
