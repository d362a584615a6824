"""Redis Cluster against a standalone server, side by side: what the routing costs.

Run (it starts a redis-server and a cluster of three masters and three replicas on free
loopback ports, and stops them at the end)::

    .venv/bin/python benchmarks/bench_cluster.py

Conditions, sequential (interleaved in blocks) and with 64 tasks (crowd by crowd), every
hit admitted (each key gets ``HITS_PER_KEY`` hits under a limit of 100 per minute):

- standalone: ours, ``FixedWindow.hit`` on a default ``Backend.from_url`` of the server;
- cluster: ours, the same on the cluster: each call goes straight to the master the slot
  map names, on that master's one multiplexed connection;
- cluster: the raw floor, the floor's EVALSHA through redis-py's ``RedisCluster`` (a
  connection per task per master), the path redis-py users take;
- ``redis-benchmark --cluster -c 50 -P 1`` of the floor's EVALSHA (its 50 connections
  spread over the masters, each sending keys of its own master's slots);
- wake-up publish (64 tasks): a script that publishes on a tagged channel, with
  ``SPUBLISH`` (kept inside the shard, what the library uses on a cluster) against
  ``PUBLISH`` (which Redis Cluster broadcasts to every node), through our cluster
  backend; then, sequentially, the cluster-bus messages each one costs (``CLUSTER INFO``
  publish counters of every node).

The server's CPU is read around each block: of the server for the standalone rows, of all
six nodes (replication included) for the cluster's. All the servers share this machine's
cores with the client, so a cluster buys no capacity here: the rows show the cost of the
routing, not the scaling a cluster gives across machines.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import harness as h

import aioratelimit as arl
from aioratelimit._scripts import script

LIMIT = 100
RATE = f"{LIMIT}/minute"
HITS_PER_KEY = 10
SEQ_N = h.scaled(2000, 20)
SEQ_BLOCK = min(100, SEQ_N)
TASKS = 64
PER_TASK = h.scaled(16, 2)  # one crowd = TASKS * PER_TASK operations
CHUNKS = h.scaled(10, 2)  # crowds per condition per repetition
#: Requests of a C client run on the cluster: ``--cluster`` first reads the slot map and
#: starts a thread per master, about 0.13 s that 20,000 requests would count as a quarter.
C_N = h.scaled(100_000, 200)
BUS_N = h.scaled(2000, 50)  # publishes per command for the cluster-bus count

_WAKE = """\
-- KEYS[1] a key with the channel's hash tag (only routes the call); ARGV[1] the publish
-- command; ARGV[2] the channel. Reply: the number of subscribers reached.
return redis.call(ARGV[1], ARGV[2], '')
"""
WAKE = script("bench_wake", _WAKE)

STANDALONE = "standalone: ours"
CLUSTER = "cluster: ours"
RAW = "cluster: raw redis.asyncio RedisCluster"
C_CLIENT = "cluster: redis-benchmark --cluster -c 50 -P 1 (C)"
SPUBLISH = "wake-up with SPUBLISH (shard-local)"
PUBLISH = "wake-up with PUBLISH (broadcast)"


class Ops:
    """One timed operation per condition; each counts the hits it saw admitted."""

    def __init__(self) -> None:
        self.admitted: Counter[str] = Counter()

    def ours(self, name: str, limiter: Any, tag: str, total: int) -> h.Op:
        keys, admitted, hit = max(1, total // HITS_PER_KEY), self.admitted, limiter.hit

        async def op(i: int) -> None:
            decision = await hit(f"{tag}{i % keys}")
            admitted[name] += decision.allowed

        return op

    def raw(self, name: str, client: Any, sha: str, head: str, total: int) -> h.Op:
        keys, admitted, evalsha = max(1, total // HITS_PER_KEY), self.admitted, client.evalsha

        async def op(i: int) -> None:
            reply = await evalsha(sha, 1, f"{head}{{{i % keys}}}", h.WINDOW_MS)
            admitted[name] += reply[0] <= LIMIT

        return op

    def wake(self, name: str, backend: arl.Backend, command: str, tag: str) -> h.Op:
        admitted, run = self.admitted, h.run_script(backend)

        async def op(i: int) -> None:
            key = f"{tag}{{{i % 1024}}}"
            await run(WAKE, [key], [command, f"{key}:wake"])
            admitted[name] += 1

        return op


async def timed(lab: h.Lab, cluster: h.RedisCluster, meter: h.CpuMeter) -> h.Reps:
    standalone = h.our_backend(lab.url, lab.prefix)
    clustered = h.our_backend(cluster.url, lab.prefix)
    raw = h.raw_cluster(cluster.url)
    meters = {STANDALONE: lab.meter} | dict.fromkeys((CLUSTER, RAW, SPUBLISH, PUBLISH), meter)
    try:
        limiters = {STANDALONE: arl.FixedWindow(RATE, backend=standalone)}
        limiters[CLUSTER] = arl.FixedWindow(RATE, backend=clustered)
        await raw.initialize()
        sha = await h.load_floor(raw)  # on every master
        ops = Ops()

        def cases(tag: str, total: int, wake: bool) -> dict[str, h.Op]:
            found = {n: ops.ours(n, lim, f"{tag}{n[:3]}:", total) for n, lim in limiters.items()}
            found[RAW] = ops.raw(RAW, raw, sha, f"{lab.prefix}:raw:{tag}", total)
            if wake:
                wake_tag = f"{lab.prefix}:wake:{tag}"
                found[SPUBLISH] = ops.wake(SPUBLISH, clustered, "SPUBLISH", wake_tag)
                found[PUBLISH] = ops.wake(PUBLISH, clustered, "PUBLISH", wake_tag)
            return found

        # Warm-up: loads the scripts and opens the connections of every client.
        await h.crowds(cases("w", 10_000, True), TASKS, 2, 2)
        floor = h.floor_command(sha, lab.prefix, cluster=True)
        reps = h.Reps()
        for rep in range(h.REPS):
            ops.admitted.clear()
            got = {C_CLIENT: h.redis_benchmark(cluster.seed, floor, 50, 1, C_N, meter, True)}
            seq = await h.interleave(cases(f"s{rep}", SEQ_N, False), SEQ_N, SEQ_BLOCK, rep, meters)
            total = CHUNKS * TASKS * PER_TASK
            c64 = await h.crowds(
                cases(f"c{rep}", total, True), TASKS, PER_TASK, CHUNKS, rep, meters
            )
            wrong = {
                k: v for k, v in ops.admitted.items() if v != total + (0 if "wake" in k else SEQ_N)
            }
            if wrong:
                raise SystemExit(f"not every hit was admitted: {wrong}")
            reps.append(
                {k: v for k, v in got.items() if v is not None}
                | {f"{k}|seq": v for k, v in seq.items()}
                | {f"{k}|c64": v for k, v in c64.items()}
            )
            h.progress(f"rep {rep + 1}/{h.REPS} done")
        return reps
    finally:
        await standalone.aclose()
        await clustered.aclose()
        await raw.aclose()


async def bus_messages(lab: h.Lab, cluster: h.RedisCluster) -> dict[str, float]:
    """Cluster-bus messages sent (summed over every node) per publish of each command:
    what a wake-up costs the other nodes, which client throughput does not show."""
    fields = ("cluster_stats_messages_publish_sent", "cluster_stats_messages_publishshard_sent")

    def sent() -> int:
        total = 0
        for node in cluster.nodes:
            with node.client() as client:
                info = client.cluster("INFO")
            total += sum(int(info.get(f, 0)) for f in fields)
        return total

    per: dict[str, float] = {}
    async with h.our_backend(cluster.url, lab.prefix) as backend:
        run = h.run_script(backend)
        for name, command in ((SPUBLISH, "SPUBLISH"), (PUBLISH, "PUBLISH")):
            before = sent()
            for i in range(BUS_N):
                key = f"{lab.prefix}:bus{{{i % 1024}}}"
                await run(WAKE, [key], [command, f"{key}:wake"])
            per[name] = (sent() - before) / BUS_N
    return per


def report(reps: h.Reps, bus: dict[str, float]) -> None:
    rows = []
    for name in (STANDALONE, CLUSTER, RAW):
        rows.append([
            name,
            reps.rate(f"{name}|seq"),
            reps.rate(f"{name}|c64"),
            reps.speed(f"{name}|c64", f"{STANDALONE}|c64"),
            reps.speed(f"{name}|c64", f"{RAW}|c64") if name != STANDALONE else "-",
            reps.speed(f"{name}|c64", C_CLIENT) if C_CLIENT in reps and name != STANDALONE else "-",
            f"{reps.server(f'{name}|seq')} / {reps.server(f'{name}|c64')}",
        ])  # fmt: skip
    if C_CLIENT in reps:
        rows.append(
            [C_CLIENT, "-", reps.rate(C_CLIENT), "-", "-", "1.00", f"- / {reps.server(C_CLIENT)}"]
        )
    h.print_table(
        f"FixedWindow.hit, medians of {h.REPS} repetitions (min-max)",
        ["condition", "sequential hits/s", "64 tasks hits/s", "64 tasks ÷ standalone",
         "64 tasks ÷ raw RedisCluster", "64 tasks ÷ C --cluster",
         "server CPU µs/hit (seq / 64 tasks)"],
        rows,
    )  # fmt: skip
    spub = f"{SPUBLISH}|c64"
    h.print_table(
        f"Wake-up publish on the cluster, 64 tasks, medians of {h.REPS} repetitions (min-max)",
        ["command", "publishes/s", "÷ SPUBLISH", "server CPU µs/publish",
         "cluster-bus messages per publish"],
        [
            [name, reps.rate(f"{name}|c64"), reps.speed(f"{name}|c64", spub),
             reps.server(f"{name}|c64"), f"{bus[name]:.2f}"]
            for name in (SPUBLISH, PUBLISH)
        ],
    )  # fmt: skip
    h.print_notes(
        f"Sequential: the conditions interleaved in blocks of {SEQ_BLOCK} ({SEQ_N} each);"
        f" 64 tasks: one crowd of {TASKS} x {PER_TASK} per condition in turn, {CHUNKS} crowds"
        f" each per repetition; redis-benchmark {C_N} requests a run, once per repetition."
        " Ratios are medians of per-repetition ratios. Server CPU: `INFO CPU` deltas around"
        " each block, per operation: the standalone server's, or the sum over the cluster's"
        " six nodes.",
    )


async def main(lab: h.Lab) -> None:
    assert lab.cluster is not None
    assert lab.cluster_meter is not None
    reps = await timed(lab, lab.cluster, lab.cluster_meter)
    report(reps, await bus_messages(lab, lab.cluster))


if __name__ == "__main__":
    h.run(main, "Redis Cluster against standalone", cluster=True)
