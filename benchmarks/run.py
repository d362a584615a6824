"""Run benchmarks one after the other, each in a process of its own; Markdown on stdout.

    .venv/bin/python benchmarks/run.py transport ratelimit > hot-path.md   # the hot path
    .venv/bin/python benchmarks/run.py > all.md                            # every bench_*.py

A name is a script's, without ``bench_`` and ``.py``. The knobs are every script's
(``REPS``, ``SCALE``, ``SMOKE``, ``LOOP``: see harness.py); progress goes to stderr.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        print(f"unknown: {', '.join(unknown)}; the benchmarks: {', '.join(NAMES)}", file=sys.stderr)
        return 2
    for name in names or NAMES:
        print(f"benchmarks/run.py: {name}", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, str(HERE / f"bench_{name}.py")], check=False)
        if done.returncode != 0:
            return done.returncode
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
