"""What every benchmark script shares: the knobs, interleaved timing, medians, Markdown.

The method, in short: a noisy shared machine drifts by tens of percent within seconds, so a
benchmark never compares figures taken at different times. Inside each repetition, the
conditions it compares run interleaved in small blocks, in an order that rotates from block
to block; each figure is the median over the repetitions, and each ratio is the median of the
per-repetition ratios (both sides measured side by side in the same repetition).

Environment knobs:

``REDIS_URL``
    The server to measure against (required; the scripts start nothing themselves).
``REPS``
    Repetitions (default 7). Fewer than 5 is a smoke run: the tables say so.
``SCALE``
    Multiplies every operation count (default 1.0; 0.01 for a smoke run).
``LOOP``
    The event loop of the scripts that run through ``run_main`` (bench_transport):
    ``asyncio`` (default) or ``uvloop`` (what uvicorn runs a web app on when installed).

Scripts print Markdown only on stdout (progress goes to stderr), write keys only under a
prefix unique to the run (``bench_prefix``) and delete them before they exit.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import math
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any

#: One timed operation: ``op(i)`` performs operation number ``i``.
Op = Callable[[int], Awaitable[object]]

#: The minimal fixed-window decision (INCR, PEXPIRE on the first hit, PTTL): the floor any
#: Lua limiter pays, run by the raw client (and by redis-benchmark) as the reference.
FLOOR_LUA = """\
local c = redis.call('INCR', KEYS[1])
if c == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return {c, redis.call('PTTL', KEYS[1])}
"""

#: Repetitions below this are a smoke run, not a measurement.
MIN_REPS = 5


def _env_int(name: str, default: int) -> int:
    value = int(os.environ.get(name, str(default)))
    if value < 1:
        raise SystemExit(f"{name} must be >= 1, got {value}")
    return value


def _env_float(name: str, default: float) -> float:
    value = float(os.environ.get(name, str(default)))
    if not value > 0:
        raise SystemExit(f"{name} must be > 0, got {value}")
    return value


REPS = _env_int("REPS", 7)
SCALE = _env_float("SCALE", 1.0)
LOOP = os.environ.get("LOOP", "asyncio")
if LOOP not in ("asyncio", "uvloop"):
    raise SystemExit(f"LOOP must be asyncio or uvloop, got {LOOP!r}")


def run_main(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``main()`` on the event loop ``LOOP`` names."""
    if LOOP == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


perf = time.perf_counter


def redis_url() -> str:
    """``REDIS_URL`` from the environment; a benchmark never guesses a server."""
    url = os.environ.get("REDIS_URL")
    if not url:
        raise SystemExit(
            "set REDIS_URL to the server to measure, e.g. REDIS_URL=redis://127.0.0.1:6391/0"
        )
    return url


def scaled(count: int, minimum: int = 1) -> int:
    """``count`` multiplied by ``SCALE``, at least ``minimum``."""
    return max(minimum, round(count * SCALE))


def progress(text: str) -> None:
    """A progress line on stderr (stdout is kept for the Markdown report)."""
    print(text, file=sys.stderr, flush=True)


def bench_prefix() -> str:
    """A key prefix no other run shares: everything a run writes lives under it.

    Short on purpose (13 bytes, against the default ``arl``), so that the key names are
    about as long as real ones when a benchmark measures memory per key.
    """
    return f"arlb:{uuid.uuid4().hex[:8]}"


def cluster_hosts(url: str) -> list[tuple[str, int]]:
    """The (host, port) seeds a ``redis+cluster://`` URL names."""
    from aioratelimit._urls import parse_hosts

    return parse_hosts(url.partition("://")[2].partition("/")[0], 6379)[0]


def raw_cluster(url: str, **options: Any) -> Any:
    """A ``redis.asyncio.RedisCluster`` on the seeds of a ``redis+cluster://`` URL."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_hosts(url)], **options)


def delete_cluster_prefix(url: str, prefix: str) -> int:
    """UNLINK every key under ``prefix`` on every master (SCAN per node, never KEYS)."""
    import redis

    nodes = [redis.cluster.ClusterNode(h, p) for h, p in cluster_hosts(url)]
    deleted = 0
    with redis.RedisCluster(startup_nodes=nodes) as client:
        for node in client.get_primaries():
            conn = client.get_redis_connection(node)
            # One key per UNLINK: keys of different slots may not share a command.
            with conn.pipeline(transaction=False) as pipe:
                for key in conn.scan_iter(match=f"{prefix}*", count=1000):
                    pipe.unlink(key)
                deleted += sum(int(n) for n in pipe.execute())
    return deleted


async def delete_prefix(client: Any, prefix: str) -> int:
    """UNLINK every key under ``prefix`` (SCAN, never KEYS); returns how many."""
    deleted = 0
    batch: list[Any] = []
    async for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += await client.unlink(*batch)
            batch.clear()
    if batch:
        deleted += await client.unlink(*batch)
    return deleted


# -- timing -------------------------------------------------------------------------------


def _blocks(
    names: list[str], total: int, block: int, rotate: int
) -> Iterator[tuple[str, int, int]]:
    """The interleaving schedule: ``(case, first operation, count)`` in blocks of ``block``,
    the order of the cases rotating every block."""
    done, turn = 0, rotate
    while done < total:
        count = min(block, total - done)
        first = turn % len(names)
        for name in names[first:] + names[:first]:
            yield name, done, count
        done += count
        turn += 1


async def interleave(
    cases: Mapping[str, Op], total: int, block: int, rotate: int = 0
) -> dict[str, float]:
    """Run ``total`` operations of every case in blocks of ``block``, rotating the order of
    the cases every block, so that all of them see the same drift of the machine.

    Returns the seconds per operation of each case. ``rotate`` shifts the starting order
    (pass the repetition number, so no case is always first).
    """
    spent = dict.fromkeys(cases, 0.0)
    for name, first, count in _blocks(list(cases), total, block, rotate):
        op = cases[name]
        start = perf()
        for i in range(first, first + count):
            await op(i)
        spent[name] += perf() - start
    return {name: spent[name] / total for name in cases}


def interleave_blocking(
    cases: Mapping[str, Callable[[], object]], total: int, block: int, rotate: int = 0
) -> dict[str, float]:
    """``interleave`` for synchronous operations (a blocking client's calls)."""
    spent = dict.fromkeys(cases, 0.0)
    for name, _, count in _blocks(list(cases), total, block, rotate):
        op = cases[name]
        start = perf()
        for _ in range(count):
            op()
        spent[name] += perf() - start
    return {name: spent[name] / total for name in cases}


def fan_out(op: Op, tasks: int, per_task: int) -> Op:
    """One chunk of concurrent work: ``chunk(c)`` runs ``tasks`` tasks, each awaiting
    ``per_task`` operations of ``op``; operation numbers are distinct across chunks."""
    size = tasks * per_task

    async def worker(base: int) -> None:
        for i in range(base, base + per_task):
            await op(i)

    async def chunk(c: int) -> None:
        base = c * size
        await asyncio.gather(*(worker(base + t * per_task) for t in range(tasks)))

    return chunk


# -- statistics ---------------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def column(reps: Sequence[Mapping[str, float]], key: str) -> list[float]:
    """One figure across the repetitions (each repetition a mapping of figures)."""
    return [rep[key] for rep in reps]


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """The median over repetitions of ``num[i] / den[i]`` (both measured in repetition i)."""
    return median([a / b for a, b in zip(num, den, strict=True) if b])


def fmt(x: float, digits: int = 1) -> str:
    """A number for a table: thousands separators from 1,000 on, ``-`` for NaN."""
    if math.isnan(x):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def with_spread(xs: Sequence[float], digits: int = 1) -> str:
    """``median (min-max)``."""
    if not xs:
        return "-"
    return f"{fmt(median(xs), digits)} ({fmt(min(xs), digits)}-{fmt(max(xs), digits)})"


def ratio(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


# -- output -------------------------------------------------------------------------------


def print_table(title: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """A Markdown table under a level-3 heading."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in header]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        "",
        f"### {title}",
        "",
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
              for row in cells]  # fmt: skip
    print("\n".join(lines), flush=True)


def print_notes(*notes: str) -> None:
    """Paragraphs of Markdown text."""
    for note in notes:
        print(f"\n{note}", flush=True)


def print_smoke_note() -> None:
    """At the end of a report: a smoke run's figures are not a measurement."""
    if REPS < MIN_REPS:
        print_notes(f"**Smoke run** (REPS={REPS} < {MIN_REPS}): not a measurement.")


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_header(
    title: str,
    server: Mapping[str, Any],
    packages: Sequence[str],
    extra: Sequence[tuple[str, str]] = (),
) -> None:
    """The report's title, the run's knobs and the machine, as Markdown.

    ``server`` is the reply of ``INFO server`` on the measured Redis; ``extra`` adds rows.
    """
    print(f"# {title}\n")
    if REPS < MIN_REPS:
        print(f"**Smoke run** (REPS={REPS} < {MIN_REPS}): the figures below mean nothing.\n")
    rows = [
        ["date", time.strftime("%Y-%m-%d %H:%M %Z")],
        ["machine", f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs, "
                    f"{_cpu_model()}"],
        ["python", f"{platform.python_version()} ({platform.python_implementation()})"],
        ["redis server", f"{server.get('redis_version', '?')} at {redact(redis_url())}"],
        *([p, version(p)] for p in packages),
        *([k, v] for k, v in extra),
        ["knobs", f"REPS={REPS} SCALE={SCALE}"],
    ]  # fmt: skip
    print_table("Run", ["item", "value"], rows)


def redact(url: str) -> str:
    """The URL without its password."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"
