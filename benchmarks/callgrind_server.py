"""Instructions the server runs per decision, counted by callgrind: ours against the minimal
script the C client sends, and where they go.

Run (it starts its own redis-server under ``valgrind --tool=callgrind`` on a free loopback
port, and stops it at the end; a few minutes: the server runs some 50 times slower)::

    .venv/bin/python benchmarks/callgrind_server.py [--decisions 2000] [--top 15]

The server starts with instrumentation off; for each condition, after a warm-up (scripts
loaded, connections open), ``callgrind_control -i on`` turns it on, the condition runs
``--decisions`` decisions, ``-i off`` and ``-d`` dump its counts alone. Printed: the
instructions (``Ir``) per decision of each condition, the inclusive cost per decision of
the server's functions a decision passes through (reading, the command table, the script's
set-up and run, each command the script calls, the replies' writes), the top functions by
their own cost for our ``FixedWindow`` and for the minimal script, and probes: what one part
of a script (``TIME``, ``tonumber``, a reply of 8 fields...) adds to ``return 1``.

Callgrind counts the server's user-space instructions only: the kernel's share of the socket
calls (the most of what pipelining saves) is not in them; ``INFO CPU`` in
``bench_server.py`` has it. The server's timer (``serverCron``, 10 times a second) runs while
a condition does, a few thousand instructions a tick. ``ARL_BATCH`` acts as in
``bench_server.py``. The files stay in ``--keep DIR`` when given, for ``callgrind_annotate``
or KCachegrind.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import harness as h
from bench_server import BATCH, BATCH_NOTE, LIMITERS, TASKS

import aioratelimit as arl

#: Functions of the server whose inclusive cost per decision the report shows.
FUNCTIONS = [
    ("readQueryFromClient", "read a client's input and run its commands"),
    ("processMultibulkBuffer", "parse the commands (RESP)"),
    ("processCommand", "look a command up, check it, run it"),
    ("evalGenericCommand", "EVALSHA, all of it"),
    ("evalGetCommandFlags", "a script's flags (before it runs)"),
    ("luaCallFunction", "a script run: KEYS/ARGV in, the reply out"),
    ("lua_pcall", "the Lua code itself"),
    ("scriptCall", "redis.call, all of them"),
    ("timeCommand", "TIME"),
    ("incrCommand", "INCR"),
    ("incrbyCommand", "INCRBY"),
    ("incrbyfloatCommand", "INCRBYFLOAT"),
    ("getCommand", "GET"),
    ("setCommand", "SET"),
    ("pexpireCommand", "PEXPIRE"),
    ("pttlCommand", "PTTL"),
    ("pexpiretimeCommand", "PEXPIRETIME"),
    ("hgetallCommand", "HGETALL"),
    ("pexpireatCommand", "PEXPIREAT"),
    ("hsetCommand", "HSET"),
    ("hincrbyCommand", "HINCRBY"),
    ("echoCommand", "ECHO"),
    ("handleClientsWithPendingWrites", "write the replies"),
    ("serverCron", "the timer"),
]
#: Probes: scripts that each add one part of a decision to ``return 1``, what that part
#: costs the server (sent as the C client sends the minimal script, with four ARGV).
PROBES = [
    ("`return 1`", "return 1"),
    ("rates_common.lua, then `return 1`", "{rates_common}\nreturn 1"),
    ("`redis.call('TIME')`", "redis.call('TIME')\nreturn 1"),
    (
        "`TIME`, its two strings to a number",
        "local t = redis.call('TIME')\nreturn tonumber(t[1]) * 1000000 + tonumber(t[2])",
    ),
    (
        "four `tonumber(ARGV[i])`",
        "local a, b, c, d = tonumber(ARGV[1]), tonumber(ARGV[2]),"
        " tonumber(ARGV[3]), tonumber(ARGV[4])\nreturn 1",
    ),
    ("a reply of 8 integers", "return {1, 2, 3, 4, 5, 6, 7, 8}"),
]
PROBE = "probe: "
LUA = Path(__file__).resolve().parents[1] / "lua"
#: What annotate prints per function: ``Ir (pct%)  file:function [object]``.
LINE = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S*?):(\S+) \[(.+)\]$")


def control(pid: int, *args: str) -> None:
    subprocess.run(
        ["callgrind_control", *args, str(pid)], capture_output=True, check=True, timeout=120
    )


def annotate(path: Path, inclusive: bool) -> dict[str, int]:
    """Each function's cost (``Ir``) in one dump, inclusive or its own."""
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", f"--inclusive={'yes' if inclusive else 'no'}",
         str(path)],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    costs: dict[str, int] = {}
    for line in out.splitlines():
        if (found := LINE.match(line)) is not None:
            name = found.group(3)
            costs[name] = costs.get(name, 0) + int(found.group(1).replace(",", ""))
    return costs


def total(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


class Callgrind:
    """A redis-server under callgrind, its counts dumped condition by condition."""

    def __init__(self, scratch: Path) -> None:
        self.dir = scratch / "callgrind"
        self.dir.mkdir()
        wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={self.dir}/cg.out"]  # fmt: skip
        self.server = h.RedisServer(scratch, wrapper=wrapper, start_timeout=180.0)
        self.dumps: dict[str, Path] = {}

    async def measure(self, label: str, work: Callable[[], Awaitable[object]]) -> None:
        pid = self.server.child.pid
        control(pid, "-i", "on")
        await work()
        control(pid, "-i", "off")
        before = set(self.dir.iterdir())
        control(pid, "-d", f"condition{len(self.dumps) + 1}")  # no spaces: a bare word
        h.wait_for(lambda: bool(set(self.dir.iterdir()) - before), f"the dump of {label}")
        (path,) = set(self.dir.iterdir()) - before
        self.dumps[label] = path


async def body(cg: Callgrind, n: int, prefix: str, counts: dict[str, int]) -> None:
    """Every condition measured once; ``counts``: the decisions each ran."""
    server = cg.server
    with server.client() as client:
        sha = str(client.script_load(h.FLOOR_LUA))
    floor = h.floor_command(sha, prefix)
    backend = h.our_backend(server.url, prefix, **BATCH)
    try:
        ours = {name: getattr(arl, name)("1000000000/hour", backend=backend) for name in LIMITERS}

        def c_run(connections: int, pipeline: int) -> Callable[[], Awaitable[object]]:
            async def go() -> None:
                await asyncio.to_thread(h.c_client, server, floor, connections, pipeline, n)

            return go

        def c_send(command: list[str]) -> Callable[[], Awaitable[object]]:
            async def go() -> None:
                await asyncio.to_thread(h.c_client, server, command, 50, 16, n)

            return go

        def crowd(
            name: str, tag: str, tasks: int, hot: bool = False
        ) -> Callable[[], Awaitable[object]]:
            hit = ours[name].hit
            op = (lambda i: hit(tag)) if hot else (lambda i: hit(f"{tag}:{i}"))
            chunk = h.fan_out(op, tasks, max(1, n // tasks))
            return lambda: chunk(0)

        conditions: list[tuple[str, Callable[[], Awaitable[object]], int]] = [
            ("C -c 50 -P 16, minimal script", c_run(50, 16), n),
            ("C -c 50 -P 1, minimal script", c_run(50, 1), n),
            *((f"ours {name}, {TASKS} tasks", crowd(name, name, TASKS), n // TASKS * TASKS)
              for name in LIMITERS),
            (f"ours FixedWindow, {TASKS} tasks, one hot key",
             crowd("FixedWindow", "hot", TASKS, hot=True), n // TASKS * TASKS),
            ("ours FixedWindow, sequential", crowd("FixedWindow", "seq", 1), n),
        ]  # fmt: skip
        # Warm-up, not counted: every script loaded, every connection open.
        h.c_client(server, floor, 50, 1, 200)
        for limiter in ours.values():
            await limiter.hit("warm")
        for label, work, decisions in conditions:
            h.progress(f"callgrind: {label}")
            await cg.measure(label, work)
            counts[label] = decisions
        common = (LUA / "rates_common.lua").read_text()
        for label, source in PROBES:
            with server.client() as client:
                probe = str(client.script_load(source.replace("{rates_common}", common)))
            command = ["EVALSHA", probe, "1", f"{prefix}:p:__rand_int__", "60000", "1", "1000",
                       "60000000"]  # fmt: skip
            h.c_client(server, command, 50, 16, 200)  # warm-up
            h.progress(f"callgrind: {PROBE}{label}")
            await cg.measure(PROBE + label, c_send(command))
            counts[PROBE + label] = n
    finally:
        await backend.aclose()


def report(cg: Callgrind, counts: dict[str, int], top: int) -> None:
    labels = [label for label in counts if not label.startswith(PROBE)]
    probes = {label: total(cg.dumps[label]) / counts[label] for label in counts}
    totals = {label: total(cg.dumps[label]) / counts[label] for label in labels}
    inclusive = {label: annotate(cg.dumps[label], True) for label in labels}
    floor = totals[labels[0]]
    h.print_table(
        "Instructions per decision (callgrind Ir, the server's user space)",
        ["condition", "decisions", "Ir per decision", "÷ C -P 16"],
        [[label, f"{counts[label]:,}", h.fmt(totals[label]), h.ratio(totals[label] / floor)]
         for label in labels],
    )  # fmt: skip
    rows = []
    for function, what in FUNCTIONS:
        per = [inclusive[label].get(function, 0) / counts[label] for label in labels]
        if any(per):
            rows.append([f"`{function}`: {what}", *(h.fmt(x, 0) for x in per)])
    h.print_table(
        "Inclusive Ir per decision of the functions a decision passes through",
        ["function", *labels],
        rows,
    )
    base = probes.get(PROBE + PROBES[0][0])
    if base is not None:
        h.print_table(
            "What a part of a script costs: Ir per call, C -c 50 -P 16",
            ["script", "Ir per call", "less `return 1`"],
            [[label, h.fmt(probes[PROBE + label]), h.fmt(probes[PROBE + label] - base, 0)]
             for label, _ in PROBES],
        )  # fmt: skip
    for label in (labels[0], labels[2]):
        own = annotate(cg.dumps[label], False)
        ranked = sorted(own.items(), key=lambda kv: -kv[1])[:top]
        h.print_table(
            f"Top {top} functions by own Ir per decision: {label}",
            ["function", "Ir per decision", "share"],
            [[f"`{name}`", h.fmt(ir / counts[label], 0),
              f"{100 * ir / (totals[label] * counts[label]):.1f} %"] for name, ir in ranked],
        )  # fmt: skip
    h.print_notes(
        f"Ours: `Backend.from_url(url)` ({BATCH_NOTE}), every hit admitted, each on a key of"
        " its own (its first hit) unless on one hot key; the C client: redis-benchmark"
        " sending the minimal script by EVALSHA on random keys. Functions shown as hex"
        " addresses are the server's static ones (most of them Lua's interpreter).",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--decisions", type=int, default=h.scaled(2_000, 64))
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is not installed")
    scratch = Path(tempfile.mkdtemp(prefix="arl-callgrind-"))
    try:
        cg = Callgrind(scratch)
        counts: dict[str, int] = {}
        try:
            header(cg)
            h.run_loop(body(cg, args.decisions, h.bench_prefix(), counts))
        finally:
            cg.server.stop()
        report(cg, counts, args.top)
        if args.keep is not None:
            shutil.copytree(cg.dir, args.keep, dirs_exist_ok=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def header(cg: Callgrind) -> None:
    with cg.server.client() as client:
        server = client.info("server")
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout
    print("# Server instructions per decision (callgrind)")
    h.print_table(
        "Run",
        ["item", "value"],
        [
            ["date", time.strftime("%Y-%m-%d %H:%M %Z")],
            ["redis-server", f"{server.get('redis_version', '?')} under {valgrind.strip()}"],
            *([p, h.version(p)] for p in ("aioratelimit", "redis", "hiredis")),
            ["ARL_BATCH", BATCH_NOTE],
        ],
    )


if __name__ == "__main__":
    main()
