"""What rates from data (``policies=``) cost a decision, and how fast a change spreads.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_policies.py

Decision cost: ``FixedWindow.hit`` on one of 100 keys under a limit every hit is admitted
by, sequentially, on memory:// (where any client-side overhead shows most) and on Redis
(with the server's CPU per decision), in three conditions:

- static: the code's rates (keys named by the rates; the fast path);
- policies, default: ``policies=Policies()``, no policy stored (every key resolved once to
  the code's rates, then from the local cache);
- policies, pro: every key assigned the named policy ``pro`` (same limit), resolved once.

The conditions run interleaved in blocks (the order rotating); figures are medians over
the repetitions and ratios medians of the per-repetition ratios to static.

Propagation: two backends on the one server (two processes' worth: each has its own
connections and its own subscriber); one assigns a key a new policy, the other's cached
resolution of that key is dropped when the message arrives. Timed from just before the
write is sent to the drop (``perf_counter``), over ``50 x SCALE`` changes per repetition.
"""

from __future__ import annotations

import asyncio
import time

import harness as h

import aioratelimit as arl
from aioratelimit._limits.policies import Policies

KEYS = 100
RATE = "1000000000/hour"  # every hit admitted: the same path each time


def hits(limiter: arl.FixedWindow) -> h.Op:
    async def op(i: int) -> None:
        await limiter.hit(f"k{i % KEYS}")

    return op


async def conditions(backend: arl.Backend, name: str) -> dict[str, h.Op]:
    static = arl.FixedWindow(RATE, backend=backend, name=f"{name}-static")
    default = arl.FixedWindow(RATE, backend=backend, name=f"{name}-default", policies=Policies())
    pro_policies = Policies()
    pro = arl.FixedWindow(RATE, backend=backend, name=f"{name}-pro", policies=pro_policies)
    await pro_policies.set("pro", RATE)
    for i in range(KEYS):
        await pro_policies.assign(f"k{i}", "pro")
    return {"static": hits(static), "policies, default": hits(default), "policies, pro": hits(pro)}


def rows(reps: h.Reps, server: bool) -> list[list[str]]:
    return [
        [case, reps.rate(case), h.fmt(h.median(s.us for s in reps.of(case)), 2),
         reps.speed(case, "static"), *([reps.server(case)] if server else [])]
        for case in reps.runs[0]
    ]  # fmt: skip


async def measure(
    name: str, cases: dict[str, h.Op], total: int, block: int, meter: h.Meters = None
) -> h.Reps:
    await h.interleave(cases, 2 * KEYS, KEYS)  # warm-up: every key resolved, scripts loaded
    reps = h.Reps()
    for rep in range(h.REPS):
        h.progress(f"{name}: repetition {rep + 1}/{h.REPS}")
        reps.append(await h.interleave(cases, total, block, rotate=rep, meter=meter))
    return reps


class Timed(Policies):
    """``Policies`` that note when each change reached them."""

    __slots__ = ("arrived", "dropped")

    def __init__(self) -> None:
        super().__init__(ttl=3600)
        self.dropped: dict[str, float] = {}
        self.arrived = asyncio.Event()

    def _changed(self, payload: bytes) -> None:
        self.dropped.setdefault(payload.decode(), time.perf_counter())
        self.arrived.set()
        super()._changed(payload)


async def propagation(url: str, prefix: str) -> list[float]:
    """Milliseconds from a change sent over one backend to its drop in the other's cache."""
    here, there = h.our_backend(url, prefix), h.our_backend(url, prefix)
    try:
        listening, writing = Timed(), Policies()
        limiter = arl.FixedWindow(RATE, backend=here, name="spread", policies=listening)
        arl.FixedWindow(RATE, backend=there, name="spread", policies=writing)
        await limiter.peek("first")  # starts the listener
        for _ in range(10_000):  # until the server confirmed its channel
            if listening._confirmed:
                break
            await asyncio.sleep(0.001)
        delays = []
        for i in range(h.scaled(50, 3)):
            key = f"k{i}"
            await limiter.peek(key)
            listening.arrived.clear()
            start = time.perf_counter()
            await writing.assign(key, arl.Policy(f"{i + 1}/hour"))
            while f"k:{key}" not in listening.dropped:
                await asyncio.wait_for(listening.arrived.wait(), 10)
                listening.arrived.clear()
            delays.append(1000 * (listening.dropped[f"k:{key}"] - start))
        return delays
    finally:
        await here.aclose()
        await there.aclose()


async def main(lab: h.Lab) -> None:
    memory = arl.Backend.from_url("memory://", prefix=lab.prefix)
    redis_backend = h.our_backend(lab.url, lab.prefix)
    try:
        header = ["condition", "decisions/s", "µs/decision", "÷ static (speed)"]
        cases = await conditions(memory, "bench")
        reps = await measure("memory://", cases, h.scaled(20_000, 50), 500)
        h.print_table("memory://, sequential FixedWindow.hit", header, rows(reps, False))

        cases = await conditions(redis_backend, "bench")
        reps = await measure("redis", cases, h.scaled(5_000, 20), 250, lab.meter)
        h.print_table(
            "Redis, sequential FixedWindow.hit",
            [*header, "server CPU µs/decision"],
            rows(reps, True),
        )

        spread = [await propagation(lab.url, lab.prefix) for _ in range(h.REPS)]
        every = sorted(d for rep in spread for d in rep)
        h.print_table(
            "A change over one backend, dropped from the other's cache (Redis, loopback)",
            ["changes", "median ms", "p90 ms", "max ms"],
            [[
                str(len(every)),
                h.fmt(h.median(every), 2),
                h.fmt(every[int(0.9 * (len(every) - 1))], 2),
                h.fmt(every[-1], 2),
            ]],
        )  # fmt: skip
        h.print_notes(
            "Ratios are throughput relative to static, the median of the per-repetition"
            " ratios (1.00: no difference). A key's first decision under policies costs a"
            " store read more (the warm-up takes it); the rows are the cached path. The"
            " propagation bound when a message is lost is the Policies ttl (30 s default)."
        )
    finally:
        await memory.aclose()
        await redis_backend.aclose()


if __name__ == "__main__":
    h.run(main, "Policies: a decision's cost and a change's spread", ["aioratelimit", "redis"])
