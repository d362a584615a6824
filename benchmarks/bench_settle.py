"""What a settlement costs: ``Reservation.settle`` against a plain hit, on each limiter.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_settle.py

Conditions per limiter (``FixedWindow``, ``SlidingWindow``, ``TokenBucket``, one rate of
10^9 per hour, 1000 user keys), sequential (interleaved in blocks) and with 64 concurrent
tasks (crowd by crowd), the server's CPU read around each:

- ``hit``: ``limiter.hit(key, 5)``, the reference;
- ``settle``: one settlement of a reservation taken beforehand (untimed), settled below its
  estimate and awaited: ``r.settle(2); await r.wait()``, its refund script with the record
  that makes it safe to send twice (one more key written, with a TTL);
- ``reserve + settle``: the whole cycle a caller pays for, ``await limiter.reserve(key,
  5)``, then that settlement (the caller itself waits for the hit only).
"""

from __future__ import annotations

import harness as h

import aioratelimit as arl

KEYS = 1000
SEQ_N = h.scaled(3000, 20)  # sequential operations per condition per repetition
SEQ_BLOCK = min(150, SEQ_N)
TASKS = 64
PER_TASK = h.scaled(16, 2)  # one crowd = TASKS * PER_TASK operations
CHUNKS = h.scaled(10, 2)  # crowds per condition per repetition
LIMITERS = ("FixedWindow", "SlidingWindow", "TokenBucket")
CONDITIONS = ("hit", "settle", "reserve + settle")
RATE = "1000000000/hour"


class Bench:
    def __init__(self, lab: h.Lab) -> None:
        self.backend = h.our_backend(lab.url, lab.prefix)
        self.limiters: dict[str, arl.Limiter] = {
            "FixedWindow": arl.FixedWindow(RATE, backend=self.backend),
            "SlidingWindow": arl.SlidingWindow(RATE, backend=self.backend),
            "TokenBucket": arl.TokenBucket(RATE, backend=self.backend),
        }
        self.wrong = 0

    async def ops(self, tag: str, total: int) -> dict[str, h.Op]:
        """``<limiter>|<condition>`` -> ``op(i)`` for ``i`` in ``range(total)``."""
        cases: dict[str, h.Op] = {}
        for name, limiter in self.limiters.items():
            held = [await limiter.reserve(f"{tag}{i % KEYS}", 5) for i in range(total)]
            cases |= self.cases(name, limiter, tag, held)
        return cases

    def cases(
        self, name: str, limiter: arl.Limiter, tag: str, held: list[arl.Reservation]
    ) -> dict[str, h.Op]:
        async def hit(i: int) -> None:
            if not (await limiter.hit(f"{tag}{i % KEYS}", 5)).allowed:
                self.wrong += 1

        async def settle(i: int) -> None:
            r = held[i]
            r.settle(2)
            await r.wait()
            if r.state != "settled":
                self.wrong += 1

        async def cycle(i: int) -> None:
            r = await limiter.reserve(f"{tag}{i % KEYS}", 5)
            r.settle(2)
            await r.wait()
            if r.state != "settled":
                self.wrong += 1

        return {f"{name}|{c}": op for c, op in zip(CONDITIONS, (hit, settle, cycle), strict=True)}


async def timed(bench: Bench, lab: h.Lab) -> h.Reps:
    await h.interleave(await bench.ops("w", 100), 100, 20)  # warm-up: scripts, connections
    reps = h.Reps()
    for rep in range(h.REPS):
        seq = await h.interleave(
            await bench.ops(f"s{rep}:", SEQ_N), SEQ_N, SEQ_BLOCK, rep, lab.meter
        )
        cases = await bench.ops(f"c{rep}:", CHUNKS * TASKS * PER_TASK)
        c64 = await h.crowds(cases, TASKS, PER_TASK, CHUNKS, rep, lab.meter)
        if bench.wrong:
            raise SystemExit(f"{bench.wrong} operations did not answer as expected")
        reps.append(
            {f"{k}|seq": v for k, v in seq.items()} | {f"{k}|c64": v for k, v in c64.items()}
        )
        h.progress(f"rep {rep + 1}/{h.REPS} done")
    return reps


def report(reps: h.Reps) -> None:
    rows = []
    for name in LIMITERS:
        for condition in CONDITIONS:
            case = f"{name}|{condition}"
            rows.append([
                f"{name} {condition}",
                reps.latency(f"{case}|seq"),
                reps.speed(f"{case}|seq", f"{name}|hit|seq"),
                reps.rate(f"{case}|c64"),
                reps.speed(f"{case}|c64", f"{name}|hit|c64"),
                f"{reps.server(f'{case}|seq')} / {reps.server(f'{case}|c64')}",
            ])  # fmt: skip
    h.print_table(
        f"A settlement against a hit, medians of {h.REPS} repetitions (min-max)",
        ["operation", "sequential µs/op", "seq speed ÷ hit", "64 tasks ops/s",
         "64-task speed ÷ hit", "server CPU µs/op (seq / 64 tasks)"],
        rows,
    )  # fmt: skip
    h.print_notes(
        f"Sequential: the conditions interleaved in blocks of {SEQ_BLOCK} operations, in an"
        f" order rotating every block, {SEQ_N} each per repetition. 64 tasks: one crowd of"
        f" {TASKS} tasks x {PER_TASK} operations per condition in turn, {CHUNKS} crowds each"
        " per repetition. The reservations a `settle` settles are taken before the block,"
        " untimed. Ratios are medians of per-repetition ratios. Server CPU: `INFO CPU`"
        f" deltas around each block, per operation (the main thread did {reps.main_share()}"
        " of it).",
    )


async def main(lab: h.Lab) -> None:
    bench = Bench(lab)
    try:
        reps = await timed(bench, lab)
    finally:
        await bench.backend.aclose()
    report(reps)


if __name__ == "__main__":
    h.run(main, "Settlements: Reservation.settle against a hit")
