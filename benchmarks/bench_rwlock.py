"""Read/write and fair locks beside today's lock, side by side in one run.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_rwlock.py

Two measurements:

1. Uncontended acquire + release, sequentially on one name each, interleaved in blocks: a
   raw EVALSHA round trip (the floor), ``Lock``, ``ReadWriteLock`` to read (its first
   reader and a reader beside another that holds) and to write, and ``FairLock``; each as
   wall-clock µs, a ratio to the floor, and the server's CPU.
2. Hand-off latency with 8 and 200 contenders, in rounds (``bench_locks.rounds_async``: each
   contender takes the lock once per round, so it always passes to a waiting contender); a
   sample is the time from the start of ``release`` to the return of the next holder's
   ``acquire``: today's ``Lock`` (its process-local line; a release wakes the line's head),
   the fair lock (a queue in Redis; a release wakes the next waiter alone, on its own
   channel) and writers of a ``ReadWriteLock``.
"""

from __future__ import annotations

import asyncio
import statistics
from functools import partial
from typing import Any

import harness as h
import redis.asyncio as aredis
from bench_locks import percentile, rounds_async

import aioratelimit as arl
from aioratelimit._stores.base import DEFAULT_CONNECT_TIMEOUT

FLOOR_LUA = "return redis.call('GET', KEYS[1])"
TTL = 30.0
UNC_N = h.scaled(2000, 20)  # sequential acquire+release per condition per repetition
UNC_BLOCK = min(100, UNC_N)
CONTENDERS = (8, 200)
ROUNDS = {8: h.scaled(40, 2), 200: h.scaled(3, 1)}  # hand-off rounds per repetition


def fair_lock(backend: arl.Backend, name: str, ttl: float) -> h.LockPair:
    lock = arl.FairLock(name, ttl=ttl, backend=backend)

    async def release(lease: arl.Lease) -> None:
        await lease.release()

    return lock.acquire, release


def rw_writer(backend: arl.Backend, name: str, ttl: float) -> h.LockPair:
    rw = arl.ReadWriteLock(name, ttl=ttl, backend=backend)

    async def release(lease: arl.Lease) -> None:
        await lease.release()

    return rw.acquire_write, release


async def uncontended(lab: h.Lab, client: aredis.Redis, backend: arl.Backend) -> None:
    floor_sha = await client.script_load(FLOOR_LUA)
    prefix = lab.prefix
    lock = arl.Lock(f"{prefix}:u-lock", ttl=TTL, backend=backend)
    rw = arl.ReadWriteLock(f"{prefix}:u-rw", ttl=TTL, backend=backend)
    shared = arl.ReadWriteLock(f"{prefix}:u-shared", ttl=TTL, backend=backend)
    fair = arl.FairLock(f"{prefix}:u-fair", ttl=TTL, backend=backend)
    # Another reader holds it throughout (from a task of its own: a task that holds a rw
    # lock may not ask for it again), for longer than the run (nothing renews it).
    keeper = arl.ReadWriteLock(shared.name, ttl=3600, backend=backend)
    beside = await asyncio.create_task(keeper.acquire_read())

    async def raw(i: int) -> None:
        await client.evalsha(floor_sha, 1, f"{prefix}:floor")

    def cycle(acquire: Any) -> h.Op:
        async def op(i: int) -> None:
            await (await acquire()).release()

        return op

    cases = {
        "raw": raw,
        "lock": cycle(lock.acquire),
        "read": cycle(rw.acquire_read),
        "read beside": cycle(shared.acquire_read),
        "write": cycle(rw.acquire_write),
        "fair": cycle(fair.acquire),
    }
    await h.interleave(cases, 20, 20)  # warm-up: connections, scripts
    reps = h.Reps()
    for rep in range(h.REPS):
        h.progress(f"uncontended, repetition {rep + 1}/{h.REPS}")
        reps.append(await h.interleave(cases, UNC_N, UNC_BLOCK, rep, lab.meter))
    await beside.release()
    rows = [
        [label, reps.latency(name), reps.speed("raw", name), reps.server(name)]
        for label, name in (
            ("raw EVALSHA, redis.asyncio (the floor)", "raw"),
            ("`Lock` acquire + release (today's lock)", "lock"),
            ("`ReadWriteLock` read, nobody else inside", "read"),
            ("`ReadWriteLock` read, beside another reader", "read beside"),
            ("`ReadWriteLock` write", "write"),
            ("`FairLock` acquire + release, nobody waiting", "fair"),
        )
    ]
    h.print_table(
        "Uncontended acquire + release",
        ["condition", "µs per acquire + release (min-max)", "÷ raw EVALSHA (time)",
         "server CPU µs"],
        rows,
    )  # fmt: skip


async def handoff(lab: h.Lab, backend: arl.Backend) -> None:
    makers = (
        ("`Lock` (today's: a process-local line)", "lock", h.our_lock),
        ("`FairLock` (a queue in Redis, the next waiter woken alone)", "fair", fair_lock),
        ("`ReadWriteLock` writers", "rw", rw_writer),
    )
    rows = []
    for contenders in CONTENDERS:
        found: dict[str, list[tuple[float, float]]] = {key: [] for _, key, _ in makers}
        for rep in range(h.REPS):
            h.progress(f"hand-off, {contenders} contenders, repetition {rep + 1}/{h.REPS}")
            turn = rep % len(makers)  # the order rotates every repetition
            for _, key, make in makers[turn:] + makers[:turn]:
                name = f"{lab.prefix}:h{contenders}-{rep}{key}"
                pair = partial(make, backend, name, TTL)
                xs = await rounds_async(pair, contenders, ROUNDS[contenders])
                found[key].append((statistics.median(xs), percentile(xs, 0.99)))
        rows += [
            [
                str(contenders),
                label,
                h.with_spread([m * 1e3 for m, _ in found[key]], 3),
                h.with_spread([p * 1e3 for _, p in found[key]], 2),
                str(ROUNDS[contenders] * (contenders - 1)),
            ]
            for label, key, _ in makers
        ]
    h.print_table(
        "Hand-off latency",
        ["contenders", "lock", "median ms (range over reps)", "p99 ms (range)",
         "samples per rep"],
        rows,
    )  # fmt: skip


async def main(lab: h.Lab) -> None:
    options: dict[str, Any] = {
        "socket_timeout": None,
        "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT,
    }
    client = h.raw_client(lab.url, **options)
    backend = h.our_backend(lab.url, lab.prefix)
    try:
        await uncontended(lab, client, backend)
        await handoff(lab, backend)
    finally:
        await backend.aclose()
        await client.aclose()
    h.print_notes(
        f"Uncontended: {UNC_N} acquire + release per condition per repetition, interleaved"
        f" in blocks of {UNC_BLOCK}; ratios are medians over the {h.REPS} repetitions of the"
        " per-repetition ratio to the floor. Server CPU: `INFO CPU` deltas per acquire +"
        " release.",
        "Hand-off: each contender takes the lock once per round; a sample is the time from"
        " the start of `release` to the return of the next holder's `acquire`; medians and"
        " p99 per repetition, then summarised. The three locks run in an order that rotates"
        " every repetition, on one backend and one server.",
    )


if __name__ == "__main__":
    h.run(main, "Read/write and fair locks beside today's lock", ["aioratelimit", "redis"])
