"""Waiting that scales: script calls per admitted request and fairness across processes.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_waiting.py

Three processes share one key of ``20/second`` whose limit was just used up, and each
sends ``PER_PROCESS`` requests at once with ``acquire(key, wait=True)`` (the throttled
outbound case: every request must go out, as soon as the limit allows). Two waiters side
by side, in the same repetitions:

- **retry**: what ``wait=True`` did before (every waiter sleeps ``retry_after``, wakes with
  all the others and tries again);
- **ours**: ``Limiter.acquire(wait=True)`` (``aioratelimit._limits.waiting``: a TokenBucket books
  its slot, the windows queue their waiters per key and process).

Figures per limiter (``SlidingWindow``, and ``TokenBucket(burst=1)``, whose every slot is
one request): script calls per admitted request (counted by each process's ``on_call``
hook), the spread of the three processes' finish times (the last admission of each,
seconds after the common start) and the ratio of the latest to the earliest finish
(fair: within 2), and whether each process admitted its requests in the order they
asked (FIFO). Medians over the repetitions; each process starts on a common wall-clock
instant so interpreter start-up is not measured.

``bench_waiting.py --worker URL PREFIX KIND WAITER N START`` is one of those processes
(the test suite runs them too, against its own server).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import harness as h

import aioratelimit as arl
from aioratelimit._limits.waiting import TIMER_SLACK

PROCESSES = 3
PER_PROCESS = h.scaled(20, 2)
RATE = "20/second"
LIMITERS = ("sliding", "token")
WAITERS = ("retry", "ours")


def limiter(kind: str, backend: arl.Backend) -> arl.Limiter:
    if kind == "sliding":
        return arl.SlidingWindow(RATE, backend=backend)
    return arl.TokenBucket(RATE, burst=1, backend=backend)


async def retry_waiter(lim: arl.Limiter, key: str) -> None:
    """The waiter before ``_limits.waiting``: sleep ``retry_after``, try again."""
    decision = await lim.hit(key)
    while not decision.allowed:
        await asyncio.sleep(decision.retry_after + TIMER_SLACK)
        decision = await lim.hit(key)


async def worker(url: str, prefix: str, kind: str, waiter: str, n: int, start: float) -> None:
    """One process: ``n`` waiters at once on one key; prints JSON on stdout."""
    calls = 0

    def count(call: object) -> None:
        nonlocal calls
        calls += 1

    async with arl.Backend.from_url(url, prefix=prefix, on_call=count) as backend:
        lim = limiter(kind, backend)
        await lim.peek("warm-up")  # connect and load the script before the start
        calls = 0
        await asyncio.sleep(max(0.0, start - time.time()))
        order: list[int] = []
        finish: list[float] = []

        async def one(i: int) -> None:
            if waiter == "ours":
                await lim.acquire("k", wait=True)
            else:
                await retry_waiter(lim, "k")
            order.append(i)
            finish.append(time.time() - start)

        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(one(i)))
            await asyncio.sleep(0)  # each task sends its first try in turn: arrival order
        await asyncio.gather(*tasks)
    print(json.dumps({"calls": calls, "fifo": order == sorted(order), "finish": max(finish)}))


async def fill(url: str, prefix: str, kind: str, start: float) -> None:
    """Use the key's whole limit up just before the start: every request is throttled."""
    async with arl.Backend.from_url(url, prefix=prefix) as backend:
        lim = limiter(kind, backend)
        await lim.peek("k")  # connect and load the script first
        await asyncio.sleep(max(0.0, start - 0.02 - time.time()))
        await lim.hit("k", 20 if kind == "sliding" else 1)


def run_once(url: str, prefix: str, kind: str, waiter: str) -> dict[str, Any]:
    """Three processes on one fresh key; their figures together."""
    start = time.time() + 1.5
    command = [sys.executable, __file__, "--worker", url, prefix, kind, waiter]
    procs = [
        subprocess.Popen(
            [*command, str(PER_PROCESS), repr(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    asyncio.run(fill(url, prefix, kind, start))
    outs = [p.communicate(timeout=300) for p in procs]
    results = []
    for proc, (out, err) in zip(procs, outs, strict=True):
        if proc.returncode != 0:
            raise SystemExit(f"a worker failed: {err[-2000:]}")
        results.append(json.loads(out))
    finishes = [r["finish"] for r in results]
    return {
        "calls": sum(r["calls"] for r in results) / (PROCESSES * PER_PROCESS),
        "spread": max(finishes) - min(finishes),
        "ratio": max(finishes) / min(finishes),
        "fifo": all(r["fifo"] for r in results),
        "last": max(finishes),
    }


async def main(lab: h.Lab) -> None:
    reps: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rep in range(h.REPS):
        for kind in LIMITERS:
            # Alternate which waiter goes first from one repetition to the next.
            for waiter in WAITERS if rep % 2 == 0 else WAITERS[::-1]:
                h.progress(f"rep {rep + 1}/{h.REPS}: {kind} {waiter}")
                run_prefix = f"{lab.prefix}:{rep}:{kind}:{waiter}"
                figures = await asyncio.to_thread(run_once, lab.url, run_prefix, kind, waiter)
                reps.setdefault((kind, waiter), []).append(figures)
    rows = []
    for kind in LIMITERS:
        for waiter in WAITERS:
            runs = reps[kind, waiter]
            rows.append([
                "SlidingWindow" if kind == "sliding" else "TokenBucket(burst=1)",
                waiter,
                h.fmt(h.median(r["calls"] for r in runs), 2),
                h.fmt(max(r["calls"] for r in runs), 2),
                h.fmt(h.median(r["spread"] for r in runs), 2),
                f"{h.fmt(h.median(r['ratio'] for r in runs), 2)}"
                f" ({h.fmt(max(r['ratio'] for r in runs), 2)})",
                h.fmt(h.median(r["last"] for r in runs), 2),
                "yes" if all(r["fifo"] for r in runs) else "no",
            ])  # fmt: skip
    h.print_table(
        f"{PROCESSES} processes x {PER_PROCESS} requests on one key of {RATE}",
        ["limiter", "waiter", "calls / admitted", "worst rep", "finish spread (s)",
         "latest / earliest finish (worst rep)", "all done (s)", "FIFO in each process"],
        rows,
    )  # fmt: skip
    h.print_notes(
        "calls / admitted: script calls of all three processes (their `on_call` hooks)"
        " divided by the requests admitted. Finish: each process's last admission, seconds"
        " after the common start; the spread is the latest less the earliest.",
        f"Medians over {h.REPS} repetitions; stdev of ours' calls/admitted: "
        + ", ".join(
            f"{k} {statistics.pstdev([r['calls'] for r in reps[k, 'ours']]):.2f}" for k in LIMITERS
        )
        + ".",
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, prefix, kind, waiter, n, start = sys.argv[2:8]
        asyncio.run(worker(url, prefix, kind, waiter, int(n), float(start)))
    else:
        h.run(
            main,
            "Waiting: script calls per admitted request, and fairness across processes",
            extra=[("processes", str(PROCESSES)), ("requests per process", str(PER_PROCESS))],
        )
