"""The CPU one decision costs, the client's and the server's: ``tasks`` concurrent tasks
hitting one limiter.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/profile_hit.py --tasks 64 --decisions 40000 \
        [--limiter fw|sw|tb] [--profile 30]

(``LOOP=uvloop`` in front runs it on uvloop, as the other benchmarks.)

It prints one line per run: this process's CPU per decision (``time.process_time``: user
and system, the event loop and the kernel's share of the socket calls included), the
server's (``INFO CPU``) and decisions per second. ``--profile N`` runs the measured part
under cProfile and prints its top ``N`` functions by own time (cProfile inflates every
Python call, so read its shares, not its totals; ``perf record -g`` on the process sees C
frames too). For an A/B of two trees, alternate runs of this script in each tree's venv,
one process per run: only interleaved figures compare on a machine whose speed drifts.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections.abc import Callable

import harness as h

import aioratelimit as arl

LIMITERS: dict[str, Callable[[arl.Backend], arl.Limiter]] = {
    "fw": lambda backend: arl.FixedWindow("1000000000/hour", backend=backend),
    "sw": lambda backend: arl.SlidingWindow("1000000000/hour", backend=backend),
    "tb": lambda backend: arl.TokenBucket("1000000000/hour", backend=backend),
}


async def crowd(limiter: arl.Limiter, tag: str, tasks: int, decisions: int) -> None:
    """``decisions`` hits in all from ``tasks`` tasks, on 1,000 user keys."""
    await h.fan_out(lambda i: limiter.hit(f"{tag}:{i % 1000}"), tasks, decisions // tasks)(0)


async def main(lab: h.Lab, args: argparse.Namespace) -> None:
    backend = h.our_backend(lab.url, lab.prefix)
    limiter = LIMITERS[args.limiter](backend)
    try:
        await crowd(limiter, "warm", args.tasks, max(args.tasks * 20, args.decisions // 10))
        profiler = cProfile.Profile() if args.profile else None
        n = args.decisions // args.tasks * args.tasks
        server = lab.meter.read()
        start, cpu, times = time.perf_counter(), time.process_time(), os.times()
        if profiler is not None:
            profiler.enable()
        await crowd(limiter, "run", args.tasks, n)
        if profiler is not None:
            profiler.disable()
        elapsed, used = time.perf_counter() - start, time.process_time() - cpu
        user, system = (b - a for a, b in zip(times[:2], os.times()[:2], strict=True))
        server_us = lab.meter.since(server).total * 1e6 / n
        print(
            f"{args.limiter} tasks={args.tasks} decisions={n} cpu_us={used * 1e6 / n:.3f}"
            f" per_s={n / elapsed:.0f} user_us={user * 1e6 / n:.2f} sys_us={system * 1e6 / n:.2f}"
            f" server_us={server_us:.2f}",
            flush=True,
        )
        if profiler is not None:
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats("tottime").print_stats(args.profile)
    finally:
        await backend.aclose()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--decisions", type=int, default=40_000)
    parser.add_argument("--limiter", choices=sorted(LIMITERS), default="fw")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    with h.started() as lab:
        h.run_loop(main(lab, arguments))
