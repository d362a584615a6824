"""One-shot tokens and idempotency keys, side by side with the raw EVALSHA floor.

Run (the script starts no server; it writes keys only under a prefix unique to the run and
deletes them at the end)::

    REDIS_URL=redis://127.0.0.1:6391/0 .venv/bin/python benchmarks/bench_idempotency.py

Conditions, all on the default asyncio event loop:

- raw: ``redis.asyncio`` EVALSHA of the minimal fixed-window script (INCR; PEXPIRE when the
  count is 1; return the count and PTTL), the floor any one-script operation pays;
- ``consume_token``: a fresh token each time (issued beforehand, untimed), so every call
  answers True and deletes its record;
- ``@idempotent`` replay: a decorated function called with keys whose result is stored
  (completed beforehand, untimed), so every call is one claim script that returns it;
- for reference (no target): ``issue_token``, and the first call of ``@idempotent`` (claim,
  run an empty body, complete: two scripts, plus the background renewal task);
- "script alone": our token_consume and idem_claim scripts by EVALSHA on the raw client, and
  "via backend.run": the same scripts through our backend with the keys built beforehand;
  they split each of ours into the script's cost, the backend's and the primitive's.

Sequential runs are interleaved in blocks; the 64-task runs chunk by chunk. Then the round
trips per operation are counted twice: on the client (every command our backend's client
sends) and on the server (EVALSHA calls in ``INFO commandstats``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

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

import aioratelimit as arl
from aioratelimit import _keys, _scripts
from aioratelimit._idempotency.tokens import _key as token_key
from aioratelimit._stores.wire import Wire

WINDOW_MS = 60_000
REPLAY_KEYS = 100  # completed idempotency keys the replay condition cycles over

SEQ_N = scaled(3000, 20)  # sequential operations per condition per repetition
SEQ_BLOCK = min(150, SEQ_N)
TASKS = 64
PER_TASK = scaled(16, 2)  # one chunk = TASKS * PER_TASK operations
CHUNKS = scaled(10, 2)  # chunks per condition per repetition
COUNT_N = scaled(1000, 20)  # operations whose round trips are counted

TARGETS = ("consume_token", "idempotent replay")
REFERENCE = ("issue_token", "idempotent first call")
ALONE = ("token_consume.lua alone", "idem_claim.lua alone")
VIA_RUN = ("token_consume.lua via backend.run", "idem_claim.lua via backend.run")
CONDITIONS = ("raw", *TARGETS, *REFERENCE, *ALONE, *VIA_RUN)


async def issue_many(n: int, backend: arl.Backend) -> list[str]:
    """``n`` fresh tokens, issued 256 at a time (untimed)."""
    tokens: list[str] = []
    while len(tokens) < n:
        batch = min(256, n - len(tokens))
        tokens += await asyncio.gather(
            *(arl.issue_token(ttl=600, backend=backend) for _ in range(batch))
        )
    return tokens


class Bench:
    """The clients, decorated functions and per-condition operation builders of one run."""

    def __init__(self, url: str, prefix: str) -> None:
        self.prefix = prefix
        self.raw = aredis.Redis.from_url(url)
        # As many connections as the raw client opens for 64 tasks (its pool is unbounded).
        self.backend = arl.Backend.from_url(url, prefix=prefix, max_connections=TASKS)
        self.floor_sha = ""
        self.wrong: dict[str, int] = {}

        @arl.idempotent(key=lambda k: k, backend=self.backend)
        async def fetch(k: str) -> dict[str, Any]:
            return {"id": k, "status": "paid", "amount": 1250}

        self.fetch = fetch

    async def setup(self) -> None:
        self.floor_sha = await self.raw.script_load(FLOOR_LUA)
        for script in (_scripts.TOKEN_CONSUME, _scripts.IDEM_CLAIM):
            await self.raw.script_load(script.source)
        for k in range(REPLAY_KEYS):
            await self.fetch(f"r{k}")

    async def aclose(self) -> None:
        await delete_prefix(self.raw, self.prefix)
        await self.backend.aclose()
        await self.raw.aclose()

    def check(self, name: str, ok: bool) -> None:
        if not ok:
            self.wrong[name] = self.wrong.get(name, 0) + 1

    async def ops(self, tag: str, total: int) -> dict[str, Op]:
        """One operation per condition; ``op(i)`` for ``i`` in ``range(total)``."""
        raw, backend, check, fetch = self.raw, self.backend, self.check, self.fetch
        floor_sha, head = self.floor_sha, f"{self.prefix}:raw:{tag}"
        tokens = await issue_many(3 * total, backend)
        mine = tokens[:total]
        alone_keys = [token_key(backend, t) for t in tokens[total : 2 * total]]
        run_keys = [token_key(backend, t) for t in tokens[2 * total :]]
        idem_head = backend._head(_keys.IDEMPOTENCY_KIND)
        claim_keys = [_keys.idempotency(idem_head, f"r{k}")[0] for k in range(REPLAY_KEYS)]
        consume_sha, claim_sha = _scripts.TOKEN_CONSUME.sha, _scripts.IDEM_CLAIM.sha
        paid = {"status": "paid", "amount": 1250}

        async def floor(i: int) -> None:
            reply = await raw.evalsha(floor_sha, 1, f"{head}{i % 100}", WINDOW_MS)
            check("raw", reply[0] >= 1)

        async def consume(i: int) -> None:
            check("consume_token", await arl.consume_token(mine[i], backend=backend))

        async def replay(i: int) -> None:
            k = f"r{i % REPLAY_KEYS}"
            check("idempotent replay", await fetch(k) == {**paid, "id": k})

        async def issue(i: int) -> None:
            check("issue_token", len(await arl.issue_token(ttl=60, backend=backend)) >= 22)

        async def first(i: int) -> None:
            k = f"f{tag}:{i}"
            check("idempotent first call", (await fetch(k))["id"] == k)

        async def consume_alone(i: int) -> None:
            check(ALONE[0], await raw.evalsha(consume_sha, 1, alone_keys[i], "") == 1)

        async def claim_alone(i: int) -> None:
            reply = await raw.evalsha(claim_sha, 1, claim_keys[i % REPLAY_KEYS], "o", "", 10**7)
            check(ALONE[1], reply[0] == 2)

        run = backend._run
        consume_script, claim_script = _scripts.TOKEN_CONSUME, _scripts.IDEM_CLAIM

        async def consume_run(i: int) -> None:
            check(VIA_RUN[0], await run(consume_script, (run_keys[i],), ("",)) == 1)

        async def claim_run(i: int) -> None:
            reply = await run(claim_script, (claim_keys[i % REPLAY_KEYS],), ("o", "", 10**7))
            check(VIA_RUN[1], reply[0] == 2)

        cases = (
            floor, consume, replay, issue, first, consume_alone, claim_alone, consume_run, claim_run
        )  # fmt: skip
        return dict(zip(CONDITIONS, cases, strict=True))


async def redis_reps(bench: Bench) -> list[dict[str, float]]:
    """Every repetition's figures: ``<condition>|seq`` in s/op, ``<condition>|c64`` ops/s."""
    # Warm-up: opens the pooled connections; every token is consumed once only.
    await interleave(await bench.ops("w", 100), 100, 20)
    warm = await bench.ops("wc", TASKS)
    await interleave({k: fan_out(op, TASKS, 1) for k, op in warm.items()}, 1, 1)
    per_chunk = TASKS * PER_TASK
    reps = []
    for rep in range(REPS):
        seq = await interleave(await bench.ops(f"s{rep}", SEQ_N), SEQ_N, SEQ_BLOCK, rep)
        chunks = {
            k: fan_out(op, TASKS, PER_TASK)
            for k, op in (await bench.ops(f"c{rep}", CHUNKS * per_chunk)).items()
        }
        conc = await interleave(chunks, CHUNKS, 1, rep)
        if bench.wrong:
            raise SystemExit(f"some operations did not answer as expected: {bench.wrong}")
        figures = {f"{k}|seq": v for k, v in seq.items()}
        figures.update({f"{k}|c64": per_chunk / v for k, v in conc.items()})
        reps.append(figures)
        progress(f"redis rep {rep + 1}/{REPS} done")
    return reps


async def round_trips(bench: Bench) -> list[list[str]]:
    """Per operation: commands the client wrote, and EVALSHA/EVAL calls the server counted.

    Commands are counted where each client path hands them to its socket: redis-py writes
    a command with one ``StreamWriter.writelines`` (or ``write``), our backend hands each
    to its wire with one ``Wire.send`` (which may join others' in one socket write)."""
    sent = 0
    write, writelines = asyncio.StreamWriter.write, asyncio.StreamWriter.writelines
    wire_send = Wire.send

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

    rows = []
    ops = await bench.ops("n", COUNT_N)
    for name in ("raw", *TARGETS, *REFERENCE):
        op = ops[name]
        before = await scripts_run()
        sent = 0
        asyncio.StreamWriter.write = counting_write  # type: ignore[method-assign]
        asyncio.StreamWriter.writelines = counting_writelines  # type: ignore[method-assign]
        Wire.send = counting_send  # type: ignore[method-assign]
        try:
            for i in range(COUNT_N):
                await op(i)
        finally:
            asyncio.StreamWriter.write = write  # type: ignore[method-assign]
            asyncio.StreamWriter.writelines = writelines  # type: ignore[method-assign]
            Wire.send = wire_send  # type: ignore[method-assign]
        after = await scripts_run()
        rows.append([name, fmt(sent / COUNT_N, 2), fmt((after - before) / COUNT_N, 2)])
    return rows


def report(figs: Sequence[dict[str, float]], trips: list[list[str]]) -> None:
    us = 1e6
    raw_seq, raw_c64 = column(figs, "raw|seq"), column(figs, "raw|c64")
    labels = {"raw": "raw floor: redis.asyncio EVALSHA"}
    rows = []
    for name in CONDITIONS:
        seq, c64 = column(figs, f"{name}|seq"), column(figs, f"{name}|c64")
        label = labels.get(name, f"**{name}**" if name in TARGETS else name)
        rows.append([
            label,
            with_spread([x * us for x in seq]),
            ratio(paired_ratio(raw_seq, seq)),
            with_spread(c64),
            ratio(paired_ratio(c64, raw_c64)),
        ])  # fmt: skip
    print_table(
        f"Redis: one operation per call, medians of {REPS} repetitions (min-max)",
        ["operation", "sequential µs/op", "seq speed ÷ raw", "64 tasks ops/s",
         "64-task speed ÷ raw"],
        rows,
    )  # fmt: skip

    rows = []
    for name, lua, via in zip(TARGETS, ALONE, VIA_RUN, strict=True):
        seq = column(figs, f"{name}|seq")
        lua_seq, via_seq = column(figs, f"{lua}|seq"), column(figs, f"{via}|seq")

        def diff(a: list[float], b: list[float]) -> str:
            return fmt(median([(x - y) * us for x, y in zip(a, b, strict=True)]))

        rows.append([name, diff(lua_seq, raw_seq), diff(via_seq, lua_seq), diff(seq, via_seq),
                     ratio(paired_ratio(lua_seq, seq))])  # fmt: skip
    print_table(
        "Redis: where the time goes, sequential µs/op (medians of per-repetition differences)",
        ["operation", "our script over the floor's", "our backend over the raw client",
         "the primitive over backend.run", "ours ÷ script alone (speed)"],
        rows,
    )  # fmt: skip

    print_table(
        f"Round trips per operation ({COUNT_N} sequential operations each)",
        ["operation", "commands the client wrote", "EVALSHA/EVAL the server ran"],
        trips,
    )

    def target(what: str, value: float) -> list[str]:
        return [what, "≥ 0.90", f"{value:.3f}", "yes" if value >= 0.90 else "**no**"]

    rows = []
    for name in TARGETS:
        rows.append(target(f"{name} sequential speed ÷ raw",
                           paired_ratio(raw_seq, column(figs, f"{name}|seq"))))  # fmt: skip
        rows.append(target(f"{name} 64-task throughput ÷ raw",
                           paired_ratio(column(figs, f"{name}|c64"), raw_c64)))  # fmt: skip
    for row in trips:
        if row[0] in TARGETS:
            ok = row[1] == row[2] == "1.00"
            rows.append([f"{row[0]} round trips (client / server)", "1",
                         f"{row[1]} / {row[2]}", "yes" if ok else "**no**"])  # fmt: skip
    print_table("Targets (issue 4)", ["target", "goal", "measured", "met"], rows)
    print_notes(
        f"Method. Sequential: the conditions run interleaved in blocks of {SEQ_BLOCK} "
        f"operations, in an order that rotates every block, {SEQ_N} each per repetition. "
        f"64 tasks: one chunk of {TASKS} tasks x {PER_TASK} operations per condition in "
        f"turn, {CHUNKS} chunks each per repetition. Ratios are medians of per-repetition "
        f"ratios. Our backend is `Backend.from_url(REDIS_URL, max_connections={TASKS})`, as many "
        f"connections as the raw client (`redis.asyncio.Redis.from_url(REDIS_URL)`, an "
        f"unbounded pool) opens for {TASKS} tasks. Every operation's answer is "
        "checked (each consume True, each replay the stored result). A replay does more "
        "than the floor: its script returns the stored result (a 41-byte JSON object here) "
        "and the decorator decodes it. Round trips: the "
        "server column is the EVALSHA + EVAL calls in `INFO commandstats` over the run, so "
        "it would also count another client's scripts (the server should be otherwise idle).",
    )
    print_smoke_note()


async def main() -> None:
    url = redis_url()
    prefix = bench_prefix()
    bench = Bench(url, prefix)
    try:
        server = await bench.raw.info("server")
        await bench.setup()
        figs = await redis_reps(bench)
        trips = await round_trips(bench)
    finally:
        await bench.aclose()
    print_header("Idempotency benchmark: one-shot tokens and idempotency keys", server,
                 ["aioratelimit", "redis", "hiredis"])  # fmt: skip
    report(figs, trips)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
