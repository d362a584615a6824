"""Redis Cluster against a standalone server, side by side: throughput with 64 tasks.

Run (the script starts nothing; both deployments are yours)::

    REDIS_URL=redis://127.0.0.1:6391/0 \\
    REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:7000,127.0.0.1:7001 \\
        .venv/bin/python benchmarks/bench_cluster.py

Without ``REDIS_CLUSTER_URL`` only the standalone rows are measured, and a note says so.

Conditions, each 64 tasks awaiting ``FixedWindow.hit`` (every key gets ``HITS_PER_KEY`` hits
under a limit of 100 per minute, so every hit is admitted), interleaved chunk by chunk:

- standalone: ``Backend.from_url(REDIS_URL, max_connections=64)``;
- cluster: ``Backend.from_url(REDIS_CLUSTER_URL, max_connections=64)``: each call goes
  straight to the master the slot map names;
- cluster, redis-py routing: the same script by EVALSHA through ``RedisCluster`` itself (64
  connections per node), the path redis-py users take and our store's fallback;
- wake-up publish: a script that publishes on a tagged channel, with ``SPUBLISH`` (kept
  inside the shard, what the library uses on a cluster) against ``PUBLISH`` (which Redis
  Cluster broadcasts to every node), through our cluster backend; then, sequentially, the
  cluster-bus messages each one costs (``CLUSTER INFO`` publish counters of every node).

All the servers of a loopback deployment share this machine's cores, so the cluster rows
show the cost of the routing, not the scaling a cluster gives across machines.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis
from _common import (
    REPS,
    Op,
    bench_prefix,
    column,
    delete_cluster_prefix,
    delete_prefix,
    fan_out,
    interleave,
    paired_ratio,
    print_header,
    print_notes,
    print_table,
    progress,
    ratio,
    raw_cluster,
    redis_url,
    scaled,
    with_spread,
)

import aioratelimit as arl
from aioratelimit._scripts import script

LIMIT = 100
RATE = f"{LIMIT}/minute"
HITS_PER_KEY = 10
TASKS = 64
PER_TASK = scaled(16, 2)  # one chunk = TASKS * PER_TASK operations
CHUNKS = scaled(10, 2)  # chunks per condition per repetition

_WAKE = """\
-- KEYS[1] a key with the channel's hash tag (only routes the call); ARGV[1] the publish
-- command; ARGV[2] the channel. Reply: the number of subscribers reached.
return redis.call(ARGV[1], ARGV[2], '')
"""
WAKE = script("bench_wake", _WAKE)

STANDALONE = "standalone: ours"
CLUSTER = "cluster: ours"
ROUTED = "cluster: redis-py RedisCluster routing"
SPUBLISH = "wake-up with SPUBLISH (shard-local)"
PUBLISH = "wake-up with PUBLISH (broadcast)"


def cluster_url() -> str | None:
    return os.environ.get("REDIS_CLUSTER_URL") or None


class Ops:
    """One timed operation per condition; each counts the hits it saw admitted."""

    def __init__(self) -> None:
        self.admitted: Counter[str] = Counter()

    def ours(self, name: str, limiter: Any, tag: str, total: int) -> Op:
        keys, admitted, hit = max(1, total // HITS_PER_KEY), self.admitted, limiter.hit

        async def op(i: int) -> None:
            decision = await hit(f"{tag}{i % keys}")
            admitted[name] += decision.allowed

        return op

    def routed(self, name: str, client: Any, limiter: Any, head: str, total: int) -> Op:
        """Our limiter's script and arguments, by EVALSHA through RedisCluster."""
        keys, admitted = max(1, total // HITS_PER_KEY), self.admitted
        sha, argv = limiter._script.sha, (1, 1, *limiter._args)

        async def op(i: int) -> None:
            reply = await client.evalsha(sha, 1, f"{head}{{{i % keys}}}:{RATE}", *argv)
            admitted[name] += reply[0]

        return op

    def wake(self, name: str, backend: arl.Backend, command: str, tag: str) -> Op:
        admitted, run = self.admitted, backend._run

        async def op(i: int) -> None:
            key = f"{tag}{{{i % 1024}}}"
            await run(WAKE, [key], [command, f"{key}:wake"])
            admitted[name] += 1

        return op


async def reps(url: str, cluster: str | None, prefix: str) -> list[dict[str, float]]:
    """Every repetition's throughput (operations per second) of every condition."""
    backends = {STANDALONE: arl.Backend.from_url(url, prefix=prefix, max_connections=TASKS)}
    raw: Any = None
    if cluster is not None:
        backends[CLUSTER] = arl.Backend.from_url(cluster, prefix=prefix, max_connections=TASKS)
        raw = raw_cluster(cluster, max_connections=TASKS)
    try:
        limiters = {name: arl.FixedWindow(RATE, backend=b) for name, b in backends.items()}
        if raw is not None:
            await raw.initialize()
            await raw.script_load(limiters[CLUSTER]._script.source)  # on every master
        ops = Ops()

        def cases(tag: str, total: int) -> dict[str, Op]:
            found = {n: ops.ours(n, lim, f"{tag}{n[:3]}:", total) for n, lim in limiters.items()}
            if raw is not None:
                head = f"{prefix}:routed:{tag}"
                found[ROUTED] = ops.routed(ROUTED, raw, limiters[CLUSTER], head, total)
                wake_tag = f"{prefix}:wake:{tag}"
                found[SPUBLISH] = ops.wake(SPUBLISH, backends[CLUSTER], "SPUBLISH", wake_tag)
                found[PUBLISH] = ops.wake(PUBLISH, backends[CLUSTER], "PUBLISH", wake_tag)
            return found

        # Warm-up: loads the scripts and opens the pooled connections of every client.
        await interleave({k: fan_out(op, TASKS, 2) for k, op in cases("w", 10_000).items()}, 2, 1)
        per_chunk = TASKS * PER_TASK
        figures = []
        for rep in range(REPS):
            ops.admitted.clear()
            chunks = {
                k: fan_out(op, TASKS, PER_TASK)
                for k, op in cases(f"c{rep}", CHUNKS * per_chunk).items()
            }
            spent = await interleave(chunks, CHUNKS, 1, rep)
            expected = CHUNKS * per_chunk
            wrong = {k: v for k, v in ops.admitted.items() if v != expected}
            if wrong:
                raise SystemExit(f"not every hit was admitted ({expected} expected): {wrong}")
            figures.append({k: per_chunk / v for k, v in spent.items()})
            progress(f"rep {rep + 1}/{REPS} done")
        return figures
    finally:
        for backend in backends.values():
            await backend.aclose()
        if raw is not None:
            await raw.aclose()


BUS_N = scaled(2000, 50)  # publishes per command for the cluster-bus count


async def bus_messages(url: str, prefix: str) -> dict[str, float]:
    """Cluster-bus messages sent (summed over every node) per publish of each command:
    what a wake-up costs the other nodes, which client throughput does not show."""
    backend = arl.Backend.from_url(url, prefix=prefix)
    rc = raw_cluster(url)
    fields = ("cluster_stats_messages_publish_sent", "cluster_stats_messages_publishshard_sent")

    async def sent() -> int:
        total = 0
        for node in rc.get_nodes():
            info = await rc.cluster_info(target_nodes=node)
            total += sum(int(info.get(f, 0)) for f in fields)
        return total

    try:
        await rc.initialize()
        per: dict[str, float] = {}
        for name, command in ((SPUBLISH, "SPUBLISH"), (PUBLISH, "PUBLISH")):
            before = await sent()
            for i in range(BUS_N):
                key = f"{prefix}:bus{{{i % 1024}}}"
                await backend._run(WAKE, [key], [command, f"{key}:wake"])
            per[name] = (await sent() - before) / BUS_N
        return per
    finally:
        await backend.aclose()
        await rc.aclose()


def report(figures: Sequence[dict[str, float]], cluster: str | None, bus: dict[str, float]) -> None:
    base = column(figures, STANDALONE)
    rows = []
    for name in (STANDALONE, CLUSTER, ROUTED):
        if name in figures[0]:
            xs = column(figures, name)
            rows.append([name, with_spread(xs, 0), ratio(paired_ratio(xs, base))])
    print_table(
        f"FixedWindow.hit with 64 tasks, medians of {REPS} repetitions (min-max)",
        ["condition", "hits/s", "÷ standalone"],
        rows,
    )
    if cluster is None:
        print_notes(
            "**Cluster rows skipped**: set `REDIS_CLUSTER_URL` "
            "(`redis+cluster://host:port,...`) to measure them."
        )
        return
    spub, pub = column(figures, SPUBLISH), column(figures, PUBLISH)
    print_table(
        f"Wake-up publish on the cluster, 64 tasks, medians of {REPS} repetitions (min-max)",
        ["command", "publishes/s", "÷ SPUBLISH", "cluster-bus messages per publish"],
        [
            [SPUBLISH, with_spread(spub, 0), "1.00", f"{bus[SPUBLISH]:.2f}"],
            [PUBLISH, with_spread(pub, 0), ratio(paired_ratio(pub, spub)), f"{bus[PUBLISH]:.2f}"],
        ],
    )


async def main() -> None:
    url, cluster = redis_url(), cluster_url()
    prefix = bench_prefix()
    client = aredis.Redis.from_url(url)
    try:
        info = await client.info("server")
        print_header("aioratelimit on Redis Cluster against standalone", info, ["redis"])
        extra = []
        if cluster is not None:
            rc = raw_cluster(cluster)
            try:
                await rc.initialize()
                extra = [
                    ["cluster", f"{len(rc.get_primaries())} masters, "
                                f"{len(rc.get_replicas())} replicas at {cluster}"],
                ]  # fmt: skip
            finally:
                await rc.aclose()
        if extra:
            print_table("Cluster", ["item", "value"], extra)
        bus: dict[str, float] = {}
        try:
            figures = await reps(url, cluster, prefix)
            if cluster is not None:
                bus = await bus_messages(cluster, prefix)
        finally:
            await delete_prefix(client, prefix)
            if cluster is not None:
                await asyncio.to_thread(delete_cluster_prefix, cluster, prefix)
        report(figures, cluster, bus)
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
