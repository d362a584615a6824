"""One-shot tokens and idempotency keys, side by side with the raw EVALSHA floor.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_idempotency.py

Conditions, sequential (interleaved in blocks) and with 64 concurrent tasks (crowd by
crowd), the server's CPU read around each:

- raw: ``redis.asyncio`` EVALSHA of the minimal fixed-window script, the floor any
  one-script operation pays;
- ``consume_token``: a fresh token each time (issued beforehand, untimed), so every call
  answers True and deletes its record;
- ``@idempotent`` replay: a decorated function called with keys whose result is stored
  (completed beforehand, untimed), so every call is one claim script that returns it;
- for reference: ``issue_token``, and the first call of ``@idempotent`` (claim, run an
  empty body, complete: two scripts, plus the background renewal task).

Then the round trips per operation, counted twice: on the client (every command a client
path hands to its socket) and on the server (EVALSHA calls in ``INFO commandstats``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import harness as h

import aioratelimit as arl
from aioratelimit._stores.wire import Wire

REPLAY_KEYS = 100  # completed idempotency keys the replay condition cycles over
SEQ_N = h.scaled(3000, 20)  # sequential operations per condition per repetition
SEQ_BLOCK = min(150, SEQ_N)
TASKS = 64
PER_TASK = h.scaled(16, 2)  # one crowd = TASKS * PER_TASK operations
CHUNKS = h.scaled(10, 2)  # crowds per condition per repetition
COUNT_N = h.scaled(1000, 20)  # operations whose round trips are counted

TARGETS = ("consume_token", "idempotent replay")
CONDITIONS = ("raw", *TARGETS, "issue_token", "idempotent first call")


class Bench:
    """The clients, decorated function and per-condition operations of one run."""

    def __init__(self, lab: h.Lab) -> None:
        self.lab = lab
        self.raw = h.raw_client(lab.url)
        self.backend = h.our_backend(lab.url, lab.prefix)
        self.floor_sha = ""
        self.wrong: dict[str, int] = {}

        @arl.idempotent(key=lambda k: k, backend=self.backend)
        async def fetch(k: str) -> dict[str, Any]:
            return {"id": k, "status": "paid", "amount": 1250}

        self.fetch = fetch

    async def setup(self) -> None:
        self.floor_sha = await h.load_floor(self.raw)
        for k in range(REPLAY_KEYS):
            await self.fetch(f"r{k}")

    async def aclose(self) -> None:
        await self.backend.aclose()
        await self.raw.aclose()

    def check(self, name: str, ok: bool) -> None:
        if not ok:
            self.wrong[name] = self.wrong.get(name, 0) + 1

    async def ops(self, tag: str, total: int) -> dict[str, h.Op]:
        """One operation per condition; ``op(i)`` for ``i`` in ``range(total)``."""
        backend, check, fetch = self.backend, self.check, self.fetch
        tokens: list[str] = []
        while len(tokens) < total:  # untimed, 256 at a time
            batch = min(256, total - len(tokens))
            tokens += await asyncio.gather(
                *(arl.issue_token(ttl=600, backend=backend) for _ in range(batch))
            )
        paid = {"status": "paid", "amount": 1250}

        async def consume(i: int) -> None:
            check("consume_token", await arl.consume_token(tokens[i], backend=backend))

        async def replay(i: int) -> None:
            k = f"r{i % REPLAY_KEYS}"
            check("idempotent replay", await fetch(k) == {**paid, "id": k})

        async def issue(i: int) -> None:
            check("issue_token", len(await arl.issue_token(ttl=60, backend=backend)) >= 22)

        async def first(i: int) -> None:
            k = f"f{tag}:{i}"
            check("idempotent first call", (await fetch(k))["id"] == k)

        floor = h.floor_op(self.raw, self.floor_sha, f"{self.lab.prefix}:raw:{tag}:", 100)
        return dict(zip(CONDITIONS, (floor, consume, replay, issue, first), strict=True))


async def timed(bench: Bench) -> h.Reps:
    """Every repetition's ``<condition>|seq`` and ``<condition>|c64`` samples."""
    meter = bench.lab.meter
    await h.interleave(await bench.ops("w", 100), 100, 20)  # warm-up: scripts, connections
    await h.crowds(await bench.ops("wc", TASKS), TASKS, 1, 1)
    reps = h.Reps()
    for rep in range(h.REPS):
        seq = await h.interleave(await bench.ops(f"s{rep}", SEQ_N), SEQ_N, SEQ_BLOCK, rep, meter)
        cases = await bench.ops(f"c{rep}", CHUNKS * TASKS * PER_TASK)
        c64 = await h.crowds(cases, TASKS, PER_TASK, CHUNKS, rep, meter)
        if bench.wrong:
            raise SystemExit(f"some operations did not answer as expected: {bench.wrong}")
        reps.append(
            {f"{k}|seq": v for k, v in seq.items()} | {f"{k}|c64": v for k, v in c64.items()}
        )
        h.progress(f"redis rep {rep + 1}/{h.REPS} done")
    return reps


async def round_trips(bench: Bench) -> dict[str, tuple[float, float]]:
    """Per operation: commands the client wrote, and EVALSHA/EVAL calls the server ran.

    Commands are counted where each client path hands them to its socket: redis-py writes
    a command with one ``StreamWriter.writelines`` (or ``write``), our backend hands each
    to its wire with one ``Wire.send`` (which may join others' in one socket write)."""
    sent = 0
    write, writelines, wire_send = (
        asyncio.StreamWriter.write, asyncio.StreamWriter.writelines, Wire.send
    )  # fmt: skip

    def counting_send(
        self: Wire, data: bytes, *, preface: bytes | None = None
    ) -> asyncio.Future[Any]:
        nonlocal sent
        sent += 1
        return wire_send(self, data, preface=preface)

    def counting_write(self: asyncio.StreamWriter, data: Any) -> None:
        nonlocal sent
        sent += 1
        write(self, data)

    def counting_writelines(self: asyncio.StreamWriter, data: Any) -> None:
        nonlocal sent
        sent += 1
        writelines(self, data)

    async def scripts_run() -> int:
        stats = await bench.raw.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))

    counts = {}
    ops = await bench.ops("n", COUNT_N)
    for name in CONDITIONS:
        before = await scripts_run()
        sent = 0
        asyncio.StreamWriter.write = counting_write  # type: ignore[method-assign]
        asyncio.StreamWriter.writelines = counting_writelines  # type: ignore[method-assign]
        Wire.send = counting_send  # type: ignore[method-assign]
        try:
            for i in range(COUNT_N):
                await ops[name](i)
        finally:
            asyncio.StreamWriter.write = write  # type: ignore[method-assign]
            asyncio.StreamWriter.writelines = writelines  # type: ignore[method-assign]
            Wire.send = wire_send  # type: ignore[method-assign]
        counts[name] = (sent / COUNT_N, (await scripts_run() - before) / COUNT_N)
    return counts


def report(reps: h.Reps, trips: dict[str, tuple[float, float]]) -> None:
    rows = []
    for name in CONDITIONS:
        label = "raw floor: redis.asyncio EVALSHA" if name == "raw" else name
        rows.append([
            f"**{label}**" if name in TARGETS else label,
            reps.latency(f"{name}|seq"),
            reps.speed(f"{name}|seq", "raw|seq"),
            reps.rate(f"{name}|c64"),
            reps.speed(f"{name}|c64", "raw|c64"),
            f"{reps.server(f'{name}|seq')} / {reps.server(f'{name}|c64')}",
            f"{trips[name][0]:.2f} / {trips[name][1]:.2f}",
        ])  # fmt: skip
    h.print_table(
        f"One operation per call, medians of {h.REPS} repetitions (min-max)",
        ["operation", "sequential µs/op", "seq speed ÷ raw", "64 tasks ops/s",
         "64-task speed ÷ raw", "server CPU µs/op (seq / 64 tasks)",
         "round trips (client writes / server scripts)"],
        rows,
    )  # fmt: skip
    h.print_notes(
        f"Sequential: the conditions interleaved in blocks of {SEQ_BLOCK} operations, in an"
        f" order rotating every block, {SEQ_N} each per repetition. 64 tasks: one crowd of"
        f" {TASKS} tasks x {PER_TASK} operations per condition in turn, {CHUNKS} crowds each"
        " per repetition. Ratios are medians of per-repetition ratios; every answer is"
        " checked (each consume True, each replay the stored result, a 41-byte JSON object"
        " here, which the decorator decodes). Server CPU: `INFO CPU` deltas around each"
        f" block, per operation (the main thread did {reps.main_share()} of it).",
        f"Round trips, over {COUNT_N} sequential operations each: the commands the client"
        " handed to its socket (redis-py's `StreamWriter` writes, our wire's sends), and the"
        " EVALSHA + EVAL calls in `INFO commandstats`.",
    )


async def main(lab: h.Lab) -> None:
    bench = Bench(lab)
    try:
        await bench.setup()
        reps = await timed(bench)
        trips = await round_trips(bench)
    finally:
        await bench.aclose()
    report(reps, trips)


if __name__ == "__main__":
    h.run(main, "Idempotency: one-shot tokens and idempotency keys against the raw floor")
