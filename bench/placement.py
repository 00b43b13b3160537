"""Node scoring (rules P7-P10) over 5,000 nodes with 50 pods each: the compiled ``score_nodes`` vs
the pure-Python reference on the same columns, for the ``ci-bin-pack`` and ``limit-aware``
profiles. Target: under 5 ms per call with Cython. Also times the whole advice for one pod
(service layer: columns already built, ranking and the answer) so the core's share is visible.

``--plot FILE.svg`` instead writes the docs' picture: the same 30 build pods placed one by one
on a mixed node pool under ``spread`` and under ``ci-bin-pack``.

    python bench/placement.py [--results bench/out/placement.json] [--plot docs/placement.svg]
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import random
from array import array

from bench._util import interleaved, save, verdict
from service.core import _reference
from service.placement import scoring as placement
from service.placement.pods import PodTotals
from service.placement.schemas import PlacementAdvise, PlacementNode, PlacementPod
from service.placement.service import advise

try:
    from service.core import _sizing
except ImportError:  # pragma: no cover - the bench needs the compiled module
    sys.exit("the compiled core is not built: pip install -e . on a machine with gcc")

GIB = 1 << 30
MIB = 1 << 20


def cluster(nodes: int, per_node: int, seed: int) -> placement.Columns:
    """Columns of a fleet of mixed node sizes, each running ``per_node`` build pods."""
    rng = random.Random(seed)
    cols = placement.Columns(array("q"), array("q"), array("q"), [array("q") for _ in range(8)])
    for j in range(nodes):
        cpu = rng.choice((16_000, 32_000, 64_000, 96_000))
        cols.alloc_cpu.append(cpu)
        cols.alloc_mem.append(cpu // 1000 * 4 * GIB)
        for _ in range(per_node):
            req_cpu, req_mem = rng.randrange(50, 600), rng.randrange(64, 1024) * MIB
            best_effort = rng.random() < 0.1
            values = (
                req_cpu, req_mem, req_cpu, req_mem,
                0 if best_effort else req_cpu * 2, 0 if best_effort else req_mem * 2,
                int(best_effort), int(best_effort),
            )  # fmt: skip
            cols.pod_node.append(j)
            for column, v in zip(cols.pods, values, strict=True):
                column.append(v)
    return cols


def timing(args: argparse.Namespace) -> None:
    n, per = args.nodes, args.pods_per_node
    cols = cluster(n, per, seed=1)
    pod = PodTotals(1000, 2 * GIB, 1000, 2 * GIB, 2000, 4 * GIB, 0, 0)
    rows = []
    print(f"{n:,} nodes x {per} pods ({n * per:,} pods)")
    print(f"{'profile':<16}{'cython':>12}{'reference':>14}{'vs ref':>9}{'advise()':>12}")
    nodes = [PlacementNode(name=f"n{j}") for j in range(n)]
    rng = random.Random(0)
    for name in ("ci-bin-pack", "limit-aware"):
        scorers = [placement.scorer_tuple(s) for s in placement.PROFILES[name]]
        call = (cols.alloc_cpu, cols.alloc_mem, cols.pod_node, *cols.pods, pod.as_tuple(), scorers)
        assert _sizing.score_nodes(*call) == _reference.score_nodes(*call)
        t = interleaved(
            {
                "cython": lambda c=call: _sizing.score_nodes(*c),
                "reference": lambda c=call: _reference.score_nodes(*c),
                "advise": lambda s=placement.PROFILES[name]: placement.score(nodes, cols, pod, s, rng, top=50),
            },
            rounds=args.rounds,
            min_time=0.2,
        )
        vs_ref = t["reference"] / t["cython"]
        print(
            f"{name:<16}{t['cython'] * 1e3:>10.2f}ms{t['reference'] * 1e3:>12.1f}ms{vs_ref:>8.1f}x"
            f"{t['advise'] * 1e3:>10.2f}ms"
        )
        rows.append(
            {
                "figure": f"score {n:,} nodes x {per} pods, {name}",
                "cython_ms": round(t["cython"] * 1e3, 2),
                "reference_ms": round(t["reference"] * 1e3, 1),
                "cython_vs_reference": round(vs_ref, 1),
                "advise_ms": round(t["advise"] * 1e3, 2),
                "target": "cython < 5 ms",
                "result": verdict(t["cython"] < 0.005),
            }
        )
    notes = [
        "advise: the service's scoring of one pod with the cluster's columns already built "
        "(score_nodes + ranking + the answer); parsing a 250,000-pod JSON snapshot is not included.",
    ]
    save(args.results, "placement", rows, notes)


# --------------------------------------------------------------------------- the docs' picture

POOL = [("s1", 4), ("s2", 4), ("m1", 8), ("m2", 8), ("l1", 16), ("l2", 16)]
COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"]


def land(profile: str, pods: list[tuple[int, int]], seed: int) -> list[list[int]]:
    """Place the pods one by one (each stays); returns, per node, the indices of its pods."""
    nodes = [{"name": name, "allocatable": {"cpu": cpu, "memory": f"{cpu * 4}Gi"}, "pods": []} for name, cpu in POOL]
    where: list[list[int]] = [[] for _ in POOL]
    for i, (cpu_m, mem_mib) in enumerate(pods):
        pod = {"requests": {"cpu": f"{cpu_m}m", "memory": f"{mem_mib}Mi"}}
        body = PlacementAdvise.model_validate({"nodes": nodes, "pod": pod, "profile": profile, "seed": seed + i})
        answer = advise(body, PlacementPod.model_validate(pod), {"source": "given"})
        if answer["pick"] is None:
            continue
        j = next(k for k, (name, _) in enumerate(POOL) if name == answer["pick"])
        nodes[j]["pods"].append(pod)
        where[j].append(i)
    return where


def svg(panels: list[tuple[str, list[list[int]]]], pods: list[tuple[int, int]]) -> str:
    """Side-by-side panels: a column per node (height = allocatable CPU), a block per pod."""
    scale, col_w, gap, top, left = 14, 44, 16, 56, 40
    panel_w = left + len(POOL) * (col_w + gap) + 20
    height = top + 16 * scale + 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{panel_w * len(panels)}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{panel_w * len(panels)}" height="{height}" fill="white"/>',
    ]
    for p, (title, where) in enumerate(panels):
        x0 = p * panel_w
        used = sum(1 for w in where if w)
        out.append(f'<text x="{x0 + left}" y="22" font-size="15" font-weight="bold">{title}</text>')
        out.append(f'<text x="{x0 + left}" y="40" fill="#555">{used} of {len(POOL)} nodes busy</text>')
        base = top + 16 * scale
        for j, (name, cpu) in enumerate(POOL):
            x = x0 + left + j * (col_w + gap)
            out.append(
                f'<rect x="{x}" y="{base - cpu * scale}" width="{col_w}" height="{cpu * scale}" '
                'fill="#f4f4f4" stroke="#999"/>'
            )
            y = base
            for i in where[j]:
                h = pods[i][0] / 1000 * scale
                y -= h
                out.append(
                    f'<rect x="{x + 2}" y="{y:.1f}" width="{col_w - 4}" height="{h:.1f}" '
                    f'fill="{COLORS[i % len(COLORS)]}" stroke="white"/>'
                )
            out.append(f'<text x="{x + col_w / 2}" y="{base + 16}" text-anchor="middle">{name}</text>')
            out.append(f'<text x="{x + col_w / 2}" y="{base + 30}" text-anchor="middle" fill="#777">{cpu} CPU</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def plot(path: Path) -> None:
    rng = random.Random(42)
    pods = [(rng.choice((500, 1000, 1000, 2000)), rng.choice((1024, 2048, 4096))) for _ in range(16)]
    panels = [
        ("spread (least-allocated, the default)", land("spread", pods, seed=1)),
        ("ci-bin-pack (smallest node, fullest first)", land("ci-bin-pack", pods, seed=1)),
    ]
    path.write_text(svg(panels, pods))
    for title, where in panels:
        print(f"{title}: " + ", ".join(f"{name} {len(w)}" for (name, _), w in zip(POOL, where, strict=True)))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=50)
    parser.add_argument("--plot", type=Path, help="write the spread vs ci-bin-pack picture (SVG) and exit")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot)
    else:
        timing(args)


if __name__ == "__main__":
    main()
