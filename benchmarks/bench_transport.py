"""The transport, side by side in one run: the C client, the raw redis-py floor, and ours.

Run (the script starts no server; it writes keys only under a prefix unique to the run and
deletes them before it exits)::

    REDIS_URL=redis://127.0.0.1:6391/0 .venv/bin/python benchmarks/bench_transport.py

What it measures, every condition in every repetition, interleaved:

- ``redis-benchmark`` (the C client, from redis-tools) ``-c 1 -P 1`` and ``-c 50 -P 1``
  running the floor EVALSHA: one connection one command at a time, and 50 connections
  without pipelining, the physical reference for "decisions a client can get";
- the raw floor: ``redis.asyncio`` EVALSHA of the same minimal fixed-window script,
  sequential and with 1, 2, 4 and 64 concurrent tasks;
- ours: ``FixedWindow``, ``SlidingWindow`` and ``TokenBucket`` ``hit`` on one default
  ``Backend.from_url``, sequential and with 1, 2, 4, 64, 256 and 1,024 tasks (FixedWindow;
  the other two at 64); a lock's acquire + release, sequential (against one raw EVALSHA)
  and 64 tasks on distinct names; ``consume_token`` at 64 tasks;
- with ``REDIS_CLUSTER_URL`` set, the same on that cluster (a table of its own):
  ``redis-benchmark --cluster -c 50 -P 1`` (its 50 connections spread over the masters,
  each sending keys of its own master's slots), the raw floor through
  ``redis.asyncio.RedisCluster`` (a connection per task per master), and ours on one
  ``Backend.from_url`` of the cluster (one multiplexed connection per master);
- the server's limit for each script: ``redis-benchmark -c 50 -P 16`` (pipelined: the C
  client costs next to nothing, so the server runs flat out) sending the exact command a
  hit of each limiter sends (captured on its way out, the user's key made random), and the
  floor EVALSHA. No client can get more decisions of a script than that from this server,
  so its ratio to ``-c 50 -P 1`` of the floor is the most any client could reach against
  the targets, and ours at 64 tasks is read against it too.

Every hit is admitted (the limit is far above the run), so this is the cost of a decision.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import subprocess
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aredis
from _common import (
    FLOOR_LUA,
    REPS,
    bench_prefix,
    cluster_hosts,
    column,
    delete_cluster_prefix,
    delete_prefix,
    fan_out,
    fmt,
    interleave,
    paired_ratio,
    perf,
    print_header,
    print_notes,
    print_table,
    progress,
    ratio,
    raw_cluster,
    redis_url,
    run_main,
    scaled,
    with_spread,
)

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script

warnings.filterwarnings("ignore", category=DeprecationWarning)

RATE = "1000000000/hour"  # every hit admitted
SEQ_N = scaled(2000, 20)
PER_TASK = scaled(16, 2)
CHUNKS = scaled(8, 1)
C_CLIENT_N = scaled(20000, 200)
#: Requests of a C client run on the cluster: ``--cluster`` first reads the slot map and
#: starts a thread per master, about 0.13 s that 20,000 requests would count as a quarter
#: of the run (39,700/s where 100,000 requests give 49,700/s); at 100,000 it is a fifteenth.
C_CLUSTER_N = scaled(100_000, 200)
#: Requests of a run of the server's limit (-P 16: about a second at this server's pace).
CEILING_N = scaled(150_000, 1_000)
CEILING_PIPELINE = 16
#: The user key of the captured hits, replaced by redis-benchmark's random number.
MARK = "bench-user-key"
#: A crowd of 64 or more runs this many decisions in all, in one go, as redis-benchmark
#: runs its C_CLIENT_N requests over its 50 connections: a sustained rate, where chunks of
#: 16 decisions per task counted each task's start and the pipeline's fill and drain
#: eight times a repetition.
SUSTAINED = C_CLIENT_N
LOW = (1, 2, 4)
CROWDS = (64, 256, 1024)
#: What names the cluster's figures (``REDIS_CLUSTER_URL``): "cluster FixedWindow|64".
CLUSTER = "cluster "

Op = Callable[[int], Awaitable[object]]


def floor_command(sha: str, prefix: str, cluster: bool = False) -> list[str]:
    """The floor EVALSHA as redis-benchmark sends it, on a random key under ``prefix`` (on a
    cluster with redis-benchmark's ``{tag}``, which it makes a hash tag of each node's)."""
    return ["EVALSHA", sha, "1", f"{prefix}:{'{tag}:' if cluster else ''}c:__rand_int__", "60000"]


def c_client(cases: Cases, connections: int) -> float | None:
    """``redis-benchmark`` running the floor EVALSHA on ``cases``' deployment: requests per
    second (None without it)."""
    command = floor_command(cases.sha, cases.prefix, cases.cluster)
    n = C_CLUSTER_N if cases.cluster else C_CLIENT_N
    return redis_benchmark(cases.url, command, connections, 1, n, cases.cluster)


def redis_benchmark(
    url: str, command: list[str], connections: int, pipeline: int, n: int, cluster: bool = False
) -> float | None:
    """``redis-benchmark`` sending ``command`` (``__rand_int__`` in it made random each
    time; ``cluster``: to the masters of the cluster whose first seed ``url`` names):
    requests per second (None without redis-benchmark)."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return None
    if cluster:
        host, port = cluster_hosts(url)[0]
    else:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    argv = [
        exe, "-h", host, "-p", str(port), *(["--cluster"] if cluster else []),
        "-c", str(connections), "-n", str(n), "-P", str(pipeline), "-r", "100000", "-q",
        *command,
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    found = re.findall(r"([0-9.]+) requests per second", out)
    if not found:
        raise SystemExit(f"redis-benchmark printed no rate: {out[-500:]}")
    return float(found[-1])


class Cases:
    """Every operation the run times, by name."""

    def __init__(
        self, raw: Any, sha: str, backend: arl.Backend, prefix: str, url: str, cluster: bool
    ) -> None:
        self.raw, self.sha, self.backend, self.prefix = raw, sha, backend, prefix
        #: the deployment: redis-benchmark's (a cluster's seeds, for ``--cluster``)
        self.url, self.cluster = url, cluster
        self.limiters = {
            "FixedWindow": arl.FixedWindow(RATE, backend=backend),
            "SlidingWindow": arl.SlidingWindow(RATE, backend=backend),
            "TokenBucket": arl.TokenBucket(RATE, backend=backend),
        }
        self.tokens: list[str] = []

    async def sent(self, name: str) -> list[str]:
        """The EVALSHA a hit of limiter ``name`` sends, its user key made random for
        redis-benchmark (captured on its way to the store; the hit itself runs too)."""
        backend = self.backend
        inner = backend._run
        seen: list[list[str]] = []

        async def run(script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
            seen.append(["EVALSHA", script.sha, str(len(keys)), *keys, *map(str, args)])
            return await inner(script, keys, args)

        backend._run = run
        try:
            await self.limiters[name].hit(MARK)
        finally:
            backend._run = inner
        (command,) = seen
        assert any(MARK in part for part in command), command
        return [part.replace(MARK, "__rand_int__") for part in command]

    @property
    def on(self) -> str:
        """What the deployment's figures are named with: "" standalone, else ``CLUSTER``."""
        return CLUSTER if self.cluster else ""

    def floor(self, tag: str) -> Op:
        evalsha, sha, key = self.raw.evalsha, self.sha, f"{self.prefix}:floor:{tag}:"
        return lambda i: evalsha(sha, 1, f"{key}{i % 1000}", 60000)

    def hit(self, name: str, tag: str) -> Op:
        hit, key = self.limiters[name].hit, f"{tag}:"
        return lambda i: hit(f"{key}{i % 1000}")

    def lock(self, tag: str) -> Op:
        backend = self.backend

        async def op(i: int) -> None:
            lease = await arl.Lock(f"{tag}:{i}", ttl=10, backend=backend).acquire()
            await lease.release()

        return op

    async def issue(self, i: int) -> None:
        self.tokens.append(await arl.issue_token(ttl=600, backend=self.backend))

    def consume(self) -> Op:
        consume, tokens, backend = arl.consume_token, self.tokens, self.backend

        async def op(i: int) -> None:
            assert await consume(tokens.pop(), backend=backend)

        return op


def shape(tasks: int) -> tuple[int, int]:
    """(chunks, decisions per task) of a condition with ``tasks`` concurrent tasks: a few
    tasks run CHUNKS short chunks; a crowd one chunk of about SUSTAINED decisions."""
    if tasks < 64:
        return CHUNKS, PER_TASK
    return 1, max(PER_TASK, SUSTAINED // tasks)


async def rate(op: Op, tasks: int) -> tuple[float, float]:
    """Operations per second of ``op`` from ``tasks`` concurrent tasks (``shape``), and the
    CPU this whole process spent per operation (µs, user and system: the event loop and
    the kernel's share of the socket calls included)."""
    chunks, per_task = shape(tasks)
    chunk = fan_out(op, tasks, per_task)
    start, cpu = perf(), time.process_time()
    for c in range(chunks):
        await chunk(c)
    n = chunks * tasks * per_task
    return n / (perf() - start), (time.process_time() - cpu) * 1e6 / n


def crowds(cases: Cases, rep: int) -> list[tuple[str, Op, int]]:
    """The conditions with tasks on ``cases``' deployment (names prefixed by ``cases.on``)."""
    on = cases.on
    return [
        *((f"{on}raw|{n}", cases.floor(f"{on}c{rep}{n}"), n) for n in (*LOW, 64)),
        *(
            (f"{on}FixedWindow|{n}", cases.hit("FixedWindow", f"{on}c{rep}{n}"), n)
            for n in (*LOW, *CROWDS)
        ),
        (f"{on}SlidingWindow|64", cases.hit("SlidingWindow", f"{on}c{rep}"), 64),
        (f"{on}TokenBucket|64", cases.hit("TokenBucket", f"{on}c{rep}"), 64),
        (f"{on}lock|64", cases.lock(f"{on}cl{rep}"), 64),
        (f"{on}consume_token|64", cases.consume(), 64),
    ]


async def sequential(cases: Cases, rep: int) -> dict[str, float]:
    """The sequential conditions on ``cases``' deployment, interleaved: calls per second."""
    on = cases.on
    seq = await interleave(
        {
            "raw": cases.floor(f"{on}s{rep}"),
            **{name: cases.hit(name, f"{on}s{rep}{name}") for name in cases.limiters},
            "lock": cases.lock(f"{on}sl{rep}"),
        },
        SEQ_N,
        100,
        rotate=rep,
    )
    return {f"{on}{name}|seq": 1 / s for name, s in seq.items()}


async def repetition(
    cases: Cases, rep: int, cluster: Cases | None, commands: dict[str, list[str]]
) -> dict[str, float]:
    figures: dict[str, float] = {}
    for connections in (1, 50):
        rps = c_client(cases, connections)
        if rps is not None:
            figures[f"C -c {connections}"] = rps
    for name, command in commands.items():
        rps = redis_benchmark(cases.url, command, 50, CEILING_PIPELINE, CEILING_N)
        if rps is not None:
            figures[f"limit|{name}"] = rps
    conditions: list[tuple[Cases, str, Op, int]] = []
    for where in [cases] + ([cluster] if cluster is not None else []):
        if where.cluster:
            rps = c_client(where, 50)
            if rps is not None:
                figures[f"{where.on}C -c 50"] = rps
        figures.update(await sequential(where, rep))
        conditions += [(where, *crowd) for crowd in crowds(where, rep)]
        where.tokens.clear()
        await fan_out(where.issue, 64, math.prod(shape(64)))(0)
    # The crowds, each condition in turn, in a rotating order.
    first = rep % len(conditions)
    for where, name, op, tasks in conditions[first:] + conditions[:first]:
        # The C client again right before each crowd, on the crowd's deployment: its ratio
        # pairs two runs seconds apart (this machine's speed drifts by up to 2x in a minute).
        rps = c_client(where, 50)
        if rps is not None:
            figures[f"C -c 50|{name}"] = rps
        figures[name], figures[f"cpu|{name}"] = await rate(op, tasks)
    return figures


def report(reps: list[dict[str, float]], has_c: bool, has_cluster: bool) -> None:
    def col(key: str) -> list[float]:
        return column(reps, key)

    c1 = col("C -c 1") if has_c else []
    c50 = col("C -c 50") if has_c else []

    def c50_of(key: str) -> list[float]:
        """The C client -c 50 run right before ``key``'s crowd (else the repetition's)."""
        return col(f"C -c 50|{key}") if f"C -c 50|{key}" in reps[0] else c50

    def rows_on(on: str) -> list[list[str]]:
        """The table of one deployment (``on``: "" standalone, CLUSTER), against the C
        client (standalone: its ``-c 1`` runs too) and the raw floor on it."""
        rows: list[list[str]] = []

        def row(label: str, key: str, us: bool = False) -> None:
            xs = col(on + key)
            raw = f"{on}raw|{key.rpartition('|')[2]}"  # the raw floor with as many tasks
            rows.append([
                label,
                with_spread([1e6 / x for x in xs]) if us else "-",
                with_spread(xs, 0),
                *([ratio(paired_ratio(xs, c1)) if c1 else "-"] if not on else []),
                ratio(paired_ratio(xs, c50_of(on + key))) if has_c else "-",
                ratio(paired_ratio(xs, col(raw))) if raw in reps[0] else "-",
            ])  # fmt: skip

        if has_c and not on:
            rows.append(["redis-benchmark -c 1 -P 1 (C)", "-", with_spread(c1, 0), "1.00",
                         ratio(paired_ratio(c1, c50)), "-"])  # fmt: skip
            rows.append(["redis-benchmark -c 50 -P 1 (C)", "-", with_spread(c50, 0),
                         ratio(paired_ratio(c50, c1)), "1.00", "-"])  # fmt: skip
        if has_c and on:
            cluster_c50 = col(f"{on}C -c 50")
            rows.append(["redis-benchmark --cluster -c 50 -P 1 (C)", "-",
                         with_spread(cluster_c50, 0), "1.00", "-"])  # fmt: skip
        row("raw redis.asyncio EVALSHA, sequential", "raw|seq", us=True)
        for name in ("FixedWindow", "SlidingWindow", "TokenBucket"):
            row(f"ours {name}, sequential", f"{name}|seq", us=True)
        for n in LOW:
            row(f"raw redis.asyncio, {n} tasks", f"raw|{n}")
            row(f"ours FixedWindow, {n} tasks", f"FixedWindow|{n}")
        row("raw redis.asyncio, 64 tasks", "raw|64")
        for n in CROWDS:
            row(f"ours FixedWindow, {n} tasks", f"FixedWindow|{n}")
        row("ours SlidingWindow, 64 tasks", "SlidingWindow|64")
        row("ours TokenBucket, 64 tasks", "TokenBucket|64")
        row("ours lock acquire+release, 64 tasks (distinct names)", "lock|64")
        row("ours consume_token, 64 tasks", "consume_token|64")
        return rows

    print_table(
        f"Decisions per second, medians of {REPS} repetitions (min-max)",
        ["condition", "µs/decision", "decisions/s", "÷ C -c 1", "÷ C -c 50", "÷ raw (same tasks)"],
        rows_on(""),
    )
    if has_cluster:
        print_table(
            f"On the 3+3 cluster: decisions per second, medians of {REPS} repetitions (min-max)",
            ["condition", "µs/decision", "decisions/s", "÷ C --cluster -c 50",
             "÷ raw RedisCluster (same tasks)"],
            rows_on(CLUSTER),
        )  # fmt: skip
    low = [
        [f"{n} tasks", ratio(paired_ratio(col(f"FixedWindow|{n}"), col(f"raw|{n}")))] for n in LOW
    ]
    print_table("Low concurrency: ours FixedWindow ÷ raw floor", ["tasks", "speed ratio"], low)
    # (target, goal, measured, bound): all "at least" except the lock's cost below
    targets: list[tuple[str, str, float, float]] = []
    if has_c:
        for name, tasks, bound in (
            ("FixedWindow", 64, 1.2),
            ("SlidingWindow", 64, 1.0),
            ("TokenBucket", 64, 1.0),
            ("FixedWindow", 256, 1.5),
        ):
            measured = paired_ratio(col(f"{name}|{tasks}"), c50_of(f"{name}|{tasks}"))
            targets.append((f"{name} {tasks} tasks ÷ C -c 50", f"≥ {bound}", measured, bound))
    for name in ("FixedWindow", "SlidingWindow", "TokenBucket"):
        measured = paired_ratio(col(f"{name}|seq"), col("raw|seq"))
        targets.append((f"{name} sequential ÷ raw", "≥ 1.0", measured, 1.0))
    lock_cost = paired_ratio(col("raw|seq"), col("lock|seq"))
    print_table(
        "Targets (issue 14)",
        ["target", "goal", "measured", "met"],
        [[t, g, fmt(m, 3), "yes" if m >= bound else "**no**"] for t, g, m, bound in targets]
        + [["lock acquire+release ÷ one raw EVALSHA (time)", "≤ 2.1", fmt(lock_cost, 3),
            "yes" if lock_cost <= 2.1 else "**no**"]],
    )  # fmt: skip
    if has_c:
        limits = []
        for name in ("floor", "FixedWindow", "SlidingWindow", "TokenBucket"):
            xs = col(f"limit|{name}")
            ours = cpu = one_core = "-"
            if name != "floor":
                ours = ratio(paired_ratio(col(f"{name}|64"), xs))
                cpus = col(f"cpu|{name}|64")
                cpu = with_spread(cpus, 1)
                # The decisions/s our client could give if it had a core to itself, read
                # against the C client run before the crowd.
                one_core = ratio(paired_ratio([1e6 / c for c in cpus], c50_of(f"{name}|64")))
            limits.append([
                "the floor EVALSHA" if name == "floor" else f"{name}.hit's EVALSHA",
                with_spread([1e6 / x for x in xs], 2),
                with_spread(xs, 0),
                ratio(paired_ratio(xs, c50)),
                ours,
                cpu,
                one_core,
            ])  # fmt: skip
        print_table(
            f"The server's limit per script: redis-benchmark -c 50 -P {CEILING_PIPELINE}"
            " sending the exact command; our client's CPU at 64 tasks",
            ["script", "µs/call at the limit", "calls/s", "÷ C -c 50 (the most any client gets)",
             "ours 64 tasks ÷ limit", "our client's CPU µs/decision",
             "1 core of it ÷ C -c 50"],
            limits,
        )  # fmt: skip
    print_notes(
        "Method. Each repetition runs every condition: redis-benchmark first (it runs alone:"
        f" {C_CLIENT_N} requests per run, {C_CLUSTER_N} on the cluster; the server's limits"
        f" {CEILING_N} each), then the"
        f" sequential conditions interleaved in blocks of 100 ({SEQ_N} each), then each"
        f" condition with tasks in turn (1 to 4 tasks: {CHUNKS} chunks of tasks x"
        f" {PER_TASK} decisions; 64 tasks and more: {SUSTAINED} decisions in all, in one go,"
        " as redis-benchmark runs its requests), in an order rotating every repetition, each"
        " right after a run of redis-benchmark -c 50 that its ÷ C -c 50 ratio is paired"
        " with. Figures are medians over the repetitions; each ratio is the median of"
        " per-repetition ratios.",
        "Ours is one default `Backend.from_url(url)`: one multiplexed connection (plus one for"
        " wake-ups). The raw floor is `redis.asyncio.Redis.from_url(url, max_connections=1024)`:"
        " a connection per concurrent task.",
    )
    if not has_c:
        print_notes("redis-benchmark was not found: the C client's rows are missing.")


async def main() -> None:
    url = redis_url()
    prefix = bench_prefix()
    raw = aredis.Redis.from_url(url, max_connections=1024)
    backend = arl.Backend.from_url(url, prefix=prefix)
    cluster_url = os.environ.get("REDIS_CLUSTER_URL")
    cluster_raw = raw_cluster(cluster_url, max_connections=1024) if cluster_url else None
    cluster_backend = arl.Backend.from_url(cluster_url, prefix=prefix) if cluster_url else None
    try:
        server = await raw.info("server")
        sha = await raw.script_load(FLOOR_LUA)
        print_header(
            "Transport: the C client, the raw floor and ours, side by side",
            server,
            ["aioratelimit", "redis", "hiredis"],
            [("event loop", type(asyncio.get_running_loop()).__module__)],
        )
        cases = Cases(raw, sha, backend, prefix, url, cluster=False)
        cluster = None
        if cluster_url is not None and cluster_raw is not None and cluster_backend is not None:
            await cluster_raw.initialize()
            await cluster_raw.script_load(FLOOR_LUA)  # on every master
            cluster = Cases(cluster_raw, sha, cluster_backend, prefix, cluster_url, cluster=True)
        commands = {"floor": floor_command(sha, prefix)}
        commands |= {name: await cases.sent(name) for name in cases.limiters}
        reps = []
        for rep in range(REPS):
            reps.append(await repetition(cases, rep, cluster, commands))
            progress(f"rep {rep + 1}/{REPS} done")
        report(reps, "C -c 1" in reps[0], cluster is not None)
    finally:
        deleted = await delete_prefix(raw, prefix)
        if cluster_url is not None:
            deleted += await asyncio.to_thread(delete_cluster_prefix, cluster_url, prefix)
        progress(f"deleted {deleted} keys under {prefix}:*")
        await backend.aclose()
        if cluster_backend is not None:
            await cluster_backend.aclose()
        if cluster_raw is not None:
            await cluster_raw.aclose()
        await raw.aclose()


if __name__ == "__main__":
    run_main(main)
