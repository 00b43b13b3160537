"""Load generation with wrk (Debian's ``wrk`` package): random paths from a list, figures back as JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SCRIPT = r"""
local paths = {}
local body = nil
local counter = 0
local prefix, suffix = nil, nil

function init(args)
  for line in io.lines(args[1]) do paths[#paths + 1] = line end
  if args[2] ~= nil and args[2] ~= "" then
    local f = io.open(args[2], "rb"); body = f:read("*a"); f:close()
    local at = string.find(body, "@RUN@", 1, true)
    prefix = string.sub(body, 1, at - 1); suffix = string.sub(body, at + 5)
  end
  math.randomseed(tonumber(args[3]) or 1)
  wrk.thread_tag = tostring(math.random(1, 1000000000))
end

function request()
  local path = paths[math.random(#paths)]
  if body == nil then
    return wrk.format("GET", path)
  end
  counter = counter + 1
  return wrk.format("POST", path, {["Content-Type"] = "application/json"},
    prefix .. wrk.thread_tag .. "-" .. counter .. suffix)
end
"""

#: appended to every script: the figures back on one line
DONE = r"""
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\"requests\": %d, \"duration_us\": %d, \"p50_us\": %d, \"p99_us\": %d, \"max_us\": %d, \"errors\": %d, \"non_2xx\": %d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


def run(
    url: str, paths: list[str], *, seconds: float, connections: int, body: bytes | None = None, seed: int = 1
) -> dict[str, Any]:
    """``wrk`` against ``url`` for ``seconds``; ``body`` (with ``@RUN@`` where a unique run id
    goes) makes the requests POSTs. Returns requests/s, p50/p99 in ms, errors."""
    with tempfile.TemporaryDirectory() as tmp:
        path_file = Path(tmp, "paths.txt")
        path_file.write_text("\n".join(paths) + "\n")
        body_file = ""
        if body is not None:
            Path(tmp, "body.json").write_bytes(body)
            body_file = str(Path(tmp, "body.json"))
        return run_script(url, SCRIPT, [str(path_file), body_file, str(seed)], seconds=seconds, connections=connections)


def run_script(url: str, script: str, args: list[str], *, seconds: float, connections: int) -> dict[str, Any]:
    """``wrk`` with a Lua ``script`` (``DONE`` is appended) and its ``args``: requests/s, p50/p99/max
    in ms, errors (non-2xx answers included)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "bench.lua")
        path.write_text(script + DONE)
        done = subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{connections}",
                f"-d{seconds:g}s",
                "--timeout",
                "10s",
                "-s",
                str(path),
                url,
                "--",
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    line = next(x for x in done.stdout.splitlines() if x.startswith("WRKJSON "))
    raw = json.loads(line.removeprefix("WRKJSON "))
    return {
        "rps": raw["requests"] / (raw["duration_us"] / 1e6),
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
        "errors": raw["errors"] + raw["non_2xx"],
        "requests": raw["requests"],
    }
