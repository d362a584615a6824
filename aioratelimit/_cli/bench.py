"""``aioratelimit bench``: a short side-by-side run on one server, ours against the raw
redis-py floor (the same ``fixed_window`` script by EVALSHA through ``redis.asyncio``, so
the server does the same work and only the client differs), sequential and concurrent.

A progress bar on stderr when it is a terminal (none in a pipe or a log), a table at the
end. Figures from a loaded machine say little: run it where the service runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from .. import _scripts
from .._backend import Backend
from .._limits.algorithms import FixedWindow
from .._rates import Rate
from .output import CliError, out, table, where

#: The schemes of one server: what the redis-py floor can talk to (and memory://, with no
#: floor). A cluster or Sentinel URL names several servers.
SINGLE = ("redis://", "rediss://", "unix://", "memory://")
#: Never denies: every call is a counted hit, and the key is gone 10 s later.
RATE = Rate(10**9, 10.0)

Op = Callable[[], Awaitable[Any]]


def check(args: argparse.Namespace) -> None:
    """Bad input, before any I/O."""
    if not args.url.startswith(SINGLE):
        raise CliError(
            "bench measures one server: give it redis://, rediss:// or unix:// (one node of"
            " a cluster, or the Sentinel master), not a URL that names several"
        )
    if not args.seconds > 0:
        raise CliError(f"--seconds must be > 0, got {args.seconds}")
    if args.concurrency < 1:
        raise CliError(f"--concurrency must be >= 1, got {args.concurrency}")


class Progress:
    """``[#####.....] label`` redrawn in place on stderr when it is a terminal."""

    WIDTH = 30

    def __init__(self, total: float) -> None:
        self.on = sys.stderr.isatty()
        self.total, self.done = total, 0.0

    def show(self, label: str, fraction: float) -> None:
        if not self.on:
            return
        filled = int(self.WIDTH * min(1.0, (self.done + fraction) / self.total))
        bar = "#" * filled + "." * (self.WIDTH - filled)
        sys.stderr.write(f"\r  [{bar}] {label:<28}")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.on:
            sys.stderr.write("\r" + " " * (self.WIDTH + 36) + "\r")
            sys.stderr.flush()


async def _measure(
    op: Op, callers: int, seconds: float, tick: Callable[[float], None]
) -> tuple[float, list[float]]:
    """Calls per second and each call's latency (ms), ``callers`` at once for ``seconds``."""
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds

    async def caller() -> None:
        while (now := time.perf_counter()) < deadline:
            await op()
            latencies.append((time.perf_counter() - now) * 1000)

    async def ticker() -> None:
        while True:
            tick(min(1.0, (time.perf_counter() - start) / seconds))
            await asyncio.sleep(0.1)

    ticking = asyncio.create_task(ticker())
    try:
        await asyncio.gather(*(caller() for _ in range(callers)))
    finally:
        ticking.cancel()
    return len(latencies) / (time.perf_counter() - start), latencies


def _pct(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.3f}" if ordered else "-"


async def bench(args: argparse.Namespace, backend: Backend) -> int:
    key = f"bench-{uuid.uuid4().hex[:8]}"
    limiter = FixedWindow(RATE, backend=backend, name="bench")
    await limiter.peek(key)  # one round trip first: an unreachable server fails here

    def ours() -> Awaitable[Any]:
        return limiter.hit(key)

    floor: Op | None = None
    client: Any = None
    if not args.url.startswith("memory://"):
        import redis.asyncio as redis

        client = redis.Redis.from_url(args.url)
        script = _scripts.FIXED_WINDOW
        floor_keys = limiter._keys(backend, key + "-floor")
        await client.script_load(script.source)
        floor_args = (1, 1, RATE.limit, RATE.window_us)

        def floor_op() -> Awaitable[Any]:
            return client.evalsha(  # type: ignore[no-any-return]
                script.sha, len(floor_keys), *floor_keys, *floor_args
            )

        floor = floor_op
    plan = [("sequential", 1), (f"concurrent ({args.concurrency})", args.concurrency)]
    runs: list[tuple[str, str, Op, int]] = []
    for mode, n in plan:
        runs.append((mode, "aioratelimit", ours, n))
        if floor is not None:
            runs.append((mode, "redis-py", floor, n))
    progress = Progress(len(runs))
    rows = []
    best: dict[str, float] = {}
    try:
        for mode, who, op, n in runs:
            label = f"{who}, {mode}"

            def tick(fraction: float, label: str = label) -> None:
                progress.show(label, fraction)

            rate, latencies = await _measure(op, n, args.seconds, tick)
            progress.done += 1
            best[f"{who} {mode}"] = rate
            rows.append([label, f"{rate:,.0f}", _pct(latencies, 0.5), _pct(latencies, 0.99)])
    finally:
        progress.clear()
        if client is not None:
            await client.aclose()
    for row, (mode, who, _, _) in zip(rows, runs, strict=True):
        base = best.get(f"redis-py {mode}")
        row.append(f"{best[f'{who} {mode}'] / base:.2f}x" if base else "-")
    out(f"bench on {where(backend)}: FixedWindow hits, {args.seconds:g} s each")
    out(table(["", "calls/s", "p50 ms", "p99 ms", "vs redis-py"], rows))
    return 0
