"""Rate limiters, side by side in one run: the raw floor, ours, and the ``limits`` library.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_ratelimit.py

Conditions, each decision on one key:

- raw: ``redis.asyncio`` EVALSHA of the minimal fixed-window script (INCR; PEXPIRE when the
  count is 1; return the count and PTTL), the floor any Lua limiter pays;
- ours: ``FixedWindow``, ``SlidingWindow`` (10 buckets) and ``TokenBucket`` ``hit`` on a
  default ``Backend.from_url``;
- limits: ``FixedWindow``, ``MovingWindow`` and ``SlidingWindowCounter`` ``hit`` on its
  async ``RedisStorage``, with its default coredis client and with ``implementation="redispy"``;
- in process: ours on ``memory://`` against limits' async ``MemoryStorage``.

Every key gets ``HITS_PER_KEY`` hits under a limit of 100 per minute, so every hit is
admitted (checked) and one in ten creates its key. The sequential runs are interleaved in
blocks, the 64-task runs crowd by crowd, with the server's CPU read around each. Then
``MEMORY USAGE key SAMPLES 0`` of one key of each layout, written by each library itself.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import harness as h

import aioratelimit as arl

LIMIT = 100
RATE = f"{LIMIT}/minute"
HITS_PER_KEY = 10

SEQ_N = h.scaled(3000, 20)  # sequential hits per condition per repetition
SEQ_BLOCK = min(150, SEQ_N)
TASKS = 64
PER_TASK = h.scaled(16, 2)  # one crowd = TASKS * PER_TASK hits
CHUNKS = h.scaled(10, 2)  # crowds per condition per repetition
MEM_N = h.scaled(20000, 100)  # in-process hits per condition per repetition
MEM_BLOCK = min(1000, MEM_N)

OURS = ("FixedWindow", "SlidingWindow", "TokenBucket")
STRATEGIES = ("FixedWindow", "MovingWindow", "SlidingWindowCounter")
IMPLS: tuple[h.LimitsImpl, ...] = ("coredis", "redispy")
#: The limits strategies that do the job of each of ours (MovingWindow is an exact log of
#: timestamps, not sub-window counters: another algorithm, compared all the same).
PEERS: dict[str, tuple[str, ...]] = {
    "FixedWindow": ("FixedWindow",),
    "SlidingWindow": ("SlidingWindowCounter", "MovingWindow"),
    "TokenBucket": (),
}


def our_limiter(name: str, backend: arl.Backend, rate: str = RATE) -> Any:
    if name == "FixedWindow":
        return arl.FixedWindow(rate, backend=backend)
    if name == "SlidingWindow":
        return arl.SlidingWindow(rate, buckets=10, backend=backend)
    return arl.TokenBucket(rate, backend=backend)


class Hitters:
    """One timed operation per condition; each counts the hits it saw admitted."""

    def __init__(self, prefix: str) -> None:
        from limits import RateLimitItemPerMinute

        self.prefix = prefix
        self.item = RateLimitItemPerMinute(LIMIT)
        self.admitted: Counter[str] = Counter()

    def raw(self, client: Any, sha: str, tag: str, total: int) -> h.Op:
        keys, admitted = max(1, total // HITS_PER_KEY), self.admitted
        evalsha, head = client.evalsha, f"{self.prefix}:raw:{tag}"

        async def op(i: int) -> None:
            reply = await evalsha(sha, 1, f"{head}{i % keys}", h.WINDOW_MS)
            admitted["raw"] += reply[0] <= LIMIT

        return op

    def ours(self, name: str, limiter: Any, tag: str, total: int) -> h.Op:
        keys, admitted, hit = max(1, total // HITS_PER_KEY), self.admitted, limiter.hit

        async def op(i: int) -> None:
            decision = await hit(f"{tag}{i % keys}")  # awaited before the += reads the count
            admitted[name] += decision.allowed

        return op

    def limits(self, name: str, strategy: Any, tag: str, total: int) -> h.Op:
        keys, admitted, hit, item = (
            max(1, total // HITS_PER_KEY),
            self.admitted,
            strategy.hit,
            self.item,
        )

        async def op(i: int) -> None:
            ok = await hit(item, tag, str(i % keys))
            admitted[name] += ok

        return op


def check_admitted(hitters: Hitters, expected: int, names: int) -> None:
    """Every hit was admitted, or the conditions did not do the same work."""
    wrong = {k: v for k, v in hitters.admitted.items() if v != expected}
    if wrong or len(hitters.admitted) != names:
        raise SystemExit(f"not every hit was admitted ({expected} expected): {wrong}")


async def on_redis(lab: h.Lab) -> h.Reps:
    """Every repetition's ``<condition>|seq`` and ``<condition>|c64`` samples."""
    raw = h.raw_client(lab.url)
    backend = h.our_backend(lab.url, lab.prefix)
    storages = {impl: h.limits_storage(lab.url, impl, f"{lab.prefix}:L") for impl in IMPLS}
    try:
        sha = await h.load_floor(raw)
        ours = {name: our_limiter(name, backend) for name in OURS}
        strategies = {
            f"limits {impl} {s}": h.limits_strategy(s, storages[impl])
            for impl in IMPLS
            for s in STRATEGIES
        }
        hitters = Hitters(lab.prefix)

        def ops(tag: str, total: int) -> dict[str, h.Op]:
            # Every condition its own keys: limits' key names do not say the strategy.
            cases = {"raw": hitters.raw(raw, sha, tag, total)}
            for name, limiter in ours.items():
                cases[name] = hitters.ours(name, limiter, f"{tag}{name}:", total)
            for name, strategy in strategies.items():
                cases[name] = hitters.limits(name, strategy, f"{tag}{name}", total)
            return cases

        # Warm-up: loads every script and opens the pooled connections of each client.
        warm = ops("w", 1000)
        await h.interleave(warm, 20, 20)
        await h.crowds(warm, TASKS, 2, 1)
        reps = h.Reps()
        for rep in range(h.REPS):
            hitters.admitted.clear()
            cases = ops(f"s{rep}", SEQ_N)
            seq = await h.interleave(cases, SEQ_N, SEQ_BLOCK, rep, lab.meter)
            total = CHUNKS * TASKS * PER_TASK
            c64 = await h.crowds(ops(f"c{rep}", total), TASKS, PER_TASK, CHUNKS, rep, lab.meter)
            check_admitted(hitters, SEQ_N + total, len(cases))
            reps.append(
                {f"{k}|seq": v for k, v in seq.items()} | {f"{k}|c64": v for k, v in c64.items()}
            )
            h.progress(f"redis rep {rep + 1}/{h.REPS} done")
        return reps
    finally:
        await backend.aclose()
        for storage in storages.values():
            await h.close_limits(storage)
        await raw.aclose()


async def in_process() -> h.Reps:
    """Every repetition's samples in process: ours on memory:// and limits'."""
    from limits.aio.storage import MemoryStorage

    reps = h.Reps()
    for rep in range(h.REPS):
        backend = arl.Backend.from_url("memory://")
        storage = MemoryStorage()
        try:
            hitters = Hitters("mem")
            cases = {
                f"ours {name}": hitters.ours(
                    f"ours {name}", our_limiter(name, backend), f"m{rep}", MEM_N
                )
                for name in OURS
            }
            for s in STRATEGIES:
                strategy = h.limits_strategy(s, storage)
                cases[f"limits {s}"] = hitters.limits(f"limits {s}", strategy, f"m{rep}{s}", MEM_N)
            warm = min(200, MEM_N)
            await h.interleave(cases, warm, warm)
            reps.append(await h.interleave(cases, MEM_N, MEM_BLOCK, rep))
            check_admitted(hitters, MEM_N + warm, len(cases))
        finally:
            await backend.aclose()
            await h.close_limits(storage)
        h.progress(f"memory rep {rep + 1}/{h.REPS} done")
    return reps


async def memory_usage(lab: h.Lab) -> list[list[str]]:
    """One key of each layout, written by the library itself; MEMORY USAGE SAMPLES 0."""
    from limits import RateLimitItemPerMinute, RateLimitItemPerSecond

    r = h.raw_client(lab.url, decode_responses=True)
    backend = h.our_backend(lab.url, lab.prefix)
    storage = h.limits_storage(lab.url, "redispy", f"{lab.prefix}:L")
    rows: list[list[str]] = []

    async def row(layout: str, hits: str, key: str) -> int:
        usage = int(await r.memory_usage(key, samples=0) or 0)
        kind = str(await r.type(key))
        size = {"hash": r.hlen, "list": r.llen}.get(kind)
        shape = f"{kind}, {await r.object('encoding', key)}"
        shape += f", {await size(key)} entries" if size else ""
        rows.append([layout, hits, str(usage), shape, str(len(key))])
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
        swc = h.limits_strategy("SlidingWindowCounter", storage)
        item_s = RateLimitItemPerSecond(100)

        async def roll_limits() -> None:
            for _ in range(37):
                await swc.hit(item_s, "swc", user)
            await asyncio.sleep(1.05)
            await swc.hit(item_s, "swc", user)

        await asyncio.gather(spread_sliding(), roll_limits())
        await row("ours FixedWindow (string counter)", "37", fw._keys(backend, user)[0])
        await row(
            "ours SlidingWindow, 10 buckets, every slot used",
            f"{sw_hits} over 1.3 s",
            sw._keys(backend, user)[0],
        )
        await row("ours TokenBucket (string TAT)", "37", tb._keys(backend, user)[0])

        item = RateLimitItemPerMinute(LIMIT)
        fixed, moving = (h.limits_strategy(s, storage) for s in ("FixedWindow", "MovingWindow"))
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
        cur = b.prefixed_key(storage._current_window_key(base))
        prev = b.prefixed_key(storage._previous_window_key(base))
        both = await row("limits SlidingWindowCounter, current key", "1", cur)
        both += await row("limits SlidingWindowCounter, previous key", "37", prev)
        rows.append(["limits SlidingWindowCounter, both keys", "38", str(both), "2 strings", "-"])
        return rows
    finally:
        await backend.aclose()
        await h.close_limits(storage)
        await r.aclose()


def report(redis: h.Reps, memory: h.Reps, usage: list[list[str]]) -> None:
    names = ["raw", *OURS, *(f"limits {i} {s}" for i in IMPLS for s in STRATEGIES)]
    labels = {"raw": "raw floor: redis.asyncio EVALSHA", **{n: f"**ours {n}**" for n in OURS}}
    rows = [
        [
            labels.get(name, name),
            redis.latency(f"{name}|seq"),
            redis.speed(f"{name}|seq", "raw|seq"),
            redis.rate(f"{name}|c64"),
            redis.speed(f"{name}|c64", "raw|c64"),
            f"{redis.server(f'{name}|seq')} / {redis.server(f'{name}|c64')}",
        ]
        for name in names
    ]
    h.print_table(
        f"Redis: one decision per hit, medians of {h.REPS} repetitions (min-max)",
        ["decision", "sequential µs/hit", "seq speed ÷ raw", "64 tasks hits/s",
         "64-task speed ÷ raw", "server CPU µs/hit (seq / 64 tasks)"],
        rows,
    )  # fmt: skip

    rows = []
    for ours, peers in PEERS.items():
        if not peers:
            rows.append([f"ours {ours}", "(limits has no token bucket)", "-", "-"])
        for peer in peers:
            for impl in IMPLS:
                p = f"limits {impl} {peer}"
                seq = redis.speed(f"{ours}|seq", f"{p}|seq")
                rows.append([f"ours {ours}", p, seq, redis.speed(f"{ours}|c64", f"{p}|c64")])
    h.print_table(
        "Redis: ours against limits (speed ratio, > 1 means ours is faster)",
        ["ours", "limits", "sequential", "64 tasks"],
        rows,
    )

    rows = []
    for ours, peers in PEERS.items():
        for peer in peers or ("",):
            rows.append([
                f"ours {ours}",
                memory.latency(f"ours {ours}", 2),
                f"limits {peer}" if peer else "(limits has no token bucket)",
                memory.latency(f"limits {peer}", 2) if peer else "-",
                memory.speed(f"ours {ours}", f"limits {peer}") if peer else "-",
            ])  # fmt: skip
    h.print_table(
        f"In process: ours on memory:// against limits' async MemoryStorage, sequential,"
        f" medians of {h.REPS} repetitions",
        ["ours", "µs/hit (min-max)", "limits", "µs/hit (min-max)", "speed ratio, ours ÷ limits"],
        rows,
    )

    h.print_table(
        "Redis memory per key (`MEMORY USAGE key SAMPLES 0`, bytes)",
        ["layout", "hits", "bytes", "type, encoding", "key bytes"],
        usage,
    )
    h.print_notes(
        f"Sequential: the conditions interleaved in blocks of {SEQ_BLOCK} hits, in an order"
        f" rotating every block, {SEQ_N} hits each per repetition. 64 tasks: one crowd of"
        f" {TASKS} tasks x {PER_TASK} hits per condition in turn, {CHUNKS} crowds each per"
        f" repetition. In process: blocks of {MEM_BLOCK}, {MEM_N} hits each. Figures are"
        " medians over the repetitions; each ratio is the median of per-repetition ratios."
        " Speed ÷ raw is 1.00 when a decision costs what the floor's does.",
        f"Every key receives {HITS_PER_KEY} hits under a limit of {LIMIT}/minute: every hit"
        " is admitted (checked) and one in ten creates its key. Server CPU: `INFO CPU`"
        " deltas around each block, per hit (the main thread did"
        f" {redis.main_share()} of it).",
    )


async def main(lab: h.Lab) -> None:
    redis = await on_redis(lab)
    memory = await in_process()
    report(redis, memory, await memory_usage(lab))


if __name__ == "__main__":
    h.run(
        main,
        "Rate limiters: raw floor, aioratelimit and limits, side by side",
        ["aioratelimit", "redis", "hiredis", "limits", "coredis"],
    )
