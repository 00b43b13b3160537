"""Sum a py-spy profile of the ci-sizer worker by layer, per request kind (GET sizing, POST runs, the
rest: middleware and FastAPI frames of a task that does not show its route).

    python bench/mixed.py --rounds 1 --seconds 25 &      # the ci-sizer round comes second
    py-spy record -p <pid of "service serve"> -d 20 -r 200 --format raw --nonblocking -o prof.txt
    python bench/profile_layers.py prof.txt

Each sample goes to the layer of its deepest frame that belongs to one (so time inside asyncpg called
by SQLAlchemy is asyncpg's); ``*`` lines count samples with such a frame anywhere in the stack.
"""

from __future__ import annotations

import collections
import re
import sys

LAYERS = [
    ("logging", r"(^|/)logging/|service/observability/logs\.py"),
    ("metrics", r"prometheus_client/|service/observability/metrics\.py"),
    ("middleware", r"service/observability/middleware\.py|service/auth\.py|service/paths\.py|starlette/middleware"),
    ("ORM/SQLAlchemy", r"sqlalchemy/|sqlmodel/"),
    ("asyncpg", r"asyncpg/"),
    ("pydantic", r"pydantic/|pydantic_core|orjson|json/"),
    ("starlette/fastapi", r"starlette/|fastapi/"),
    ("core", r"service/core/"),
    ("uvicorn/asyncio", r"uvicorn/|asyncio/|uvloop|httptools"),
    ("our code", r"service/"),
]
ANYWHERE = [
    ("simple-query execute (BEGIN/COMMIT/...)", "asyncpg/connection.py:377"),
    ("opening connections (connect_utils, SSL probe)", "connect_utils"),
    ("closing connections", "Connection.close"),
    ("prepare (statement cache miss)", "_get_statement"),
    ("change feed (LISTEN/NOTIFY)", "service/changes.py"),
    ("retention prune_job", "retention.py"),
    ("sqlalchemy.orm", "sqlalchemy/orm"),
    ("pydantic", "pydantic"),
    ("core", "service/core/"),
    ("middleware", "observability/middleware"),
]


def layer_of(frames: list[str]) -> str:
    for f in reversed(frames):
        m = re.search(r"\((.*?):\d+\)", f)
        path = m.group(1) if m else f
        for name, pattern in LAYERS:
            if re.search(pattern, path):
                return name
    return "other (event loop in C)"


def kind_of(stack: str) -> str:
    if "service/sizing/" in stack:
        return "GET sizing"
    if "service/runs/" in stack:
        return "POST runs"
    if "service/jobs/summaries.py" in stack or "_periodic" in stack:
        return "background passes"
    return "rest (middleware, framework, loop)"


def main(path: str) -> None:
    total: collections.Counter[str] = collections.Counter()
    layers: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    ours: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    anywhere: collections.Counter[str] = collections.Counter()
    for line in open(path, errors="replace"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        kind = kind_of(stack)
        total[kind] += n
        layers[kind][layer_of(frames)] += n
        leaves[kind][frames[-1][:110]] += n
        service = [f for f in frames if "service/" in f and "__main__" not in f]
        if service:
            ours[kind][service[-1][:100]] += n
        for name, needle in ANYWHERE:
            if needle in stack:
                anywhere[name] += n
    grand = sum(total.values())
    print(f"samples: {grand}")
    for kind, n in total.most_common():
        print(f"\n== {kind}: {n} samples ({100 * n / grand:.0f}% of all)")
        for name, c in layers[kind].most_common():
            print(f"   {name:<26}{c:>6}  {100 * c / n:5.1f}%")
        print("   top leaf frames:")
        for frame, c in leaves[kind].most_common(8):
            print(f"     {100 * c / n:5.1f}%  {frame}")
        print("   deepest service/ frame:")
        for frame, c in ours[kind].most_common(8):
            print(f"     {100 * c / n:5.1f}%  {frame}")
    print("\nanywhere in the stack (% of all samples):")
    for name, c in anywhere.most_common():
        print(f"  * {name:<50}{c:>6} {100 * c / grand:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1])
