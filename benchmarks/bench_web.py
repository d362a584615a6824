"""The example FastAPI service with and without ``RateLimitMiddleware``, side by side.

Run (the script starts the two example servers itself, on free loopback ports, against
``REDIS_URL``; their keys live under a prefix unique to the run and are deleted at the end)::

    REDIS_URL=redis://127.0.0.1:6391/0 .venv/bin/python benchmarks/bench_web.py

Conditions: ``examples/fastapi_app.py`` served by uvicorn (one worker, asyncio loop, h11),
``GET /items/1`` on

- baseline: ``--no-rate-limit`` (the app without the rate-limit middleware);
- middleware: the app as shipped, ``RateLimitMiddleware`` with its ``SlidingWindow`` (limit
  raised so that every request is admitted: this measures the cost of a decision, not of a
  denial) on ``REDIS_URL``, adding the ``RateLimit`` fields to each response;
- middleware, memory://: the same on the embedded store, which separates the middleware's
  own work from the Redis round trip.

The load generator is bounded: ``CONNS`` keep-alive connections (default 16), each sending
its share of a fixed count of requests one after the other, on a small raw HTTP/1.1 client
written on asyncio streams. A full client such as httpx spends more CPU per request than
the server does, and on a small machine the load generator would then measure itself. The
two servers are measured in interleaved blocks, in rotating order; every response must be a
200, else the run aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis.asyncio as aredis
from _common import (
    REPS,
    bench_prefix,
    delete_prefix,
    fmt,
    median,
    paired_ratio,
    perf,
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

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fastapi_app.py"

CONNS = int(os.environ.get("CONNS", "16"))
TOTAL = scaled(6000, CONNS * 2)  # requests per condition per repetition
BLOCK = max(CONNS, min(300, TOTAL // 4))  # requests per interleaved block
PATH = "/items/1"
#: High enough that the benchmark never gets a 429.
NO_DENIAL = "1000000000/minute"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ExampleServer:
    """``python examples/fastapi_app.py`` in a subprocess on a free port."""

    def __init__(self, label: str, url: str, prefix: str, *flags: str) -> None:
        self.label = label
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="bench-web-", suffix=".log")  # noqa: SIM115
        args = [sys.executable, str(EXAMPLE), "--port", str(self.port), "--prefix", prefix]
        self.proc = subprocess.Popen(
            [*args, *flags],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "REDIS_URL": url},
        )

    async def ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the {self.label} server exited:\n{self.output()}")
            with contextlib.suppress(OSError):
                conn = await Conn.open(self.port)
                try:
                    if await conn.get("/health") == 200:
                        return
                finally:
                    await conn.close()
            if time.monotonic() > deadline:
                raise SystemExit(f"the {self.label} server did not answer:\n{self.output()}")
            await asyncio.sleep(0.1)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


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


async def load(conns: list[Conn], count: int) -> float:
    """``count`` requests spread over the connections; seconds taken. Aborts on a non-200."""
    share, extra = divmod(count, len(conns))

    async def worker(conn: Conn, n: int) -> None:
        for _ in range(n):
            status = await conn.get(PATH)
            if status != 200:
                raise SystemExit(f"GET {PATH} answered {status} on port {conn.port}")

    start = perf()
    await asyncio.gather(*(worker(c, share + (i < extra)) for i, c in enumerate(conns)))
    return perf() - start


async def measure(servers: dict[str, ExampleServer]) -> dict[str, list[float]]:
    """Requests per second of each server, per repetition (interleaved blocks)."""
    pools = {name: [await Conn.open(s.port) for _ in range(CONNS)] for name, s in servers.items()}
    rps: dict[str, list[float]] = {name: [] for name in servers}
    names = list(servers)
    try:
        for pool in pools.values():  # warm-up: connections, scripts, caches
            await load(pool, max(CONNS, BLOCK // 2))
        for rep in range(REPS):
            spent = dict.fromkeys(names, 0.0)
            done, turn = 0, rep
            while done < TOTAL:
                count = min(BLOCK, TOTAL - done)
                first = turn % len(names)
                for name in names[first:] + names[:first]:
                    spent[name] += await load(pools[name], count)
                done += count
                turn += 1
            for name in names:
                rps[name].append(TOTAL / spent[name])
            progress(
                f"rep {rep + 1}/{REPS}: "
                + ", ".join(f"{name} {rps[name][-1]:,.0f} req/s" for name in names)
            )
    finally:
        for pool in pools.values():
            for conn in pool:
                await conn.close()
    return rps


LABELS = {
    "baseline": "baseline (no middleware)",
    "middleware": "RateLimitMiddleware, Redis",
    "memory": "RateLimitMiddleware, memory://",
}


def report(rps: dict[str, list[float]]) -> None:
    base = rps["baseline"]
    rows = [[LABELS["baseline"], with_spread(base, 0), fmt(1e6 / median(base)), "1.00", "-"]]
    for name in ("middleware", "memory"):
        mw = rps[name]
        # Per repetition: the extra microseconds one request costs (paired with the baseline).
        extra_us = [(1 / m - 1 / b) * 1e6 for b, m in zip(base, mw, strict=True)]
        rows.append(
            [
                LABELS[name],
                with_spread(mw, 0),
                fmt(1e6 / median(mw)),
                ratio(paired_ratio(base, mw)),
                f"{fmt(median(extra_us))} ({fmt(min(extra_us))} to {fmt(max(extra_us))})",
            ]
        )
    print_table(
        f"GET {PATH}, {CONNS} keep-alive connections, {TOTAL:,} requests per condition per rep",
        [
            "condition",
            "req/s median (min-max)",
            "µs/request",
            "time ÷ baseline",
            "overhead µs/request (min to max)",
        ],
        rows,
    )
    print_notes(
        "Time ÷ baseline is baseline req/s ÷ this condition's req/s, the median of the "
        "per-repetition ratios (1.00 = no overhead); the overhead is the median of the "
        "per-repetition differences of the time per request (1/req/s).",
        "The servers are single uvicorn workers sharing the machine with the load generator "
        "and Redis; the figures are for comparing the conditions, not a capacity claim.",
    )
    print_smoke_note()


async def main() -> None:
    url = redis_url()
    prefix = bench_prefix()
    r = aredis.Redis.from_url(url, decode_responses=True)
    servers: dict[str, ExampleServer] = {}
    try:
        info = await r.info("server")
        print_header(
            "Web: the example FastAPI app with and without RateLimitMiddleware",
            info,
            ["aioratelimit", "fastapi", "starlette", "uvicorn", "redis", "hiredis"],
            [("load generator", f"raw HTTP/1.1 on asyncio, {CONNS} connections")],
        )
        progress(f"keys under {prefix}:*")
        servers["baseline"] = ExampleServer("baseline", url, prefix, "--no-rate-limit")
        servers["middleware"] = ExampleServer("middleware", url, prefix, "--limit", NO_DENIAL)
        servers["memory"] = ExampleServer("memory", "memory://", prefix, "--limit", NO_DENIAL)
        for server in servers.values():
            await server.ready()
        report(await measure(servers))
    finally:
        for server in servers.values():
            server.stop()
        deleted = await delete_prefix(r, f"{prefix}:")
        progress(f"deleted {deleted} keys under {prefix}:*")
        await r.aclose()


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
