"""The hot path: what one decision costs, against the raw redis-py floor and the C client.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_transport.py

Every condition in every repetition, each decision admitted (the limit is far above the
run), so this is the cost of a decision:

- ``redis-benchmark`` (the C client) ``-c 1 -P 1`` and ``-c 50 -P 1`` running the floor's
  EVALSHA: one connection one command at a time, and 50 connections without pipelining;
- the raw floor: ``redis.asyncio`` EVALSHA of the same minimal fixed-window script,
  sequential and with 1, 2, 4 and 64 concurrent tasks (a connection per task);
- ours on one default ``Backend.from_url``: ``FixedWindow``, ``SlidingWindow`` and
  ``TokenBucket`` ``hit``, sequential; ``FixedWindow`` with 1, 2, 4, 64 and 256 tasks, the
  other two with 64; a lock's acquire + release, sequential and 64 tasks on distinct
  names; ``consume_token`` with 64 tasks;
- the server's limit for each script: ``redis-benchmark -c 50 -P 16`` (pipelined: the C
  client costs next to nothing, so the server runs flat out) sending the exact command a
  hit of each limiter sends (captured on its way out, the user's key made random), and the
  floor's. No client gets more decisions of that script out of this server.

Beside each figure: this process's CPU per decision (``time.process_time``: the event
loop and the kernel's share of the socket calls included; for redis-benchmark, its own)
and the server's (``INFO CPU`` deltas).
"""

from __future__ import annotations

from collections.abc import Sequence

import harness as h

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script

RATE = "1000000000/hour"  # every hit admitted
LIMITERS = ("FixedWindow", "SlidingWindow", "TokenBucket")
SEQ_N = h.scaled(2000, 20)
SEQ_BLOCK = min(100, SEQ_N)
#: A few tasks run CHUNKS chunks of tasks x PER_TASK decisions...
PER_TASK = h.scaled(16, 2)
CHUNKS = h.scaled(8, 1)
#: ...a crowd (64 tasks or more) one sustained run of this many decisions in all, as
#: redis-benchmark runs its C_N requests over its 50 connections.
C_N = h.scaled(20000, 200)
SUSTAINED = C_N
#: Requests of a run of the server's limit (-P 16: about a second at this server's pace).
LIMIT_N = h.scaled(150_000, 1_000)
LIMIT_PIPELINE = 16
#: The user key of the captured hits, replaced by redis-benchmark's random number.
MARK = "bench-user-key"
LOW = (1, 2, 4)


def c_client(lab: h.Lab, command: list[str], connections: int, pipeline: int, n: int) -> h.Sample:
    """``redis-benchmark`` on the run's server, its own CPU as the client's."""
    return h.c_client(lab.redis, command, connections, pipeline, n, lab.meter).sample


class Cases:
    """Every operation the run times, by name."""

    def __init__(self, lab: h.Lab, raw: object, sha: str, backend: arl.Backend) -> None:
        self.lab, self.raw, self.sha, self.backend = lab, raw, sha, backend
        self.limiters = {
            "FixedWindow": arl.FixedWindow(RATE, backend=backend),
            "SlidingWindow": arl.SlidingWindow(RATE, backend=backend),
            "TokenBucket": arl.TokenBucket(RATE, backend=backend),
        }
        self.tokens: list[str] = []

    async def sent(self, name: str) -> list[str]:
        """The EVALSHA a hit of limiter ``name`` sends, its user key made random for
        redis-benchmark (captured on its way to the store; the hit itself runs too)."""
        seen: list[list[str]] = []

        def capture(script: Script, keys: Sequence[str], args: Sequence[Arg], _: Reply) -> None:
            seen.append(["EVALSHA", script.sha, str(len(keys)), *keys, *map(str, args)])

        with h.intercept(self.backend, capture):
            await self.limiters[name].hit(MARK)
        (command,) = seen
        assert any(MARK in part for part in command), command
        return [part.replace(MARK, "__rand_int__") for part in command]

    def floor(self, tag: str) -> h.Op:
        return h.floor_op(self.raw, self.sha, f"{self.lab.prefix}:floor:{tag}:")

    def hit(self, name: str, tag: str) -> h.Op:
        hit = self.limiters[name].hit
        return lambda i: hit(f"{tag}:{i % 1000}")

    def lock(self, tag: str) -> h.Op:
        backend = self.backend

        async def op(i: int) -> None:
            lease = await arl.Lock(f"{tag}:{i}", ttl=10, backend=backend).acquire()
            await lease.release()

        return op

    async def issue(self, i: int) -> None:
        self.tokens.append(await arl.issue_token(ttl=600, backend=self.backend))

    def consume(self) -> h.Op:
        consume, tokens, backend = arl.consume_token, self.tokens, self.backend

        async def op(i: int) -> None:
            assert await consume(tokens.pop(), backend=backend)

        return op


def shape(tasks: int) -> tuple[int, int]:
    """(chunks, decisions per task) of a condition with ``tasks`` concurrent tasks."""
    if tasks < 64:
        return CHUNKS, PER_TASK
    return 1, max(PER_TASK, SUSTAINED // tasks)


def crowds(cases: Cases, rep: int) -> list[tuple[str, h.Op, int]]:
    """The conditions with tasks: (name, operation, tasks)."""
    return [
        *((f"raw|{n}", cases.floor(f"c{rep}{n}"), n) for n in (*LOW, 64)),
        *((f"FixedWindow|{n}", cases.hit("FixedWindow", f"c{rep}{n}"), n) for n in (*LOW, 64, 256)),
        ("SlidingWindow|64", cases.hit("SlidingWindow", f"c{rep}"), 64),
        ("TokenBucket|64", cases.hit("TokenBucket", f"c{rep}"), 64),
        ("lock|64", cases.lock(f"cl{rep}"), 64),
        ("consume_token|64", cases.consume(), 64),
    ]


async def repetition(cases: Cases, rep: int, commands: dict[str, list[str]]) -> dict[str, h.Sample]:
    lab = cases.lab
    floor = h.floor_command(cases.sha, lab.prefix)
    got = {f"C -c {n}": c_client(lab, floor, n, 1, C_N) for n in (1, 50)}
    for name, command in commands.items():
        got[f"limit|{name}"] = c_client(lab, command, 50, LIMIT_PIPELINE, LIMIT_N)
    sequential = {
        "raw": cases.floor(f"s{rep}"),
        **{name: cases.hit(name, f"s{rep}{name}") for name in LIMITERS},
        "lock": cases.lock(f"sl{rep}"),
    }
    seq = await h.interleave(sequential, SEQ_N, SEQ_BLOCK, rep, lab.meter)
    got |= {f"{name}|seq": sample for name, sample in seq.items()}
    cases.tokens.clear()
    await h.fan_out(cases.issue, 64, SUSTAINED // 64 + 1)(0)  # untimed: consume_token's
    conditions = crowds(cases, rep)
    first = rep % len(conditions)
    for name, op, tasks in conditions[first:] + conditions[:first]:
        # The C client right before each crowd: its ratio pairs two runs seconds apart
        # (this machine's speed drifts by up to 2x within a minute).
        got[f"C -c 50|{name}"] = c_client(lab, floor, 50, 1, C_N)
        chunks, per_task = shape(tasks)
        got |= await h.crowds({name: op}, tasks, per_task, chunks, meter=lab.meter)
    return got


def report(reps: h.Reps) -> None:
    rows: list[list[str]] = []

    def row(label: str, key: str, c: str | None, raw: str | None) -> None:
        rows.append([
            label,
            reps.rate(key),
            reps.speed(key, raw) if raw else "-",
            reps.speed(key, c) if c else "-",
            reps.client(key),
            reps.server(key, main=True),
        ])  # fmt: skip

    row("redis-benchmark -c 1 -P 1 (C)", "C -c 1", None, None)
    row("redis-benchmark -c 50 -P 1 (C)", "C -c 50", None, None)
    row("raw redis.asyncio EVALSHA, sequential", "raw|seq", "C -c 1", "raw|seq")
    for name in LIMITERS:
        row(f"ours {name}, sequential", f"{name}|seq", "C -c 1", "raw|seq")
    row("ours lock acquire + release, sequential", "lock|seq", "C -c 1", "raw|seq")
    for n in (*LOW, 64):
        c = "C -c 1" if n == 1 else None
        row(f"raw redis.asyncio, {n} tasks", f"raw|{n}", c or f"C -c 50|raw|{n}", f"raw|{n}")
        c = c or f"C -c 50|FixedWindow|{n}"
        row(f"ours FixedWindow, {n} tasks", f"FixedWindow|{n}", c, f"raw|{n}")
    row("ours FixedWindow, 256 tasks", "FixedWindow|256", "C -c 50|FixedWindow|256", None)
    for key, label in (
        ("SlidingWindow|64", "ours SlidingWindow, 64 tasks"),
        ("TokenBucket|64", "ours TokenBucket, 64 tasks"),
        ("lock|64", "ours lock acquire + release, 64 tasks (distinct names)"),
        ("consume_token|64", "ours consume_token, 64 tasks"),
    ):
        row(label, key, f"C -c 50|{key}", "raw|64")
    h.print_table(
        f"A decision: decisions/s, medians of {h.REPS} repetitions (min-max)",
        ["condition", "decisions/s", "÷ raw (same tasks)", "÷ C", "client CPU µs",
         "server CPU µs (process / main thread)"],
        rows,
    )  # fmt: skip

    limits = []
    for name in ("floor", *LIMITERS):
        key = f"limit|{name}"
        limits.append([
            "the floor's EVALSHA" if name == "floor" else f"{name}.hit's EVALSHA",
            reps.rate(key),
            reps.server(key, main=True),
            reps.speed(key, "C -c 50"),
            "-" if name == "floor" else reps.speed(f"{name}|64", key),
        ])  # fmt: skip
    h.print_table(
        f"The server's limit per script: redis-benchmark -c 50 -P {LIMIT_PIPELINE} sending"
        " the exact command",
        ["script", "calls/s", "server CPU µs (process / main thread)",
         "÷ C -c 50 (the most any client gets)", "ours, 64 tasks ÷ limit"],
        limits,
    )  # fmt: skip
    h.print_notes(
        "÷ raw: the speed over the raw floor with as many tasks. ÷ C: over redis-benchmark"
        " with one connection for one caller (sequential, 1 task), else over its -c 50 run"
        " made right before the crowd. Figures are medians over the repetitions; each ratio"
        " is the median of per-repetition ratios. CPU: µs per decision, medians; the"
        " client's is this process's (for redis-benchmark its own), the server's from"
        " `INFO CPU` deltas around each block.",
        f"Each repetition: redis-benchmark runs ({C_N} requests; the server's limits"
        f" {LIMIT_N} each), the sequential conditions interleaved in blocks of {SEQ_BLOCK}"
        f" ({SEQ_N} each), then each condition with tasks in turn, in an order rotating"
        f" every repetition: 1 to 4 tasks as {CHUNKS} chunks of tasks x {PER_TASK}"
        f" decisions, 64 tasks and more as one run of {SUSTAINED} decisions in all.",
        "Ours is one default `Backend.from_url(url)`: one multiplexed connection (plus one"
        " for wake-ups). The raw floor is `redis.asyncio.Redis.from_url(url,"
        " max_connections=1024)`: a connection per concurrent task.",
    )


async def main(lab: h.Lab) -> None:
    raw = h.raw_client(lab.url)
    backend = h.our_backend(lab.url, lab.prefix)
    try:
        cases = Cases(lab, raw, await h.load_floor(raw), backend)
        commands = {"floor": h.floor_command(cases.sha, lab.prefix)}
        commands |= {name: await cases.sent(name) for name in LIMITERS}
        reps = h.Reps()
        for rep in range(h.REPS):
            reps.append(await repetition(cases, rep, commands))
            h.progress(f"rep {rep + 1}/{h.REPS} done")
        report(reps)
    finally:
        await backend.aclose()
        await raw.aclose()


if __name__ == "__main__":
    h.run(main, "The hot path: the C client, the raw floor and ours, side by side")
