"""Locks, side by side in one run: the raw floor, ours, redis-py's asyncio Lock and
python-redis-lock.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_locks.py

Three measurements:

1. Uncontended acquire + release, sequentially on one key, interleaved in blocks, each as a
   ratio to one raw EVALSHA round trip (a one-command script) *with the same client* (every
   client here has the socket options of ``Backend.from_url``'s pool), and the server's
   CPU per acquire + release: ours (``Lock.acquire`` + ``Lease.release``, and ``async with
   arl.lock(...)`` with its renewal timer) and redis-py's ``redis.asyncio.lock.Lock``
   against an asyncio ``redis.asyncio`` EVALSHA; python-redis-lock (synchronous; its rows
   are left out where it is not installed) against a ``redis.Redis`` EVALSHA.
2. Hand-off latency with 8 contenders: in rounds, each contender takes the lock once per
   round (so the lock always passes to a contender that is already waiting, never back to
   the one that just released it); a sample is the time from the start of ``release`` to the
   return of the next holder's ``acquire``. Ours and redis-py run as asyncio tasks on one
   client; python-redis-lock as threads (it blocks in BLPOP, one connection per waiter).
3. Redis commands per acquisition under contention, 8 to 200 waiters, in the same rounds,
   from ``INFO commandstats`` deltas: the commands the clients *sent* (everything except
   the commands that only run inside that library's Lua scripts), and every command the
   server executed (scripts' inner commands included).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import harness as h
import redis
import redis.asyncio as aredis

import aioratelimit as arl
from aioratelimit._stores.base import DEFAULT_CONNECT_TIMEOUT

redis_lock = h.python_redis_lock()

#: The floor: one EVALSHA round trip of a one-command script.
FLOOR_LUA = "return redis.call('GET', KEYS[1])"
TTL = 30.0

UNC_N = h.scaled(2000, 20)  # sequential acquire+release per condition per repetition
UNC_BLOCK = min(100, UNC_N)
CONTENDERS = 8
ROUNDS = h.scaled(40, 2)  # hand-off rounds per repetition (7 samples each)
POLL_ROUNDS = h.scaled(8, 1)  # redis-py polls every 0.1 s: fewer rounds keep the run short
WAITERS = (8, 32, 200)
CMD_ROUNDS = h.scaled(3, 1)  # rounds per waiter count (each waiter acquires once a round)

#: Commands that run only inside each library's Lua scripts (the rest were sent by clients).
INNER = {
    "ours": {"time", "get", "set", "pexpire", "pttl", "publish", "spublish"},
    "redis-py": {"get", "del"},
    "python-redis-lock": {"get", "del", "lpush", "pexpire", "ttl", "expire"},
}
#: Our own measuring commands.
IGNORED = {"info", "config|resetstat"}


# -- rounds of contention -----------------------------------------------------------------


async def rounds_async(make: Callable[[], h.LockPair], contenders: int, rounds: int) -> list[float]:
    """``rounds`` rounds in which each of ``contenders`` tasks takes the lock once; returns
    the hand-off latencies (seconds) of every acquisition but the first of each round."""
    samples: list[float] = []
    starts = [asyncio.Event() for _ in range(rounds)]
    entered = [0] * rounds
    finished = [0]
    last_release = [0.0]

    async def contender() -> None:
        acquire, release = make()
        for r in range(rounds):
            await starts[r].wait()
            held = await acquire()
            got = time.perf_counter()
            entered[r] += 1
            if entered[r] > 1:
                samples.append(got - last_release[0])
            await asyncio.sleep(0)  # the critical section
            last_release[0] = time.perf_counter()
            await release(held)
            finished[0] += 1
            if finished[0] == contenders * (r + 1) and r + 1 < rounds:
                starts[r + 1].set()

    tasks = [asyncio.create_task(contender()) for _ in range(contenders)]
    await asyncio.sleep(0.05)  # every contender is waiting for the first round
    starts[0].set()
    await asyncio.gather(*tasks)
    return samples


def rounds_threads(client: redis.Redis, name: str, contenders: int, rounds: int) -> list[float]:
    """``rounds_async`` for python-redis-lock, one thread per contender."""
    assert redis_lock is not None
    samples: list[float] = []
    starts = [threading.Event() for _ in range(rounds)]
    entered = [0] * rounds
    finished = [0]
    last_release = [0.0]
    guard = threading.Lock()

    def contender() -> None:
        assert redis_lock is not None
        lk = redis_lock.Lock(client, name, expire=int(TTL))
        for r in range(rounds):
            starts[r].wait()
            lk.acquire()
            got = time.perf_counter()
            with guard:
                entered[r] += 1
                if entered[r] > 1:
                    samples.append(got - last_release[0])
                last_release[0] = time.perf_counter()
            lk.release()
            with guard:
                finished[0] += 1
                if finished[0] == contenders * (r + 1) and r + 1 < rounds:
                    starts[r + 1].set()

    threads = [threading.Thread(target=contender) for _ in range(contenders)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    starts[0].set()
    for t in threads:
        t.join()
    return samples


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- INFO commandstats --------------------------------------------------------------------


async def commandstats(client: aredis.Redis) -> dict[str, int]:
    info = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


def per_acquisition(
    before: dict[str, int], after: dict[str, int], inner: set[str], acquisitions: int
) -> tuple[float, float, float]:
    """(commands sent by clients, of which ECHO, commands executed) per acquisition. Our
    wire closes each write with an ECHO (its check that no reply was lost): part of the
    same write, never a round trip of its own, so it is counted apart."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    executed = sum(v for k, v in delta.items() if k not in IGNORED)
    sent = sum(v for k, v in delta.items() if k not in IGNORED and k not in inner)
    return sent / acquisitions, delta.get("echo", 0) / acquisitions, executed / acquisitions


# -- the run ------------------------------------------------------------------------------


async def uncontended(
    lab: h.Lab, client: aredis.Redis, sync_client: redis.Redis, backend: arl.Backend
) -> None:
    floor_sha = await client.script_load(FLOOR_LUA)
    sync_client.script_load(FLOOR_LUA)
    floor_key, prefix = f"{lab.prefix}:floor", lab.prefix
    ours_lock = arl.Lock(f"{prefix}:u-ours", ttl=TTL, backend=backend)
    redispy_acquire, redispy_release = h.redispy_lock(client, f"{prefix}:u-redispy", TTL)

    async def raw(i: int) -> None:
        await client.evalsha(floor_sha, 1, floor_key)

    async def ours(i: int) -> None:
        lease = await ours_lock.acquire()
        await lease.release()

    async def ours_with(i: int) -> None:
        async with arl.lock(f"{prefix}:u-hold", ttl=TTL, backend=backend):
            pass

    async def redispy(i: int) -> None:
        await redispy_release(await redispy_acquire())

    def sync_raw() -> None:
        sync_client.evalsha(floor_sha, 1, floor_key)

    prl = (
        None
        if redis_lock is None
        else redis_lock.Lock(sync_client, f"{prefix}:u-prl", expire=int(TTL))
    )

    def sync_prl() -> None:
        assert prl is not None
        prl.acquire()
        prl.release()

    cases = {"raw": raw, "ours": ours, "ours_with": ours_with, "redispy": redispy}
    await h.interleave(cases, 20, 20)  # warm-up: connections, scripts
    reps = h.Reps()
    for rep in range(h.REPS):
        h.progress(f"uncontended, repetition {rep + 1}/{h.REPS}")
        got = await h.interleave(cases, UNC_N, UNC_BLOCK, rep, lab.meter)
        if prl is not None:
            sync = {"sync raw": sync_raw, "prl": sync_prl}
            got |= h.interleave_blocking(sync, UNC_N, UNC_BLOCK, rep, lab.meter)
        reps.append(got)
    rows = [
        [label, reps.latency(name), reps.speed(floor, name), reps.server(name)]
        for label, name, floor in (
            ("raw EVALSHA, redis.asyncio (the floor)", "raw", "raw"),
            ("aioratelimit `Lock.acquire` + `Lease.release`", "ours", "raw"),
            ("aioratelimit `async with arl.lock()` (auto_renew)", "ours_with", "raw"),
            ("redis-py `redis.asyncio.lock.Lock`", "redispy", "raw"),
            ("raw EVALSHA, redis.Redis (sync floor)", "sync raw", "sync raw"),
            ("python-redis-lock `Lock` (sync)", "prl", "sync raw"),
        )
        if name in reps
    ]
    h.print_table(
        "Uncontended acquire + release",
        ["condition", "µs per acquire + release (min-max)", "÷ raw EVALSHA (time)",
         "server CPU µs"],
        rows,
    )  # fmt: skip


async def handoff(
    lab: h.Lab, client: aredis.Redis, sync_client: redis.Redis, backend: arl.Backend
) -> None:
    found: dict[str, list[tuple[float, float]]] = {"ours": [], "redispy": [], "prl": []}
    for rep in range(h.REPS):
        h.progress(f"hand-off, repetition {rep + 1}/{h.REPS}")
        name = f"{lab.prefix}:h{rep}"
        xs = await rounds_async(partial(h.our_lock, backend, name + "o", TTL), CONTENDERS, ROUNDS)
        found["ours"].append((statistics.median(xs), percentile(xs, 0.99)))
        pair = partial(h.redispy_lock, client, name + "r", TTL)
        xs = await rounds_async(pair, CONTENDERS, POLL_ROUNDS)
        found["redispy"].append((statistics.median(xs), percentile(xs, 0.99)))
        if redis_lock is not None:
            xs = await asyncio.to_thread(
                rounds_threads, sync_client, name + "p", CONTENDERS, ROUNDS
            )
            found["prl"].append((statistics.median(xs), percentile(xs, 0.99)))
    rows = [
        [
            label,
            h.with_spread([m * 1e3 for m, _ in found[name]], 2),
            h.with_spread([p * 1e3 for _, p in found[name]], 2),
            str(rounds * (CONTENDERS - 1)),
        ]
        for label, name, rounds in (
            ("aioratelimit (pub/sub wake-up)", "ours", ROUNDS),
            ("redis-py asyncio Lock (polls every 0.1 s)", "redispy", POLL_ROUNDS),
            ("python-redis-lock (BLPOP, a connection per waiter)", "prl", ROUNDS),
        )
        if found[name]
    ]
    h.print_table(
        f"Hand-off latency, {CONTENDERS} contenders",
        ["condition", "median ms (range over reps)", "p99 ms (range)", "samples per rep"],
        rows,
    )


async def commands(
    lab: h.Lab, client: aredis.Redis, sync_client: redis.Redis, backend: arl.Backend
) -> None:
    prefix = lab.prefix
    libraries: list[tuple[str, str, Callable[[str, int, int], Any]]] = [
        ("aioratelimit", "ours", lambda name, n, rounds: rounds_async(
            partial(h.our_lock, backend, name, TTL), n, rounds)),
        ("redis-py asyncio Lock", "redis-py", lambda name, n, rounds: rounds_async(
            partial(h.redispy_lock, client, name, TTL), n, rounds)),
    ]  # fmt: skip
    if redis_lock is not None:
        libraries.append(("python-redis-lock", "python-redis-lock", lambda name, n, rounds: (
            asyncio.to_thread(rounds_threads, sync_client, name, n, rounds))))  # fmt: skip
    rows = []
    for waiters in WAITERS:
        h.progress(f"commands per acquisition, {waiters} waiters")
        # One round unmeasured first, so the pools hold enough connections: their handshakes
        # (HELLO, CLIENT SETINFO) are not commands per acquisition.
        for _, key, rounds in libraries:
            await rounds(f"{prefix}:w{waiters}{key}", waiters, 1)
        results: dict[str, list[tuple[float, float, float]]] = {key: [] for _, key, _ in libraries}
        for rep in range(max(1, h.REPS // 2)):
            for _, key, rounds in libraries:
                before = await commandstats(client)
                await rounds(f"{prefix}:c{waiters}-{rep}{key}", waiters, CMD_ROUNDS)
                after = await commandstats(client)
                results[key].append(
                    per_acquisition(before, after, INNER[key], waiters * CMD_ROUNDS)
                )
        for label, key, _ in libraries:
            got = results[key]
            rows.append([
                str(waiters),
                label,
                h.fmt(h.median(s for s, _, _ in got), 2),
                h.fmt(h.median(s - echo for s, echo, _ in got), 2),
                h.fmt(h.median(e for _, _, e in got), 2),
            ])  # fmt: skip
    h.print_table(
        "Redis commands per acquisition under contention",
        ["waiters", "library", "sent by clients", "sent, without the wire's ECHO tags",
         "executed (incl. inside scripts)"],
        rows,
    )  # fmt: skip


async def main(lab: h.Lab) -> None:
    # The socket options of Backend.from_url's pool, so the floor, redis-py and ours send
    # alike (no socket timeout on Python 3.11+, where our store bounds each call itself:
    # with one, redis.asyncio wraps each send in asyncio.wait_for, a task per command before
    # Python 3.12); and room for 200 waiters of redis-py (a connection each while polling)
    # and of python-redis-lock (one blocked in BLPOP each).
    options: dict[str, Any] = {
        "socket_timeout": None,
        "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT,
        "max_connections": 1000,
    }
    client = h.raw_client(lab.url, **options)
    sync_client = redis.Redis.from_url(lab.url, **options)
    backend = h.our_backend(lab.url, lab.prefix)
    try:
        await uncontended(lab, client, sync_client, backend)
        await handoff(lab, client, sync_client, backend)
        await commands(lab, client, sync_client, backend)
    finally:
        await backend.aclose()
        await client.aclose()
        sync_client.close()
    notes = [
        f"Uncontended: {UNC_N} acquire + release per condition per repetition, interleaved"
        f" in blocks of {UNC_BLOCK}; each ratio is the median over the {h.REPS} repetitions"
        " of the per-repetition ratio of times to the floor of the same client (two round"
        " trips cost 2.00). Server CPU: `INFO CPU` deltas around each block, per acquire +"
        " release.",
        "Hand-off: a sample is the time from the start of `release` to the return of the next"
        " holder's `acquire`; each contender takes the lock once per round, so it always goes"
        " to a waiting contender. Medians and p99 are per repetition, then summarised.",
        "Commands: `INFO commandstats` deltas around each run; 'sent' excludes the commands"
        " that only run inside that library's Lua scripts. Ours sends an EVALSHA per attempt"
        " and per release, plus SUBSCRIBE/UNSUBSCRIBE on the shared subscriber connection"
        " when a name's first local waiter arrives and its last one leaves; its wire ends"
        " every write with an ECHO that checks no reply was lost (in the same write: no"
        " round trip of its own; one per command when waiters take turns).",
    ]
    if redis_lock is None:
        notes.append(
            "python-redis-lock is not installed (`pip install python-redis-lock`): its rows"
            " are left out."
        )
    h.print_notes(*notes)


if __name__ == "__main__":
    h.run(
        main,
        "Locks: ours, redis-py's and python-redis-lock",
        ["aioratelimit", "redis", "hiredis", "python-redis-lock"],
    )
