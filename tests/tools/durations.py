"""Write tests/durations.json from the output of a run with ``--durations=0`` (issue 36).

    make durations          # or, by hand:
    python -m pytest -q -p no:cacheprovider -m '' --durations=0 > /tmp/run.log
    python tests/tools/durations.py /tmp/run.log

Keeps each test's call time when it is at least ``LONG`` seconds (setup times are left out: a module's
shared fixture is charged to whichever of its tests comes first). tests/conftest.py starts these tests
first, spread over the xdist workers, so that no long test starts last and leaves the others idle.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LONG = 2.0
OUT = Path(__file__).resolve().parent.parent / "durations.json"
LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s call\s+(\S+)\s*$")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    durations: dict[str, float] = {}
    for line in Path(argv[0]).read_text().splitlines():
        m = LINE.match(line)
        if m and float(m[1]) >= LONG:
            durations[m[2]] = round(float(m[1]), 1)
    if not durations:
        print(f"no call of {LONG} s or more in {argv[0]}: was it run with --durations=0?", file=sys.stderr)
        return 1
    ordered = dict(sorted(durations.items(), key=lambda kv: (-kv[1], kv[0])))
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{OUT}: {len(ordered)} tests of {LONG} s or more, {sum(ordered.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
