"""Under attack and under outage: the deny cache, and decisions with the breaker open.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_attack.py

Three measurements:

1. **Denied decisions per second**, one key far over its limit, hit by 64 tasks at once:
   a plain ``FixedWindow`` (every denied hit is a script call) against the same limiter
   with ``deny_cache`` (answered in-process), interleaved in blocks in rotating order;
   the ratio is the median of the per-repetition ratios, and the server's CPU per denial
   beside it. With
   ``AIORATELIMIT_BASELINE_PYTHON`` (an interpreter whose ``aioratelimit`` is an earlier
   release: a venv with ``pip install -e`` of a ``git worktree`` of it), the plain
   limiter of that release too, timed in a process of its own once per repetition (before
   ours, then after, by turns): the "÷ baseline" column, what a team gets over upgrading.
2. **Script calls per key per retry window** under a flood: 64 tasks hit one key of
   ``5/500ms`` for ``WINDOWS`` windows (each yields once per hit, as a request handler
   would); the denied script calls per window with and without the cache.
3. **Decisions with the breaker open**: the backend's port refuses connections, the
   breaker has opened, and each decision's latency is timed one by one (p50 and p99), with
   ``Fallback`` (counted in-process) and with ``"deny"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness as h

import aioratelimit as arl
from aioratelimit._scripts import Arg, Reply, Script

TASKS = 64
#: denied hits per task in one chunk of the throughput measurement (64 tasks x 200): long
#: enough that a chunk's task start-up is not what a cached denial is measured against
#: (with 20 per task it was a third of the cached chunks' time)
PER_TASK = h.scaled(200, minimum=20)
CHUNKS = h.scaled(10, minimum=2)
WINDOW, LIMIT = 0.5, 5
WINDOWS = h.scaled(8, minimum=2)  # windows (of 0.5 s) per repetition
OPEN_N = h.scaled(20_000, minimum=200)

LIMITER_SCRIPTS = ("fixed_window", "sliding_window", "token_bucket")


class Counting:
    """Counts limiter script calls, and the denials among them (``h.intercept``'s hook)."""

    def __init__(self) -> None:
        self.calls = self.denied = 0

    def __call__(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], reply: Reply
    ) -> None:
        if script.name in LIMITER_SCRIPTS:
            self.calls += 1
            self.denied += reply[0] != 1


async def warm_denial(limiter: arl.Limiter, key: str) -> None:
    """Hit ``key`` until it is denied from the cache (or by the script, without a cache)."""
    for _ in range(1000):
        d = await limiter.hit(key)
        if not d.allowed and (d.source == "cache" or limiter._guard is None):
            return
        await asyncio.sleep(0.005)
    raise SystemExit(f"{key}: never denied from the cache")


#: The plain limiter's denials as an earlier release made them, timed in a process of its
#: own: ``AIORATELIMIT_BASELINE_PYTHON`` is an interpreter whose ``aioratelimit`` is that
#: release (e.g. a venv with ``pip install -e`` of a ``git worktree`` of the commit to
#: compare with); argv: url, prefix, tasks, denials per task, chunks.
BASELINE = r"""
import asyncio, json, sys, time
import aioratelimit as arl
url, prefix = sys.argv[1], sys.argv[2]
tasks, per_task, chunks = map(int, sys.argv[3:6])
async def main():
    backend = arl.Backend.from_url(url, prefix=prefix)
    lim = arl.FixedWindow("1/hour", backend=backend, name="baseline")
    while (await lim.hit("attacker")).allowed:
        pass
    async def worker():
        for _ in range(per_task):
            assert not (await lim.hit("attacker")).allowed
    spent = 0.0
    for _ in range(chunks):
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(tasks)))
        spent += time.perf_counter() - start
    await backend.aclose()
    print(json.dumps({"per_s": tasks * per_task * chunks / spent, "file": arl.__file__}))
asyncio.run(main())
"""


def baseline(url: str, prefix: str) -> tuple[float, str] | None:
    """Denied decisions/s of the plain FixedWindow of ``AIORATELIMIT_BASELINE_PYTHON``'s
    aioratelimit (None without it), 64 tasks, as many chunks as ours; and where that
    aioratelimit lives."""
    python = os.environ.get("AIORATELIMIT_BASELINE_PYTHON")
    if not python:
        return None
    argv = [python, "-c", BASELINE, url, f"{prefix}:base", str(TASKS), str(PER_TASK)]
    out = subprocess.run(
        [*argv, str(CHUNKS)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        cwd=Path(python).parent,  # not here: ``-c`` puts the working directory first
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    if Path(got["file"]).resolve() == Path(arl.__file__).resolve():
        raise SystemExit(f"{python} imports this aioratelimit ({got['file']}), not a baseline")
    return float(got["per_s"]), str(got["file"])


def baseline_label(package_file: str) -> str:
    """The baseline's commit (from the checkout its package lives in), else its path."""
    found = subprocess.run(
        ["git", "-C", str(Path(package_file).parent), "log", "-1", "--format=%h (%cs)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() or package_file


async def throughput(lab: h.Lab) -> list[list[object]]:
    url, prefix = lab.url, lab.prefix
    async with h.our_backend(url, prefix) as backend:
        plain = arl.FixedWindow("1/hour", backend=backend, name="plain")
        cached = arl.FixedWindow("1/hour", backend=backend, name="cached", deny_cache=1000)
        await warm_denial(plain, "attacker")
        await warm_denial(cached, "attacker")
        reps = h.Reps()
        base_s: list[float] = []
        where = ""
        for rep in range(h.REPS):
            h.progress(f"denied decisions/s, repetition {rep + 1}/{h.REPS}")
            # The baseline's process before ours on even repetitions, after on odd ones.
            if rep % 2 == 0 and (base := baseline(url, prefix)) is not None:
                base_s.append(base[0])
                where = base[1]
            got: dict[str, h.Sample] = {}
            for tasks in (TASKS, 1):
                cases = {
                    f"plain|{tasks}": lambda i: plain.hit("attacker"),
                    f"cached|{tasks}": lambda i: cached.hit("attacker"),
                }
                got |= await h.crowds(cases, tasks, PER_TASK, CHUNKS, rep, lab.meter)
            reps.append(got)
            if rep % 2 == 1 and (base := baseline(url, prefix)) is not None:
                base_s.append(base[0])
    rows: list[list[object]] = []
    if base_s:
        label = f"plain `FixedWindow` of {baseline_label(where)} (baseline), {TASKS} task(s)"
        rows.append([label, h.with_spread(base_s, 0), "-", "-", "1.00"])
    labels = {"plain": "plain `FixedWindow`", "cached": "`FixedWindow(deny_cache=1000)`"}
    for tasks in (TASKS, 1):
        for name, label in labels.items():
            key = f"{name}|{tasks}"
            row: list[object] = [
                f"{label}, {tasks} task(s)",
                reps.rate(key),
                reps.speed(key, f"plain|{tasks}"),
                reps.server(key, main=True),
            ]
            if base_s:  # the baseline's column only when there is one
                row.append(reps.speed(key, base_s) if tasks == TASKS else "-")
            rows.append(row)
    return rows


async def flood(lab: h.Lab, cache: bool, rep: int) -> tuple[float, float]:
    """(denied script calls, admitted) per window of one flooded key."""
    async with h.our_backend(lab.url, lab.prefix) as backend:
        limiter = arl.FixedWindow(
            f"{LIMIT}/500ms", backend=backend, deny_cache=100 if cache else None
        )
        key = f"flood-{rep}-{cache}"
        await warm_denial(limiter, key)
        counting = Counting()
        loop = asyncio.get_running_loop()
        end = loop.time() + WINDOWS * WINDOW
        admitted = 0

        async def task() -> None:
            nonlocal admitted
            while loop.time() < end:
                allowed = (await limiter.hit(key)).allowed  # (not `+= await`: a lost update)
                admitted += allowed
                await asyncio.sleep(0)

        with h.intercept(backend, counting):
            await asyncio.gather(*(task() for _ in range(TASKS)))
        return counting.denied / WINDOWS, admitted / WINDOWS


async def flooding(lab: h.Lab) -> list[list[object]]:
    figures: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for rep in range(h.REPS):
        h.progress(f"flood, repetition {rep + 1}/{h.REPS}")
        for cache in (rep % 2 == 0, rep % 2 == 1):  # alternate which goes first
            figures[cache].append(await flood(lab, cache, rep))
    rows: list[list[object]] = []
    for cache, label in ((False, "plain"), (True, "deny_cache=100")):
        denied = [d for d, _ in figures[cache]]
        admitted = [a for _, a in figures[cache]]
        rows.append([label, h.with_spread(denied, 2), h.with_spread(admitted, 2)])
    return rows


def refused_url() -> str:
    """A loopback port nobody listens on: every connection is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


async def breaker_open() -> list[list[object]]:
    rows: list[list[object]] = []
    async with arl.Backend.from_url(refused_url(), timeout=0.5, connect_timeout=0.5) as backend:
        policies: list[tuple[str, Any]] = [
            ("`Fallback(0.5)`", arl.Fallback(0.5)),
            ('`"deny"`', "deny"),
        ]
        for label, policy in policies:
            breaker = arl.Breaker(failures=3, cooldown=3600.0)
            limiter = arl.SlidingWindow(
                "1000/minute", backend=backend, on_unavailable=policy, breaker=breaker
            )
            for i in range(3):
                await limiter.hit(f"warm-{i}")
            assert breaker.state == "open", breaker
            p50s, p99s = [], []
            for rep in range(h.REPS):
                h.progress(f"breaker open {label}, repetition {rep + 1}/{h.REPS}")
                times = []
                for i in range(OPEN_N):
                    start = h.perf()
                    await limiter.hit(f"k{i % 100}")
                    times.append(h.perf() - start)
                times.sort()
                p50s.append(times[len(times) // 2] * 1e6)
                p99s.append(times[int(len(times) * 0.99)] * 1e6)
            rows.append([label, h.with_spread(p50s), h.with_spread(p99s)])
    return rows


async def main(lab: h.Lab) -> None:
    rows = await throughput(lab)
    h.print_table(
        "Denied decisions per second, one key (a script call per denial without the cache)",
        ["limiter", "denied decisions/s", "÷ plain", "server CPU µs/denial (process / main thread)",
         *(["÷ baseline"] if len(rows[0]) > 4 else [])],
        rows,
    )  # fmt: skip
    h.print_table(
        f"A flood of {TASKS} tasks on one key of {LIMIT}/500ms, per 500 ms window",
        ["limiter", "denied script calls per window", "admitted per window"],
        await flooding(lab),
    )
    h.print_table(
        "One decision with the breaker open (backend refusing connections), µs",
        ["on_unavailable", "p50", "p99"],
        await breaker_open(),
    )
    h.print_notes(
        "Figures are `median (min-max)` over the repetitions; ratios are medians of"
        " per-repetition ratios. Server CPU: `INFO CPU` deltas around each crowd, per denial.",
        f"The flood runs {WINDOWS} windows per repetition; the warm-up (the first denial"
        " and the key's subscription) is outside the count.",
    )


if __name__ == "__main__":
    h.run(main, "Under attack and under outage: the deny cache and the breaker")
