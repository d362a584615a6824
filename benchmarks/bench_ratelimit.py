"""Rate limiters, side by side in one run: the raw floor, ours, and the ``limits`` library.

Run (the script starts no server; it writes keys only under a prefix unique to the run and
deletes them at the end)::

    REDIS_URL=redis://127.0.0.1:6391/0 .venv/bin/python benchmarks/bench_ratelimit.py

Conditions, all on the default asyncio event loop, each decision on one key:

- raw: ``redis.asyncio`` EVALSHA of the minimal fixed-window script (INCR; PEXPIRE when the
  count is 1; return the count and PTTL), the floor any Lua limiter pays;
- ours: ``FixedWindow``, ``SlidingWindow`` (10 buckets) and ``TokenBucket`` ``hit`` on
  ``Backend.from_url(REDIS_URL)`` with its default pool;
- limits: ``FixedWindow``, ``MovingWindow`` and ``SlidingWindowCounter`` ``hit`` on its
  async ``RedisStorage``, with its default coredis client and with ``implementation="redispy"``;
- memory://: ours on ``Backend.from_url("memory://")`` against limits' async ``MemoryStorage``.

Every key gets ``HITS_PER_KEY`` hits under a limit of 100 per minute, so every hit is admitted
and one in ten creates its key. Sequential runs are interleaved in blocks; the 64-task runs
are interleaved chunk by chunk. Then ``MEMORY USAGE key SAMPLES 0`` of one key of each layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

import redis.asyncio as aredis
from _common import (
    FLOOR_LUA,
    REPS,
    Op,
    bench_prefix,
    column,
    delete_prefix,
    fan_out,
    fmt,
    interleave,
    median,
    paired_ratio,
    print_header,
    print_notes,
    print_smoke_note,
    print_table,
    progress,
    ratio,
    redis_url,
    scaled,
    with_spread,
)
from redis.asyncio.connection import DefaultParser

import aioratelimit as arl
from aioratelimit._scripts import script
from aioratelimit._stores.base import DEFAULT_MAX_CONNECTIONS

# limits emits DeprecationWarnings from its own dependencies; they are not ours to fix.
warnings.filterwarnings("ignore", category=DeprecationWarning)

#: The floor's script, for our backend's run (our client path without our scripts).
FLOOR_SCRIPT = script("bench_floor", FLOOR_LUA)
LIMIT = 100
WINDOW_MS = 60_000
RATE = f"{LIMIT}/minute"
HITS_PER_KEY = 10

SEQ_N = scaled(3000, 20)  # sequential hits per condition per repetition
SEQ_BLOCK = min(150, SEQ_N)
TASKS = 64
PER_TASK = scaled(16, 2)  # one chunk = TASKS * PER_TASK hits
CHUNKS = scaled(10, 2)  # chunks per condition per repetition
MEM_N = scaled(20000, 100)  # in-process hits per condition per repetition
MEM_BLOCK = min(1000, MEM_N)

OURS = ("FixedWindow", "SlidingWindow", "TokenBucket")
#: One more row: FixedWindow on a backend with the default pool size (fewer connections than
#: tasks, so some of the 64 tasks wait for a connection).
DEFAULT_POOL = "FixedWindow, default pool"
#: Rows that split our cost: our limiter's Lua script sent by the raw client, and the raw
#: floor's script sent through our backend (our client path without our scripts).
SCRIPT_ROW = "{} script on the raw client"
FLOOR_OURS = "floor script on our backend"
STRATEGIES = ("FixedWindow", "MovingWindow", "SlidingWindowCounter")
IMPLS: tuple[Literal["coredis", "redispy"], ...] = ("coredis", "redispy")
#: The limits strategy that does the same job as each of ours (TokenBucket has none).
PEERS: dict[str, tuple[str, ...]] = {
    "FixedWindow": ("FixedWindow",),
    "SlidingWindow": ("SlidingWindowCounter", "MovingWindow"),
    "TokenBucket": (),
}


#: The limits strategy that implements the same algorithm as ours (the memory:// target).
#: MovingWindow is an exact log of timestamps, not sub-window counters: compared, not a target.
SAME_ALGORITHM: dict[str, tuple[str, ...]] = {
    "FixedWindow": ("FixedWindow",),
    "SlidingWindow": ("SlidingWindowCounter",),
    "TokenBucket": (),
}


def limits_uri(url: str) -> str:
    """The URL in the form limits' async storage expects."""
    if url.startswith("unix://"):
        return "async+redis+unix://" + url[len("unix://") :]
    return "async+" + url


def our_limiter(name: str, backend: arl.Backend, rate: str = RATE) -> Any:
    if name == "FixedWindow":
        return arl.FixedWindow(rate, backend=backend)
    if name == "SlidingWindow":
        return arl.SlidingWindow(rate, buckets=10, backend=backend)
    return arl.TokenBucket(rate, backend=backend)


def limits_strategy(name: str, storage: Any) -> Any:
    import limits.aio.strategies as st

    return getattr(st, f"{name}RateLimiter")(storage)


async def close_limits(storage: Any) -> None:
    """Close the client a limits storage opened (its API has no close of its own)."""
    client = storage.bridge.storage
    if hasattr(client, "aclose"):
        await client.aclose()
    else:  # coredis
        client.connection_pool.disconnect()


class Hitters:
    """Builds one timed operation per condition; each counts the hits it saw admitted."""

    def __init__(self, prefix: str) -> None:
        from limits import RateLimitItemPerMinute

        self.prefix = prefix
        self.item = RateLimitItemPerMinute(LIMIT)
        self.admitted: Counter[str] = Counter()

    def raw(self, name: str, client: Any, sha: str, tag: str, total: int) -> Op:
        keys, admitted, head = (
            max(1, total // HITS_PER_KEY),
            self.admitted,
            f"{self.prefix}:raw:{tag}",
        )

        async def op(i: int) -> None:
            reply = await client.evalsha(sha, 1, f"{head}{i % keys}", WINDOW_MS)
            admitted[name] += reply[0] <= LIMIT

        return op

    def our_script(self, name: str, client: Any, limiter: Any, tag: str, total: int) -> Op:
        """EVALSHA of our limiter's own script, with the arguments it sends, on the raw
        client: the server's share of our cost, without our Python layers."""
        keys, admitted, head = (
            max(1, total // HITS_PER_KEY),
            self.admitted,
            f"{self.prefix}:script:{tag}",
        )
        sha, argv = limiter._script.sha, (1, 1, *limiter._args)

        async def op(i: int) -> None:
            # The counter only: a limiter without blockable=True sends no block key.
            reply = await client.evalsha(sha, 1, f"{head}{i % keys}", *argv)
            admitted[name] += reply[0]

        return op

    def floor_on(self, name: str, backend: arl.Backend, tag: str, total: int) -> Op:
        """The raw floor's script run by ``backend._run``: our client path, not our scripts."""
        keys, admitted, head = (
            max(1, total // HITS_PER_KEY),
            self.admitted,
            f"{self.prefix}:floor:{tag}",
        )
        run, script, argv = backend._run, FLOOR_SCRIPT, (WINDOW_MS,)

        async def op(i: int) -> None:
            reply = await run(script, [f"{head}{i % keys}"], argv)
            admitted[name] += reply[0] <= LIMIT

        return op

    def ours(self, name: str, limiter: Any, tag: str, total: int) -> Op:
        keys, admitted, hit = max(1, total // HITS_PER_KEY), self.admitted, limiter.hit

        async def op(i: int) -> None:
            decision = await hit(f"{tag}{i % keys}")  # awaited before the += reads the count
            admitted[name] += decision.allowed

        return op

    def limits(self, name: str, strategy: Any, tag: str, total: int) -> Op:
        keys, admitted, hit, item = (
            max(1, total // HITS_PER_KEY), self.admitted, strategy.hit, self.item
        )  # fmt: skip

        async def op(i: int) -> None:
            ok = await hit(item, tag, str(i % keys))
            admitted[name] += ok

        return op


# -- Redis ---------------------------------------------------------------------------------


async def redis_reps(url: str, prefix: str) -> list[dict[str, float]]:
    """Every repetition's figures: ``<condition>|seq`` in s/hit, ``<condition>|c64`` hits/s."""
    from limits.aio.storage import RedisStorage

    raw = aredis.Redis.from_url(url)
    # As many connections as tasks, like the raw client and limits' redis-py pool, which
    # open one per concurrent task; the default-pool row shows what a smaller pool costs.
    backend = arl.Backend.from_url(url, prefix=prefix, max_connections=TASKS)
    default_backend = arl.Backend.from_url(url, prefix=prefix)
    storages = {
        impl: RedisStorage(limits_uri(url), implementation=impl, key_prefix=f"{prefix}:L")
        for impl in IMPLS
    }
    try:
        sha = await raw.script_load(FLOOR_LUA)
        ours = {name: our_limiter(name, backend) for name in OURS}
        ours[DEFAULT_POOL] = our_limiter("FixedWindow", default_backend)
        for limiter in ours.values():
            await raw.script_load(limiter._script.source)
        strategies = {
            f"limits {impl} {s}": limits_strategy(s, storages[impl])
            for impl in IMPLS
            for s in STRATEGIES
        }
        hitters = Hitters(prefix)

        def ops(tag: str, total: int) -> dict[str, Op]:
            # Every condition gets its own keys: limits' key names do not say the strategy.
            cases = {"raw": hitters.raw("raw", raw, sha, tag, total)}
            cases[FLOOR_OURS] = hitters.floor_on(FLOOR_OURS, backend, tag, total)
            for name, limiter in ours.items():
                cases[name] = hitters.ours(name, limiter, f"{tag}{name}:", total)
            for name in OURS:
                script = SCRIPT_ROW.format(name)
                cases[script] = hitters.our_script(script, raw, ours[name], f"{tag}{name}:", total)
            for name, strategy in strategies.items():
                cases[name] = hitters.limits(name, strategy, f"{tag}{name}", total)
            return cases

        # Warm-up: loads every script and opens the pooled connections of each client.
        warm = ops("w", 1000)
        await interleave(warm, 20, 20)
        await interleave({k: fan_out(op, TASKS, 2) for k, op in warm.items()}, 1, 1)

        per_chunk = TASKS * PER_TASK
        reps = []
        for rep in range(REPS):
            hitters.admitted.clear()
            seq = await interleave(ops(f"s{rep}", SEQ_N), SEQ_N, SEQ_BLOCK, rep)
            chunks = {
                k: fan_out(op, TASKS, PER_TASK)
                for k, op in ops(f"c{rep}", CHUNKS * per_chunk).items()
            }
            conc = await interleave(chunks, CHUNKS, 1, rep)
            # Every hit must have been admitted, or the conditions did not do the same work.
            expected = SEQ_N + CHUNKS * per_chunk
            wrong = {k: v for k, v in hitters.admitted.items() if v != expected}
            if wrong or len(hitters.admitted) != len(seq):
                raise SystemExit(f"not every hit was admitted ({expected} expected): {wrong}")
            figures = {f"{k}|seq": v for k, v in seq.items()}
            figures.update({f"{k}|c64": per_chunk / v for k, v in conc.items()})
            reps.append(figures)
            progress(f"redis rep {rep + 1}/{REPS} done")
        return reps
    finally:
        await backend.aclose()
        await default_backend.aclose()
        for storage in storages.values():
            await close_limits(storage)
        await raw.aclose()


# -- memory:// -----------------------------------------------------------------------------


async def memory_reps() -> list[dict[str, float]]:
    """Every repetition's seconds per hit, in process: ours on memory:// and limits'."""
    from limits.aio.storage import MemoryStorage

    reps = []
    for rep in range(REPS):
        backend = arl.Backend.from_url("memory://")
        storage = MemoryStorage()
        try:
            hitters = Hitters("mem")
            cases = {
                f"{name} memory://": hitters.ours(
                    f"{name} memory://", our_limiter(name, backend), f"m{rep}", MEM_N
                )
                for name in OURS
            }
            for s in STRATEGIES:
                cases[f"limits {s} memory"] = hitters.limits(
                    f"limits {s} memory", limits_strategy(s, storage), f"m{rep}{s}", MEM_N
                )
            await interleave(cases, min(200, MEM_N), min(200, MEM_N))  # warm-up
            reps.append(await interleave(cases, MEM_N, MEM_BLOCK, rep))
            if any(v != MEM_N + min(200, MEM_N) for v in hitters.admitted.values()):
                raise SystemExit(f"not every in-process hit was admitted: {hitters.admitted}")
        finally:
            await backend.aclose()
            await storage.reset()
            if storage.timer is not None and not storage.timer.done():
                storage.timer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await storage.timer
        progress(f"memory rep {rep + 1}/{REPS} done")
    return reps


# -- MEMORY USAGE --------------------------------------------------------------------------


async def memory_usage(url: str, prefix: str) -> list[list[str]]:
    """One key of each layout, written by the library itself; MEMORY USAGE SAMPLES 0."""
    from limits import RateLimitItemPerMinute, RateLimitItemPerSecond
    from limits.aio.storage import RedisStorage

    r = aredis.Redis.from_url(url, decode_responses=True)
    backend = arl.Backend.from_url(url, prefix=prefix)
    storage = RedisStorage(limits_uri(url), implementation="redispy", key_prefix=f"{prefix}:L")
    rows: list[list[str]] = []

    async def row(layout: str, hits: str, key: str, target: int | None = None) -> int:
        usage = int(await r.memory_usage(key, samples=0) or 0)
        kind = str(await r.type(key))
        size = {"hash": r.hlen, "list": r.llen}.get(kind)
        enc = str(await r.object("encoding", key))
        shape = f"{kind}, {enc}" + (f", {await size(key)} entries" if size else "")
        met = "-" if target is None else ("yes" if usage <= target else "**no**")
        rows.append([layout, hits, str(usage), shape, str(len(key)),
                     "-" if target is None else f"≤ {target}", met])  # fmt: skip
        return usage

    try:
        user = "user:00000001"
        fw, tb = our_limiter("FixedWindow", backend), our_limiter("TokenBucket", backend)
        for _ in range(37):  # a counter in the middle of its window
            await fw.hit(user)
            await tb.hit(user)

        # Hits every 50 ms for 1.3 s land in every bucket of 100 ms, so they fill every slot
        # of the 10-bucket ring (11 slots, the oldest counted in full, plus the field naming
        # the newest bucket): the largest the key gets.
        sw = arl.SlidingWindow("100/1s", buckets=10, backend=backend)
        sw_hits = 0

        async def spread_sliding() -> None:
            nonlocal sw_hits
            loop = asyncio.get_running_loop()
            end = loop.time() + 1.3
            while loop.time() < end:
                sw_hits += (await sw.hit(user)).allowed
                await asyncio.sleep(0.05)

        # limits' sliding window counter keeps two keys once a window has rolled over.
        swc, item_s = limits_strategy("SlidingWindowCounter", storage), RateLimitItemPerSecond(100)

        async def roll_limits() -> None:
            for _ in range(37):
                await swc.hit(item_s, "swc", user)
            await asyncio.sleep(1.05)
            await swc.hit(item_s, "swc", user)

        await asyncio.gather(spread_sliding(), roll_limits())
        sw_key = sw._keys(backend, user)[0]
        await row("ours FixedWindow (string counter)", "37", fw._keys(backend, user)[0], 100)
        await row("ours SlidingWindow, 10 buckets, every slot used", f"{sw_hits} over 1.3 s",
                  sw_key, 200)  # fmt: skip
        await row("ours TokenBucket (string TAT)", "37", tb._keys(backend, user)[0])

        item = RateLimitItemPerMinute(LIMIT)
        fixed, moving = (limits_strategy(s, storage) for s in ("FixedWindow", "MovingWindow"))
        for _ in range(37):
            await fixed.hit(item, "fw", user)
        for _ in range(LIMIT):
            await moving.hit(item, "mw", user)
        b = storage.bridge
        await row("limits FixedWindow", "37", b.prefixed_key(item.key_for("fw", user)))
        await row(
            "limits MovingWindow (list)", str(LIMIT), b.prefixed_key(item.key_for("mw", user))
        )
        base = item_s.key_for("swc", user)
        cur = await row("limits SlidingWindowCounter, current key", "1",
                        b.prefixed_key(storage._current_window_key(base)))  # fmt: skip
        prev = await row("limits SlidingWindowCounter, previous key", "37",
                         b.prefixed_key(storage._previous_window_key(base)))  # fmt: skip
        rows.append(["limits SlidingWindowCounter, both keys", "38", str(cur + prev),
                     "2 strings", "-", "-", "-"])  # fmt: skip
        return rows
    finally:
        await backend.aclose()
        await close_limits(storage)
        await r.aclose()


# -- report --------------------------------------------------------------------------------


def report(
    redis_figs: Sequence[dict[str, float]],
    mem_figs: Sequence[dict[str, float]],
    usage_rows: list[list[str]],
) -> None:
    us = 1e6
    scripts = [SCRIPT_ROW.format(name) for name in OURS]
    limits = [f"limits {i} {s}" for i in IMPLS for s in STRATEGIES]
    names = ["raw", *OURS, DEFAULT_POOL, FLOOR_OURS, *scripts, *limits]
    raw_seq, raw_c64 = column(redis_figs, "raw|seq"), column(redis_figs, "raw|c64")
    rows = []
    for name in names:
        seq, c64 = column(redis_figs, f"{name}|seq"), column(redis_figs, f"{name}|c64")
        label = {"raw": "raw floor: redis.asyncio EVALSHA"}.get(name, name)
        if name in OURS:
            label = f"**ours {name}**"
        elif name == DEFAULT_POOL:
            label = f"ours {name} ({DEFAULT_MAX_CONNECTIONS} connections)"
        elif name in scripts:
            label = f"(ours' {name})"
        elif name == FLOOR_OURS:
            label = f"(the raw {name})"
        rows.append([
            label,
            with_spread([x * us for x in seq]),
            ratio(paired_ratio(raw_seq, seq)),
            with_spread(c64),
            ratio(paired_ratio(c64, raw_c64)),
        ])  # fmt: skip
    print_table(
        f"Redis: one decision per hit, medians of {REPS} repetitions (min-max)",
        ["decision", "sequential µs/hit", "seq speed ÷ raw", "64 tasks hits/s",
         "64-task speed ÷ raw"],
        rows,
    )  # fmt: skip

    rows = []
    floor_seq = column(redis_figs, f"{FLOOR_OURS}|seq")
    for name in OURS:
        seq, c64 = column(redis_figs, f"{name}|seq"), column(redis_figs, f"{name}|c64")
        lua_seq = column(redis_figs, f"{SCRIPT_ROW.format(name)}|seq")
        lua_c64 = column(redis_figs, f"{SCRIPT_ROW.format(name)}|c64")
        rows.append([
            f"ours {name}",
            fmt(median([(x - f) * us for x, f in zip(lua_seq, raw_seq, strict=True)])),
            fmt(median([(o - x) * us for o, x in zip(seq, lua_seq, strict=True)])),
            ratio(paired_ratio(raw_seq, lua_seq)),
            ratio(paired_ratio(lua_c64, raw_c64)),
            ratio(paired_ratio(c64, lua_c64)),
            ratio(paired_ratio(floor_seq, seq)),
        ])  # fmt: skip
    print_table(
        "Redis: where our time goes (our script on the raw client, and the floor's script on "
        "our backend, split the parts)",
        ["limiter", "script over floor, µs/hit", "ours over that script on the raw client, µs/hit",
         "script alone: seq speed ÷ raw", "script alone: 64-task speed ÷ raw",
         "ours ÷ script alone, 64 tasks", "ours ÷ floor script, both on our backend (seq)"],
        rows,
    )  # fmt: skip

    rows = []
    for ours, peers in PEERS.items():
        if not peers:
            rows.append([f"ours {ours}", "(limits has no token bucket)", "-", "-"])
        for peer in peers:
            for impl in IMPLS:
                p = f"limits {impl} {peer}"
                rows.append([
                    f"ours {ours}", p,
                    ratio(paired_ratio(column(redis_figs, f"{p}|seq"),
                                       column(redis_figs, f"{ours}|seq"))),
                    ratio(paired_ratio(column(redis_figs, f"{ours}|c64"),
                                       column(redis_figs, f"{p}|c64"))),
                ])  # fmt: skip
    print_table(
        "Redis: ours against limits (speed ratio, > 1 means ours is faster)",
        ["ours", "limits", "sequential", "64 tasks"],
        rows,
    )

    rows = []
    for name in [f"{n} memory://" for n in OURS] + [f"limits {s} memory" for s in STRATEGIES]:
        xs = column(mem_figs, name)
        rows.append([name, with_spread([x * us for x in xs], 2), fmt(median([1 / x for x in xs]))])
    print_table(
        f"In process: ours on memory:// and limits' async MemoryStorage, sequential, "
        f"medians of {REPS} repetitions",
        ["limiter", "µs/hit (min-max)", "hits/s"],
        rows,
    )
    mem_ratios: dict[str, float] = {}
    rows = []
    for ours, peers in PEERS.items():
        if not peers:
            rows.append([f"{ours} memory://", "(limits has no token bucket)", "-"])
        for peer in peers:
            r = paired_ratio(column(mem_figs, f"limits {peer} memory"),
                             column(mem_figs, f"{ours} memory://"))  # fmt: skip
            mem_ratios[f"{ours}/{peer}"] = r
            rows.append([f"{ours} memory://", f"limits {peer} memory", ratio(r)])
    print_table(
        "In process: ours against limits (speed ratio, ≥ 1 means ours is at least as fast)",
        ["ours", "limits", "speed ratio"],
        rows,
    )

    print_table(
        "Redis memory per key (`MEMORY USAGE key SAMPLES 0`, bytes)",
        ["layout", "hits", "bytes", "type, encoding", "key bytes", "target", "met"],
        usage_rows,
    )

    def target(what: str, value: float, goal: float, higher: bool = True) -> list[str]:
        ok = value >= goal if higher else value <= goal
        return [
            what,
            f"{'≥' if higher else '≤'} {goal:g}",
            f"{value:.3f}" if higher else f"{value:.0f}",  # a ratio, or bytes
            "yes" if ok else "**no**",
        ]

    rows = []
    for name in OURS:
        rows.append(target(f"{name} sequential speed ÷ raw", paired_ratio(
            raw_seq, column(redis_figs, f"{name}|seq")), 0.90))  # fmt: skip
    for name in OURS:
        rows.append(target(f"{name} 64-task throughput ÷ raw", paired_ratio(
            column(redis_figs, f"{name}|c64"), raw_c64), 0.90))  # fmt: skip
    for pair, r in mem_ratios.items():
        ours, peer = pair.split("/")
        if peer not in SAME_ALGORITHM[ours]:
            continue  # a comparison, not a target: another algorithm
        rows.append(target(f"memory:// {ours} speed ÷ limits memory {peer}", r, 1.0))
    for layout, _, usage, *_rest, goal, _met in usage_rows:
        if goal != "-":
            rows.append(target(f"MEMORY USAGE {layout}", float(usage), float(goal[2:]), False))
    print_table("Targets (issue 2)", ["target", "goal", "measured", "met"], rows)
    print_notes(
        f"Method. Sequential: the conditions run interleaved in blocks of {SEQ_BLOCK} hits, "
        f"in an order that rotates every block, {SEQ_N} hits each per repetition. 64 tasks: "
        f"one chunk of {TASKS} tasks x {PER_TASK} hits per condition in turn, {CHUNKS} chunks "
        f"each per repetition. In process: blocks of {MEM_BLOCK}, {MEM_N} hits each.",
        f"Every key receives {HITS_PER_KEY} hits under a limit of {LIMIT}/minute: every hit "
        "is admitted (the script checks) and one in ten creates its key.",
        f"Ours runs on `Backend.from_url(url, max_connections={TASKS})`: as many connections "
        "as tasks, like the raw client and limits' redis-py client. The row with the default "
        f"pool ({DEFAULT_MAX_CONNECTIONS}) shows what a pool smaller than the crowd costs.",
        "Figures are medians over the repetitions; each ratio is the median of the "
        "per-repetition ratios. Speed ÷ raw is raw time ÷ our time (sequential) or our hits/s "
        "÷ raw hits/s (64 tasks): 1.00 means no overhead over the floor.",
    )
    print_smoke_note()


async def main() -> None:
    url = redis_url()
    prefix = bench_prefix()
    r = aredis.Redis.from_url(url, decode_responses=True)
    try:
        server = await r.info("server")
        print_header(
            "Rate limiters: raw floor, aioratelimit and limits, side by side",
            server,
            ["aioratelimit", "redis", "hiredis", "limits", "coredis"],
            [("redis-py reply parser", DefaultParser.__name__), ("event loop", "asyncio")],
        )
        progress(f"keys under {prefix}:*")
        redis_figs = await redis_reps(url, prefix)
        mem_figs = await memory_reps()
        usage_rows = await memory_usage(url, prefix)
        report(redis_figs, mem_figs, usage_rows)
    finally:
        deleted = await delete_prefix(r, f"{prefix}:")
        progress(f"deleted {deleted} keys under {prefix}:*")
        await r.aclose()


def run(entry: Callable[[], Any] = main) -> None:
    asyncio.run(entry())
    sys.stdout.flush()


if __name__ == "__main__":
    run()
