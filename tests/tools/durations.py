"""Write tests/durations.json from the output of a run with ``--durations=0`` (issue 36).

    make durations          # or, by hand:
    python -m pytest -q -p no:cacheprovider -m '' --durations=0 > /tmp/run.log
    python tests/tools/durations.py /tmp/run.log

Keeps each test's setup and call time when together they are at least ``LONG`` seconds. A module's
shared fixture (a wheel built and installed, five live servers, a browser) is charged to the test that
set it up; tests/conftest.py's ``long_first`` moves whole modules, so the module carries it (with call
times alone the plain-install module weighed 6.8 s, its fixture 112 s, and it could start last).
tests/conftest.py starts these modules first, spread over the xdist workers, so that no long one starts
last and leaves the others idle. Several logs may be given (the two tiers timed apart).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LONG = 2.0
OUT = Path(__file__).resolve().parent.parent / "durations.json"
LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:setup|call)\s+(\S+)\s*$")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    spent: dict[str, float] = {}
    for log in argv:
        for line in Path(log).read_text().splitlines():
            m = LINE.match(line)
            if m:
                spent[m[2]] = spent.get(m[2], 0.0) + float(m[1])
    durations = {test: round(seconds, 1) for test, seconds in spent.items() if seconds >= LONG}
    if not durations:
        print(f"no test of {LONG} s or more in {', '.join(argv)}: run with --durations=0?", file=sys.stderr)
        return 1
    ordered = dict(sorted(durations.items(), key=lambda kv: (-kv[1], kv[0])))
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{OUT}: {len(ordered)} tests of {LONG} s or more, {sum(ordered.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
