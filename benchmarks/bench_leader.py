"""Leader failover: how long a fleet goes without a leader when its leader goes away.

Run (it starts its own redis-server on a free loopback port and stops it at the end)::

    .venv/bin/python benchmarks/bench_leader.py

Three ways a leader goes, interleaved in every repetition (the order rotates), each timed
from the moment it starts going to the moment the follower's ``async with arl.leader(...)``
enters its block (the follower runs in this process, asleep on the name's channel):

1. **leaving the block**, in this process: a leader on a backend of its own leaves its
   ``async with``; the resignation wakes the follower (a round trip or two);
2. **SIGTERM**: the leader is a child process whose handler cancels its main task (what an
   application does on shutdown); timed from the signal, the child's cancellation and
   resignation included;
3. **SIGKILL**: the child dies without a word; its term runs out on the server (at most
   ``TTL`` after its last renewal, which came every TTL/3), and the follower, asleep until
   that TTL (or its 1 s fallback timer), claims it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import harness as h

import aioratelimit as arl

#: The term's TTL for the SIGKILL case (seconds): what a failover after a crash costs.
TTL = 2.0 if h.REPS >= h.MIN_REPS else 0.5
#: In-process hand-overs per repetition (a median of them is the repetition's sample).
HANDOVERS = h.scaled(50, 3)

CHILD = """
import asyncio, signal, sys
import aioratelimit as arl


async def main():
    url, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    async with arl.Backend.from_url(url) as backend:
        try:
            async with arl.leader(name, ttl=ttl, backend=backend):
                print("elected", flush=True)
                await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass


asyncio.run(main())
"""


async def follow(backend: arl.Backend, name: str, entered: asyncio.Event) -> None:
    async with arl.leader(name, ttl=TTL, backend=backend):
        entered.set()


async def asleep(backend: arl.Backend) -> None:
    """Until the follower sleeps on its subscription (it tried, was refused, subscribed)."""
    subs = backend._notifier._subs
    # (the notifier sets no event when a waiter falls asleep: its state is read every ms)
    while not any(sub._waiter is not None for each in subs.values() for sub in each):  # noqa: ASYNC110
        await asyncio.sleep(0.001)


async def in_process(url: str) -> float:
    """The median of HANDOVERS hand-overs from a leader leaving its block (seconds)."""
    samples = []
    async with arl.Backend.from_url(url) as ours, arl.Backend.from_url(url) as theirs:
        for _ in range(HANDOVERS):
            name = f"bench-{uuid.uuid4().hex[:8]}"
            entered = asyncio.Event()
            async with arl.leader(name, ttl=TTL, backend=theirs):
                follower = asyncio.create_task(follow(ours, name, entered))
                await asleep(ours)
                began = time.perf_counter()
            await entered.wait()
            samples.append(time.perf_counter() - began)
            await follower
    return h.median(samples)


async def across_processes(url: str, program: Path, how: signal.Signals) -> float:
    """One hand-over from a child leader stopped by ``how`` (seconds)."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(program), url, name, str(TTL), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert (await child.stdout.readline()).strip() == b"elected"
        async with arl.Backend.from_url(url) as ours:
            entered = asyncio.Event()
            follower = asyncio.create_task(follow(ours, name, entered))
            await asleep(ours)
            # Past a renewal, as a crash would be: anywhere in the term, not at its start.
            await asyncio.sleep(TTL / 2)
            began = time.perf_counter()
            child.send_signal(how)
            await entered.wait()
            elapsed = time.perf_counter() - began
            await follower
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()
    return elapsed


async def main(lab: h.Lab) -> None:
    program = Path(tempfile.mkdtemp(prefix="arl-bench-leader-")) / "leader.py"
    program.write_text(CHILD, encoding="utf-8")
    conditions = {
        "leaving the block (in process)": lambda: in_process(lab.url),
        "SIGTERM, resigned by the app": lambda: across_processes(lab.url, program, signal.SIGTERM),
        "SIGKILL, the term runs out": lambda: across_processes(lab.url, program, signal.SIGKILL),
    }
    names = list(conditions)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(h.REPS):
        h.progress(f"repetition {rep + 1}/{h.REPS}")
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            samples[name].append(await conditions[name]())
    h.print_table(
        f"Failover: from the leader going to the follower leading (TTL {TTL:g} s)",
        ["how the leader went", "ms, median (min-max)", "in TTLs"],
        [
            [
                name,
                h.with_spread([1000 * s for s in samples[name]], 1),
                f"{h.median(samples[name]) / TTL:.3f}",
            ]
            for name in names
        ],
    )
    h.print_notes(
        f"Medians of {h.REPS} repetitions; the in-process row is each repetition's median of"
        f" {HANDOVERS} hand-overs. A killed leader's term lives TTL after its last renewal"
        " (every TTL/3), and it was killed TTL/2 into its term."
    )


if __name__ == "__main__":
    h.run(main, "Leader failover")
