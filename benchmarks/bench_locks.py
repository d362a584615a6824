"""Locks, side by side in one run: the raw floor, ours, redis-py's asyncio Lock and
python-redis-lock.

Run (the script starts no server; it writes keys only under a prefix unique to the run, plus
python-redis-lock's own ``lock:<name>`` keys, and deletes them at the end)::

    REDIS_URL=redis://127.0.0.1:6391/0 .venv/bin/python benchmarks/bench_locks.py

Three measurements:

1. Uncontended acquire + release, sequentially on one key, interleaved in blocks, each as a
   ratio to one raw EVALSHA round trip (a one-command script) *with the same client* (every
   client here has the socket options of ``Backend.from_url``'s pool):
   ours (``Lock.acquire`` + ``Lease.release``, and ``async with arl.lock(...)`` with its
   renewal timer) and redis-py's ``redis.asyncio.lock.Lock`` against an asyncio
   ``redis.asyncio`` EVALSHA; python-redis-lock (synchronous) against a ``redis.Redis`` EVALSHA.
2. Hand-off latency with 8 contenders: in rounds, each contender takes the lock once per
   round (so the lock always passes to a contender that is already waiting, never back to
   the one that just released it); a sample is the time from the start of ``release`` to the
   return of the next holder's ``acquire``. Ours and redis-py run as asyncio tasks on one
   client; python-redis-lock as threads (it blocks in BLPOP, one connection per waiter).
3. Redis commands per acquisition under contention, 8 to 200 waiters, in the same rounds,
   from ``INFO commandstats`` deltas: the commands the clients *sent* (everything except
   the commands that only run inside that library's Lua scripts), and every command the
   server executed (scripts' inner commands included). The server must be otherwise idle.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import redis
import redis.asyncio as aredis
from _common import (
    REPS,
    SCALE,
    bench_prefix,
    delete_prefix,
    fmt,
    interleave,
    interleave_blocking,
    median,
    paired_ratio,
    print_header,
    print_notes,
    print_table,
    progress,
    ratio,
    redis_url,
    scaled,
    with_spread,
)
from redis.asyncio.lock import Lock as RedisPyLock

import aioratelimit as arl
from aioratelimit._stores.base import DEFAULT_CONNECT_TIMEOUT

try:
    import redis_lock
except ImportError:  # optional: pip install python-redis-lock
    redis_lock = None

#: The floor: one EVALSHA round trip of a one-command script.
FLOOR_LUA = "return redis.call('GET', KEYS[1])"
TTL = 30.0

UNC_N = scaled(2000, 20)  # sequential acquire+release per condition per repetition
UNC_BLOCK = min(100, UNC_N)
CONTENDERS = 8
ROUNDS = scaled(40, 2)  # hand-off rounds per repetition (7 samples each)
POLL_ROUNDS = scaled(8, 1)  # redis-py polls every 0.1 s: fewer rounds keep the run short
WAITERS = (8, 32, 200)
CMD_ROUNDS = scaled(3, 1)  # rounds per waiter count (each waiter acquires once a round)

#: Commands that run only inside each library's Lua scripts (the rest were sent by clients).
INNER = {
    "ours": {"time", "get", "set", "pexpire", "pttl", "publish", "spublish"},
    "redis-py": {"get", "del"},
    "python-redis-lock": {"get", "del", "lpush", "pexpire", "ttl", "expire"},
}
#: Our own measuring commands.
IGNORED = {"info", "config|resetstat"}


# -- one contender's acquire/release, per library -----------------------------------------

AsyncPair = tuple[Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[Any]]]


def ours_pair(backend: arl.Backend, name: str) -> AsyncPair:
    lk = arl.Lock(name, ttl=TTL, backend=backend)

    async def release(lease: arl.Lease) -> None:
        await lease.release()

    return lk.acquire, release


def redispy_pair(client: aredis.Redis, name: str) -> AsyncPair:
    lk = RedisPyLock(client, name, timeout=TTL)  # polls every 0.1 s (its default)

    async def acquire() -> None:
        await lk.acquire()

    async def release(_: Any) -> None:
        await lk.release()

    return acquire, release


# -- rounds of contention -----------------------------------------------------------------


async def rounds_async(make: Callable[[], AsyncPair], contenders: int, rounds: int) -> list[float]:
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


async def main() -> None:
    url = redis_url()
    prefix = bench_prefix()
    # The socket options of Backend.from_url's pool, so the floor, redis-py and ours send
    # alike (no socket timeout on Python 3.11+, where our store bounds each call itself:
    # with one, redis.asyncio wraps each send in asyncio.wait_for, a task per command before
    # Python 3.12); and room for 200 waiters of redis-py (a connection each while polling)
    # and of python-redis-lock (one blocked in BLPOP each).
    options: dict[str, Any] = {
        "socket_timeout": None,  # bounded by the store's deadline timer, as ours
        "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT,
        "max_connections": 1000,
    }
    client = aredis.Redis.from_url(url, **options)
    sync_client = redis.Redis.from_url(url, **options)
    backend = arl.Backend.from_url(url, prefix=prefix)
    try:
        server = await client.info("server")
        print_header(
            "Locks benchmark", server, ["aioratelimit", "redis", "hiredis", "python-redis-lock"]
        )
        await run(url, prefix, client, sync_client, backend)
    finally:
        await delete_prefix(client, prefix)
        await delete_prefix(client, f"lock:{prefix}")
        await delete_prefix(client, f"lock-signal:{prefix}")
        await backend.aclose()
        await client.aclose()
        sync_client.close()


async def run(
    url: str,
    prefix: str,
    client: aredis.Redis,
    sync_client: redis.Redis,
    backend: arl.Backend,
) -> None:
    floor_sha = await client.script_load(FLOOR_LUA)
    sync_client.script_load(FLOOR_LUA)
    floor_key = f"{prefix}:floor"

    # 1. uncontended ---------------------------------------------------------------------
    ours_lock = arl.Lock(f"{prefix}:u-ours", ttl=TTL, backend=backend)
    rp_lock = RedisPyLock(client, f"{prefix}:u-redispy", timeout=TTL)
    hold_name = f"{prefix}:u-hold"

    async def raw(i: int) -> None:
        await client.evalsha(floor_sha, 1, floor_key)

    async def ours(i: int) -> None:
        lease = await ours_lock.acquire()
        await lease.release()

    async def ours_with(i: int) -> None:
        async with arl.lock(hold_name, ttl=TTL, backend=backend):
            pass

    async def redispy(i: int) -> None:
        await rp_lock.acquire()
        await rp_lock.release()

    cases = {"raw": raw, "ours": ours, "ours_with": ours_with, "redispy": redispy}
    for op in cases.values():  # warm up: connections, scripts
        for i in range(20):
            await op(i)
    unc: dict[str, list[float]] = {k: [] for k in cases}
    prl: dict[str, list[float]] = {"raw": [], "prl": []}
    for rep in range(REPS):
        progress(f"uncontended, repetition {rep + 1}/{REPS}")
        for name, secs in (await interleave(cases, UNC_N, UNC_BLOCK, rotate=rep)).items():
            unc[name].append(secs * 1e6)
        if redis_lock is not None:
            for name, secs in sync_interleave(sync_client, prefix, floor_sha, rep).items():
                prl[name].append(secs * 1e6)

    rows = []
    for label, name, floor in (
        ("raw EVALSHA, redis.asyncio (the floor)", "raw", "raw"),
        ("aioratelimit `Lock.acquire` + `Lease.release`", "ours", "raw"),
        ("aioratelimit `async with arl.lock()` (auto_renew)", "ours_with", "raw"),
        ("redis-py `redis.asyncio.lock.Lock`", "redispy", "raw"),
    ):
        rows.append([label, with_spread(unc[name]), ratio(paired_ratio(unc[name], unc[floor]))])
    if redis_lock is not None:
        rows.append(["raw EVALSHA, redis.Redis (sync floor)", with_spread(prl["raw"]), "1.00"])
        rows.append(
            [
                "python-redis-lock `Lock` (sync)",
                with_spread(prl["prl"]),
                ratio(paired_ratio(prl["prl"], prl["raw"])),
            ]
        )
    print_table(
        "Uncontended acquire + release",
        ["condition", "µs per acquire+release, median (range)", "÷ raw EVALSHA"],
        rows,
    )

    # 2. hand-off latency, 8 contenders ----------------------------------------------------
    handoff: dict[str, list[tuple[float, float]]] = {"ours": [], "redispy": [], "prl": []}
    for rep in range(REPS):
        progress(f"hand-off, repetition {rep + 1}/{REPS}")
        name = f"{prefix}:h{rep}"
        xs = await rounds_async(partial(ours_pair, backend, name + "o"), CONTENDERS, ROUNDS)
        handoff["ours"].append((statistics.median(xs), percentile(xs, 0.99)))
        xs = await rounds_async(partial(redispy_pair, client, name + "r"), CONTENDERS, POLL_ROUNDS)
        handoff["redispy"].append((statistics.median(xs), percentile(xs, 0.99)))
        if redis_lock is not None:
            xs = await asyncio.to_thread(
                rounds_threads, sync_client, name + "p", CONTENDERS, ROUNDS
            )
            handoff["prl"].append((statistics.median(xs), percentile(xs, 0.99)))
    rows = []
    for label, name, samples in (
        ("aioratelimit (pub/sub wake-up)", "ours", ROUNDS * (CONTENDERS - 1)),
        ("redis-py asyncio Lock (polls every 0.1 s)", "redispy", POLL_ROUNDS * (CONTENDERS - 1)),
        ("python-redis-lock (BLPOP, a connection per waiter)", "prl", ROUNDS * (CONTENDERS - 1)),
    ):
        got = handoff[name]
        if not got:
            continue
        rows.append(
            [
                label,
                with_spread([m * 1e3 for m, _ in got], 2),
                with_spread([p * 1e3 for _, p in got], 2),
                str(samples),
            ]
        )
    print_table(
        f"Hand-off latency, {CONTENDERS} contenders",
        ["condition", "median ms (range over reps)", "p99 ms (range)", "samples per rep"],
        rows,
    )

    # 3. commands per acquisition ----------------------------------------------------------
    cmd_rows = []
    for waiters in WAITERS:
        progress(f"commands per acquisition, {waiters} waiters")
        results: dict[str, list[tuple[float, float, float]]] = {
            "ours": [],
            "redispy": [],
            "prl": [],
        }
        # One round unmeasured first, so the pools hold enough connections: their handshakes
        # (HELLO, CLIENT SETINFO) are not commands per acquisition.
        await rounds_async(partial(ours_pair, backend, f"{prefix}:w{waiters}o"), waiters, 1)
        await rounds_async(partial(redispy_pair, client, f"{prefix}:w{waiters}r"), waiters, 1)
        if redis_lock is not None:
            await asyncio.to_thread(
                rounds_threads, sync_client, f"{prefix}:w{waiters}p", waiters, 1
            )
        for rep in range(max(1, REPS // 2)):
            name = f"{prefix}:c{waiters}-{rep}"
            acquisitions = waiters * CMD_ROUNDS
            before = await commandstats(client)
            await rounds_async(partial(ours_pair, backend, name + "o"), waiters, CMD_ROUNDS)
            results["ours"].append(
                per_acquisition(before, await commandstats(client), INNER["ours"], acquisitions)
            )
            before = await commandstats(client)
            await rounds_async(partial(redispy_pair, client, name + "r"), waiters, CMD_ROUNDS)
            results["redispy"].append(
                per_acquisition(before, await commandstats(client), INNER["redis-py"], acquisitions)
            )
            if redis_lock is not None:
                before = await commandstats(client)
                await asyncio.to_thread(
                    rounds_threads, sync_client, name + "p", waiters, CMD_ROUNDS
                )
                results["prl"].append(
                    per_acquisition(
                        before, await commandstats(client), INNER["python-redis-lock"], acquisitions
                    )
                )
        for label, name in (
            ("aioratelimit", "ours"),
            ("redis-py asyncio Lock", "redispy"),
            ("python-redis-lock", "prl"),
        ):
            if results[name]:
                cmd_rows.append(
                    [
                        str(waiters),
                        label,
                        fmt(median([s for s, _, _ in results[name]]), 2),
                        fmt(median([s - echo for s, echo, _ in results[name]]), 2),
                        fmt(median([e for _, _, e in results[name]]), 2),
                    ]
                )
    print_table(
        "Redis commands per acquisition under contention",
        [
            "waiters",
            "library",
            "sent by clients",
            "sent, without the wire's ECHO tags",
            "executed (incl. inside scripts)",
        ],
        cmd_rows,
    )

    notes = [
        f"Uncontended: {UNC_N} acquire+release per condition per repetition, interleaved in "
        f"blocks of {UNC_BLOCK}; each ratio is the median over the {REPS} repetitions of the "
        "per-repetition ratio to the floor of the same client.",
        "Hand-off: a sample is the time from the start of `release` to the return of the next "
        "holder's `acquire`; each contender takes the lock once per round, so it always goes "
        "to a waiting contender. Medians and p99 are per repetition, then summarised.",
        "Commands: `INFO commandstats` deltas around each run; 'sent' excludes the commands "
        "that only run inside that library's Lua scripts. Ours sends an EVALSHA per attempt "
        "and per release, plus SUBSCRIBE/UNSUBSCRIBE on the shared subscriber connection when "
        "a name's first local waiter arrives and its last one leaves; and its wire ends"
        " every write with an ECHO that checks no reply was lost (in the same write: no"
        " round trip of its own; one per write, so one per command when waiters take turns).",
    ]
    if redis_lock is None:
        notes.append(
            "python-redis-lock is not installed (`pip install python-redis-lock`): its rows "
            "are left out."
        )
    if SCALE < 1:
        notes.append(f"SCALE={SCALE}: fewer operations than a real run.")
    print_notes(*notes)


def sync_interleave(client: redis.Redis, prefix: str, floor_sha: str, rep: int) -> dict[str, float]:
    """python-redis-lock against a synchronous EVALSHA, interleaved in blocks (seconds/op)."""
    assert redis_lock is not None
    lk = redis_lock.Lock(client, f"{prefix}:u-prl", expire=int(TTL))
    floor_key = f"{prefix}:floor"

    def raw() -> None:
        client.evalsha(floor_sha, 1, floor_key)

    def prl() -> None:
        lk.acquire()
        lk.release()

    return interleave_blocking({"raw": raw, "prl": prl}, UNC_N, UNC_BLOCK, rep)


if __name__ == "__main__":
    asyncio.run(main())
