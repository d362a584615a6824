"""The example FastAPI service with and without ``RateLimitMiddleware``, side by side.

Run (it starts a redis-server and the three example servers on free loopback ports, and
stops them at the end)::

    .venv/bin/python benchmarks/bench_web.py

Conditions: ``examples/fastapi_app.py`` served by uvicorn (one worker, asyncio loop, h11),
``GET /items/1`` on

- baseline: ``--no-rate-limit`` (the app without the rate-limit middleware);
- middleware: the app as shipped, ``RateLimitMiddleware`` with its ``SlidingWindow`` (limit
  raised so that every request is admitted: this measures the cost of a decision, not of a
  denial) on the run's redis-server, adding the ``RateLimit`` fields to each response;
- middleware, memory://: the same on the embedded store, which separates the middleware's
  own work from the Redis round trip.

The load generator is bounded: ``CONNS`` keep-alive connections (default 16), each sending
its share of a fixed count of requests one after the other, on a small raw HTTP/1.1 client
written on asyncio streams. A full client such as httpx spends more CPU per request than
the server does, and on a small machine the load generator would then measure itself. The
servers are measured in interleaved blocks, in rotating order, the redis-server's CPU read
around each block; every response must be a 200, else the run aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import harness as h

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fastapi_app.py"

CONNS = int(os.environ.get("CONNS", "16"))
TOTAL = h.scaled(6000, CONNS * 2)  # requests per condition per repetition
BLOCK = max(CONNS, min(300, TOTAL // 4))  # requests per interleaved block
PATH = "/items/1"
#: High enough that the benchmark never gets a 429.
NO_DENIAL = "1000000000/minute"


class ExampleServer:
    """``python examples/fastapi_app.py`` on a free loopback port, stopped by PID."""

    def __init__(self, lab: h.Lab, label: str, url: str, *flags: str) -> None:
        self.label, self.port = label, h.free_port()
        argv = [sys.executable, str(EXAMPLE), "--port", str(self.port), "--prefix", lab.prefix]
        self.child = h.Child(
            f"the {label} example server on 127.0.0.1:{self.port}",
            [*argv, *flags],
            lab.scratch / f"web-{label}.log",
            env={**os.environ, "REDIS_URL": url},
        )

    async def ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.child.alive():
                raise SystemExit(f"the {self.label} server exited:\n{self.child.output()}")
            with contextlib.suppress(OSError):
                conn = await Conn.open(self.port)
                try:
                    if await conn.get("/health") == 200:
                        return
                finally:
                    await conn.close()
            if time.monotonic() > deadline:
                raise SystemExit(f"the {self.label} server did not answer:\n{self.child.output()}")
            await asyncio.sleep(0.1)


class Conn:
    """One keep-alive HTTP/1.1 connection that sends GETs one after the other."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int):
        self.reader, self.writer, self.port = reader, writer, port

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, port)

    async def get(self, path: str) -> int:
        """One request; its status (the body is read and dropped)."""
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self.reader.readexactly(length)
        return int(head[9:12])

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def load(conns: list[Conn], count: int) -> None:
    """``count`` requests spread over the connections. Aborts on a non-200."""
    share, extra = divmod(count, len(conns))

    async def worker(conn: Conn, n: int) -> None:
        for _ in range(n):
            status = await conn.get(PATH)
            if status != 200:
                raise SystemExit(f"GET {PATH} answered {status} on port {conn.port}")

    await asyncio.gather(*(worker(c, share + (i < extra)) for i, c in enumerate(conns)))


LABELS = {
    "baseline": "baseline (no middleware)",
    "middleware": "RateLimitMiddleware, Redis",
    "memory": "RateLimitMiddleware, memory://",
}


async def measure(lab: h.Lab, servers: dict[str, ExampleServer]) -> h.Reps:
    """Every repetition's samples of each server (interleaved blocks of requests)."""
    pools = {name: [await Conn.open(s.port) for _ in range(CONNS)] for name, s in servers.items()}

    def block(pool: list[Conn]) -> h.Op:
        return lambda i: load(pool, BLOCK)

    cases = {name: block(pool) for name, pool in pools.items()}
    reps = h.Reps()
    try:
        await h.interleave(cases, 1, 1)  # warm-up: connections, scripts, caches
        for rep in range(h.REPS):
            got = await h.interleave(cases, max(1, TOTAL // BLOCK), 1, rep, lab.meter)
            reps.append(
                {
                    k: h.Sample(s.ops * BLOCK, s.seconds, s.client_cpu, s.server)
                    for k, s in got.items()
                }
            )
            h.progress(
                f"rep {rep + 1}/{h.REPS}: "
                + ", ".join(f"{name} {s.per_s * BLOCK:,.0f} req/s" for name, s in got.items())
            )
    finally:
        for pool in pools.values():
            for conn in pool:
                await conn.close()
    return reps


def report(reps: h.Reps) -> None:
    base = [s.us for s in reps.of("baseline")]
    rows = []
    for name, label in LABELS.items():
        mine = [s.us for s in reps.of(name)]
        # Per repetition: the extra microseconds one request costs (paired with the baseline).
        extra = [m - b for b, m in zip(base, mine, strict=True)]
        rows.append([
            label,
            reps.rate(name),
            h.fmt(h.median(mine)),
            reps.speed("baseline", name),
            "-" if name == "baseline" else
            f"{h.fmt(h.median(extra))} ({h.fmt(min(extra))} to {h.fmt(max(extra))})",
            reps.server(name),
        ])  # fmt: skip
    h.print_table(
        f"GET {PATH}, {CONNS} keep-alive connections, {BLOCK * max(1, TOTAL // BLOCK):,}"
        " requests per condition per rep",
        ["condition", "req/s median (min-max)", "µs/request", "time ÷ baseline",
         "overhead µs/request (min to max)", "redis-server CPU µs/request"],
        rows,
    )  # fmt: skip
    h.print_notes(
        "Time ÷ baseline is baseline req/s ÷ this condition's req/s, the median of the"
        " per-repetition ratios (1.00 = no overhead); the overhead is the median of the"
        " per-repetition differences of the time per request. The redis-server's CPU is read"
        " around each block (only the Redis row uses it).",
        "The servers are single uvicorn workers sharing the machine with the load generator"
        " and Redis; the figures are for comparing the conditions, not a capacity claim.",
    )


async def main(lab: h.Lab) -> None:
    servers = {
        "baseline": ExampleServer(lab, "baseline", lab.url, "--no-rate-limit"),
        "middleware": ExampleServer(lab, "middleware", lab.url, "--limit", NO_DENIAL),
        "memory": ExampleServer(lab, "memory", "memory://", "--limit", NO_DENIAL),
    }
    try:
        for server in servers.values():
            await server.ready()
        report(await measure(lab, servers))
    finally:
        for server in servers.values():
            server.child.stop()


if __name__ == "__main__":
    h.run(
        main,
        "Web: the example FastAPI app with and without RateLimitMiddleware",
        ["aioratelimit", "fastapi", "starlette", "uvicorn", "redis", "hiredis"],
        extra=[("load generator", f"raw HTTP/1.1 on asyncio, {CONNS} connections")],
    )
