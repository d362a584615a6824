"""The lone caller: one task awaiting ``FixedWindow.hit`` in a loop, against the C client's
one-connection round trip, and the pieces between the two.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_lone.py [--before DIR]
    LOOP=uvloop .venv/bin/python benchmarks/bench_lone.py [--before DIR]

Each condition runs ``BLOCK`` sequential calls at a time, the conditions interleaved block by
block in an order that rotates, ``BLOCKS`` blocks each per repetition; figures are medians
over the repetitions, ratios medians of per-repetition ratios:

- ``C``: ``redis-benchmark -c 1 -P 1`` sending the floor's EVALSHA (the minimal fixed
  window: INCR, PEXPIRE on the first hit, PTTL), one connection, one command at a time;
- ``C, ours``: the same client sending the exact EVALSHA a ``FixedWindow.hit`` sends (the
  user's key made random): the server's share of the difference;
- ``raw``: a bare ``asyncio.Protocol`` over hiredis sending the floor's EVALSHA, awaiting
  each reply: the least an event loop pays per round trip;
- ``raw + ECHO``: the same with an ECHO in the same write and both replies read before
  the caller gets its own, as the wire's guard against a lost reply does;
- ``raw, our script + ECHO``: the same bare connection sending the exact EVALSHA a hit
  sends, and the ECHO: the asyncio floor of our command;
- ``store``: that EVALSHA through the backend's store (``backend._run``: the gate, the
  packing, the wire with its tag, its FIFO and its timer), the keys and arguments given;
- ``ours``: ``FixedWindow.hit`` on ``Backend.from_url``, everything admitted;
- ``before`` (``--before DIR``): the same ``hit`` by the package of another checkout
  ``DIR`` (loaded under another name beside this one), for an A/B of two trees measured
  side by side in one process.

Beside each: wall-clock µs per call, the client's CPU per call (this process's; for
redis-benchmark, its own) and the server's (``INFO CPU``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import resource
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import harness as h
import hiredis

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script
from aioratelimit._stores.resp import pack

RATE = "1000000000/hour"  # every hit admitted
#: Sequential calls per block, and blocks per condition per repetition: short blocks, so
#: that conditions measured side by side see the same load (redis-benchmark's own rate is
#: timed to the ms: 500 calls are 20-50 ms, its median over the blocks is what counts).
BLOCK = h.scaled(500, 20)
BLOCKS = 8
#: The user key of the captured hit, replaced by redis-benchmark's random number.
MARK = "bench-user-key"
ECHO = b"*2\r\n$4\r\nECHO\r\n$26\r\narl-0123456789abcdef:12345\r\n"


def resp(*parts: bytes | str | int) -> bytes:
    """A command in RESP."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


class Raw(asyncio.Protocol):
    """A bare connection: one write per call, its replies parsed by hiredis, the caller's
    future set once ``need`` replies have come (no batching, no guard, no timer)."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader()
        self._waiter: asyncio.Future[Any] | None = None
        self._need = 0
        self._got: list[Any] = []
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            self._got.append(reply)
            if len(self._got) == self._need and self._waiter is not None:
                waiter, self._waiter = self._waiter, None
                got, self._got = self._got, []
                waiter.set_result(got[0])

    def call(self, data: bytes, need: int = 1) -> asyncio.Future[Any]:
        assert self._transport is not None
        self._need = need
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(data)
        return self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def load_before(tree: Path, scratch: Path) -> Any:
    """The package of checkout ``tree``, imported as ``aioratelimit_before``: a copy of its
    ``aioratelimit`` (the ``lua`` link followed) that reads its scripts from itself."""
    target = scratch / "before" / "aioratelimit_before"
    shutil.copytree(tree / "aioratelimit", target, ignore=shutil.ignore_patterns("__pycache__"))
    scripts = target / "_scripts.py"
    source = scripts.read_text(encoding="utf-8")
    if 'files("aioratelimit")' not in source:
        raise SystemExit(f"{tree}: its _scripts.py does not read files('aioratelimit')")
    scripts.write_text(source.replace('files("aioratelimit")', 'files("aioratelimit_before")'))
    sys.path.insert(0, str(target.parent))
    return importlib.import_module("aioratelimit_before")


async def captured(
    backend: arl.Backend, limiter: arl.FixedWindow
) -> tuple[Script, list[str], tuple[Arg, ...]]:
    """The script, keys and arguments of a hit (of user key ``MARK``)."""
    seen: list[tuple[Script, list[str], tuple[Arg, ...]]] = []

    def capture(script: Script, keys: Any, args: Any, _: Reply) -> None:
        seen.append((script, list(keys), tuple(args)))

    with h.intercept(backend, capture):
        await limiter.hit(MARK)
    (call,) = seen
    return call


Block = Callable[[int], Awaitable[h.Sample]]


def c_block(lab: h.Lab, command: list[str]) -> Block:
    """``redis-benchmark -c 1 -P 1`` for a block, its own CPU as the client's."""

    async def block(_: int) -> h.Sample:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        sample = h.redis_benchmark(lab.redis, command, 1, 1, BLOCK, lab.meter)
        if sample is None:
            raise SystemExit("redis-benchmark not found (redis-tools): it is the reference here")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return h.Sample(sample.ops, sample.seconds, cpu, sample.server)

    return block


def timed(lab: h.Lab, op: Callable[[int], Awaitable[object]]) -> Block:
    """``BLOCK`` sequential awaits of ``op``, timed."""

    async def block(first: int) -> h.Sample:
        server = lab.meter.read()
        cpu, start = time.process_time(), time.perf_counter()
        for i in range(first, first + BLOCK):
            await op(i)
        spent, cpu = time.perf_counter() - start, time.process_time() - cpu
        return h.Sample(BLOCK, spent, cpu, lab.meter.since(server))

    return block


async def main(lab: h.Lab, before: Any) -> None:
    backend = h.our_backend(lab.url, lab.prefix)
    limiter = arl.FixedWindow(RATE, backend=backend)
    old_backend = old = None
    if before is not None:
        old_backend = before.Backend.from_url(lab.url, prefix=f"{lab.prefix}b")
        old = before.FixedWindow(RATE, backend=old_backend)
    loop = asyncio.get_running_loop()
    _, raw = await loop.create_connection(Raw, "127.0.0.1", lab.redis.port)
    try:
        sha = (await raw.call(resp("SCRIPT", "LOAD", h.FLOOR_LUA))).decode()
        floor = [resp("EVALSHA", sha, 1, f"{lab.prefix}:raw:{i}", h.WINDOW_MS) for i in range(1000)]
        script, keys, args = await captured(backend, limiter)
        ours_c = ["EVALSHA", script.sha, str(len(keys)), *keys, *map(str, args)]
        ours_c = [part.replace(MARK, "__rand_int__") for part in ours_c]
        user_keys = [[k.replace(MARK, f"s{i}") for k in keys] for i in range(1000)]
        packed = [pack(script.evalsha_head, k, args) + ECHO for k in user_keys]
        run = h.run_script(backend)
        cases: dict[str, Block] = {
            "C": c_block(lab, h.floor_command(sha, lab.prefix)),
            "C, our script": c_block(lab, ours_c),
            "raw": timed(lab, lambda i: raw.call(floor[i % 1000])),
            "raw + ECHO": timed(lab, lambda i: raw.call(floor[i % 1000] + ECHO, 2)),
            "raw, our script + ECHO": timed(lab, lambda i: raw.call(packed[i % 1000], 2)),
            "store": timed(lab, lambda i: run(script, user_keys[i % 1000], args)),
            "ours": timed(lab, lambda i: limiter.hit(f"k{i % 1000}")),
        }
        if old is not None:
            cases["before"] = timed(lab, lambda i: old.hit(f"k{i % 1000}"))
        for name, block in cases.items():  # warm every path (scripts loaded, connections)
            if not name.startswith("C"):
                await block(0)
        reps = h.Reps()
        for rep in range(h.REPS):
            h.progress(f"repetition {rep + 1}/{h.REPS}")
            samples = {name: h.Sample(0, 0.0, 0.0, h.Cpu()) for name in cases}
            names = list(cases)
            for b in range(BLOCKS):
                turn = (rep + b) % len(names)
                for name in names[turn:] + names[:turn]:
                    samples[name] += await cases[name](b * BLOCK)
            reps.append(samples)
        report(reps, list(cases))
    finally:
        raw.close()
        await backend.aclose()
        if old_backend is not None:
            await old_backend.aclose()


def report(reps: h.Reps, names: list[str]) -> None:
    before = "before" in names
    rows = [
        [
            name,
            reps.rate(name),
            reps.speed(name, "C"),
            *([reps.speed(name, "before")] if before else []),
            reps.latency(name),
            reps.client(name),
            reps.server(name),
        ]
        for name in names
    ]
    h.print_table(
        f"One caller, one call at a time: medians of {h.REPS} repetitions (min-max)",
        ["condition", "calls/s", "÷ C", *(["÷ before"] if before else []), "µs per call",
         "client CPU µs", "server CPU µs"],
        rows,
    )  # fmt: skip
    h.print_notes(
        f"{BLOCKS} blocks of {BLOCK} calls per condition per repetition, interleaved."
        " ÷ C: the median of per-repetition ratios to `redis-benchmark -c 1 -P 1` (C)."
    )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--before", type=Path, metavar="DIR", help="another checkout to A/B")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    with h.started() as lab:
        package = None if arguments.before is None else load_before(arguments.before, lab.scratch)
        extra = [("before", str(arguments.before))] if arguments.before is not None else []
        h.print_header("The lone caller", lab, ("aioratelimit", "redis", "hiredis"), extra)
        h.run_loop(main(lab, package))
        if h.REPS < h.MIN_REPS:
            h.print_notes(f"**Smoke run** (REPS={h.REPS} < {h.MIN_REPS}): not a measurement.")
