"""The core's six stats (rule I2) over 3,600 and 100,000 samples: the compiled Cython module vs the
pure-Python reference vs NumPy (``max``, ``percentile`` of the four quantiles, ``mean``) on the same
arrays; and the per-container arithmetic call (``size_container``), Cython vs reference.

Targets: Cython >= 1.5x NumPy and >= 20x the reference. Not a test: it prints figures.

    python bench/core.py [--results bench/out/core.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository root on the path, not bench/ (whose http.py would shadow the standard library's)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import math
import random
import sys
from array import array

import numpy as np

from bench._util import interleaved, save, verdict
from service.core import _reference

try:
    from service.core import _sizing
except ImportError:  # pragma: no cover - the bench needs the compiled module
    sys.exit("the compiled core is not built: pip install -e . on a machine with gcc")

QUANTILES = [99.0, 95.0, 75.0, 50.0]


def numpy_six(x: np.ndarray) -> tuple[float, ...]:
    p99, p95, p75, p50 = np.percentile(x, QUANTILES)
    return float(x.max()), float(p99), float(p95), float(p75), float(p50), float(x.mean())


def samples(n: int, seed: int) -> list[float]:
    """CPU millicores as a build produces them: a busy compile phase, idle gaps, spikes."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        phase = (i // 300) % 3
        base = (1800.0, 250.0, 900.0)[phase]
        out.append(max(0.0, rng.gauss(base, base * 0.2)) + (4000.0 if rng.random() < 0.005 else 0.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", help="write the figures as JSON here (for bench/report.py)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    rows = []
    print(f"{'operation':<34}{'cython':>12}{'numpy':>12}{'reference':>12}{'vs numpy':>10}{'vs ref':>9}")
    for n in (3_600, 100_000):
        values = samples(n, seed=n)
        as_array = array("d", values)
        as_numpy = np.asarray(values, dtype=np.float64)
        want = _reference.six_stats(values)
        for got in (_sizing.six_stats(as_array), numpy_six(as_numpy)):
            assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(want, got, strict=True)), (want, got)
        t = interleaved(
            {
                "cython": lambda a=as_array: _sizing.six_stats(a),
                "numpy": lambda a=as_numpy: numpy_six(a),
                "reference": lambda a=values: _reference.six_stats(a),
            },
            rounds=args.rounds,
        )
        vs_numpy = t["numpy"] / t["cython"]
        vs_ref = t["reference"] / t["cython"]
        print(
            f"{'six_stats, ' + format(n, ',') + ' samples':<34}{t['cython'] * 1e6:>10.1f}us{t['numpy'] * 1e6:>10.1f}us"
            f"{t['reference'] * 1e6:>10.1f}us{vs_numpy:>9.2f}x{vs_ref:>8.1f}x"
        )
        rows.append(
            {
                "figure": f"six_stats, {n:,} samples",
                "cython_us": round(t["cython"] * 1e6, 2),
                "numpy_us": round(t["numpy"] * 1e6, 2),
                "reference_us": round(t["reference"] * 1e6, 2),
                "cython_vs_numpy": round(vs_numpy, 2),
                "cython_vs_reference": round(vs_ref, 1),
                "target": "cython >= 1.5x numpy, >= 20x reference",
                "result": verdict(vs_numpy >= 1.5 and vs_ref >= 20),
            }
        )

    # per-container arithmetic: a confident job, 1.5 GiB observed, an OOM streak of 1, a node ceiling
    call = (2, 1234.5, 1536 * 2**20, 2048 * 2**20, 20, 1, 1024 * 2**20, 14 * 2**30, True)
    assert _sizing.size_container(*call) == _reference.size_container(*call)
    t = interleaved(
        {"cython": lambda: _sizing.size_container(*call), "reference": lambda: _reference.size_container(*call)},
        rounds=args.rounds,
    )
    vs_ref = t["reference"] / t["cython"]
    print(
        f"{'size_container (one call)':<34}{t['cython'] * 1e9:>10.0f}ns{'':>12}{t['reference'] * 1e9:>10.0f}ns{'':>10}{vs_ref:>8.1f}x"
    )
    rows.append(
        {
            "figure": "size_container, one call",
            "cython_us": round(t["cython"] * 1e6, 3),
            "reference_us": round(t["reference"] * 1e6, 3),
            "cython_vs_reference": round(vs_ref, 1),
            "target": "(no target; reported)",
            "result": "-",
        }
    )
    save(args.results, "core", rows)


if __name__ == "__main__":
    main()
