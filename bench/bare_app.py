"""The baseline: a bare FastAPI app on the same framework stack (uvicorn, httptools, and the loop
``ci-sizer serve`` runs on the database measured: uvloop, or asyncio's own with ``--loop asyncio``), with routes of the same path shape as ci-sizer's, that do no work of their own.

``GET /api/v1/sizing/{org}/{repo}/{workflow}/{job}`` answers a constant JSON body (the bytes of
a real ci-sizer answer, passed in ``BARE_SIZING_BODY_FILE``); ``POST /api/v1/runs`` parses the
body into a pydantic model of the same shape as a run and answers 201.

    BARE_SIZING_BODY_FILE=answer.json python bench/bare_app.py --port 8090
"""

from __future__ import annotations

import sys
from pathlib import Path

# not bench/ on the path: bench/http.py would shadow the standard library's http
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import os

import uvicorn
from fastapi import FastAPI, Response
from pydantic import BaseModel

app = FastAPI()
BODY = Path(os.environ["BARE_SIZING_BODY_FILE"]).read_bytes() if os.environ.get("BARE_SIZING_BODY_FILE") else b"{}"


class Container(BaseModel):
    name: str
    cpu_samples_millicores: list[float]
    memory_peak_bytes: int


class Run(BaseModel):
    org: str
    repo: str
    workflow: str
    job: str
    run_id: str
    finished_at: str
    containers: list[Container]


@app.get("/api/v1/sizing/{org}/{repo}/{workflow}/{job}")
async def sizing(org: str, repo: str, workflow: str, job: str) -> Response:
    return Response(content=BODY, media_type="application/json")


@app.post("/api/v1/runs", status_code=201)
async def runs(body: Run) -> dict[str, str]:
    return {"run_id": body.run_id, "result": "created"}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers, as ci-sizer serve --workers")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="as ci-sizer serve's")
    args = parser.parse_args()
    uvicorn.run(
        "bench.bare_app:app" if args.workers > 1 else app,  # several workers import the app by name
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        log_level="warning",
        access_log=False,
        loop=args.loop,
        http="httptools",
    )
