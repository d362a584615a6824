"""Leader election across real processes and faults: a SIGKILLed leader replaced after its
TTL, a leader shut down by a signal replaced at once, and a blackholed leader that stops
before its term can end. Orders are asserted on the server's clock (the epochs are its
microseconds) and by events, never by how long the test took."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.faultproxy import FaultProxy
from support.pace import until
from support.servers import RedisServer

import aioratelimit as arl

#: A candidate: leads ``name`` until SIGTERM (which its handler turns into a cancellation
#: of the main task, as an application does) and tells each step on stdout.
CHILD = """
import asyncio, json, os, signal, sys
import aioratelimit as arl


def say(event, **more):
    print(json.dumps({"event": event, "pid": os.getpid(), **more}), flush=True)


async def main():
    url, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    async with arl.Backend.from_url(url) as backend:
        say("ready")
        try:
            async with arl.leader(name, ttl=ttl, backend=backend) as term:
                say("elected", epoch=term.epoch)
                await asyncio.sleep(3600)
        except asyncio.CancelledError:
            say("stopped")


asyncio.run(main())
"""


class Child:
    """One candidate process and what it said."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.said: list[dict[str, Any]] = []

    async def next(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        assert line, f"child {self.proc.pid} ended: {self.said}"
        said: dict[str, Any] = json.loads(line)
        self.said.append(said)
        return said

    async def rest(self) -> list[dict[str, Any]]:
        """Everything it says until it exits (after a signal)."""
        assert self.proc.stdout is not None
        out = await self.proc.stdout.read()
        self.said += [json.loads(line) for line in out.decode().splitlines() if line]
        await self.proc.wait()
        return self.said


@contextlib.asynccontextmanager
async def candidates(
    tmp_path: Path, url: str, name: str, ttl: float, n: int
) -> AsyncIterator[list[Child]]:
    program = tmp_path / "candidate.py"
    program.write_text(CHILD, encoding="utf-8")
    children: list[Child] = []
    try:
        for _ in range(n):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(program), url, name, str(ttl), stdout=asyncio.subprocess.PIPE
            )
            children.append(Child(proc))
        for child in children:
            assert (await child.next())["event"] == "ready"
        yield children
    finally:
        for child in children:
            if child.proc.returncode is None:
                child.proc.kill()
                await child.proc.wait()


async def leads(watcher: arl.Leader) -> bool:
    return await watcher.current() is not None


def pid_of(term: arl.Term) -> int:
    """The pid in a default identity (``hostname:pid``)."""
    return int(term.identity.rsplit(":", 1)[1])


async def next_leader(watcher: arl.Leader, seen: arl.Term) -> arl.Term:
    """The first term after ``seen`` (a gap with nobody leading is skipped)."""
    now: arl.Term | None = seen
    while now is None or now.epoch == seen.epoch:
        now = await watcher.wait_change(now, timeout=60)
    return now


@pytest.mark.timeout(120)
async def test_a_sigkilled_leader_is_replaced_after_its_ttl(
    redis_url: str, key: str, tmp_path: Path
) -> None:
    """Three candidates; the leader is SIGKILLed (it resigns nothing). One of the two
    others leads next, with a higher epoch that the server's clock put past the killed
    term's TTL; the third never leads meanwhile."""
    ttl = 2.0
    async with (
        arl.Backend.from_url(redis_url) as backend,
        candidates(tmp_path, redis_url, key, ttl, 3) as children,
    ):
        watcher = arl.leader(key, backend=backend)
        await until(lambda: leads(watcher), what="a leader", within=60)
        first = await watcher.current()
        assert first is not None
        by_pid = {child.proc.pid: child for child in children}
        killed = by_pid.pop(pid_of(first))
        assert (await killed.next()) == {
            "event": "elected",
            "pid": killed.proc.pid,
            "epoch": first.epoch,
        }
        killed.proc.send_signal(signal.SIGKILL)
        await killed.proc.wait()

        second = await next_leader(watcher, first)
        assert second.epoch > first.epoch + int(ttl * 1e6)  # not before the TTL ran out
        successor = by_pid.pop(pid_of(second))
        assert (await successor.next())["epoch"] == second.epoch
        (third,) = by_pid.values()
        third.proc.send_signal(signal.SIGTERM)  # stopped while it follows: it never led
        assert [s["event"] for s in await third.rest()] == ["ready", "stopped"]
        assert third.proc.returncode == 0
        successor.proc.send_signal(signal.SIGTERM)
        assert [s["event"] for s in await successor.rest()] == ["ready", "elected", "stopped"]
        assert await watcher.current() is None  # it resigned as it stopped


@pytest.mark.timeout(120)
async def test_a_leader_stopped_by_a_signal_hands_over_at_once(
    redis_url: str, key: str, tmp_path: Path
) -> None:
    """The leader's application turns SIGTERM into a cancellation: it resigns as it stops,
    and the follower leads next, on the server's clock long before the 30 s term could
    have run out (woken by the resignation)."""
    ttl = 30.0
    async with (
        arl.Backend.from_url(redis_url) as backend,
        candidates(tmp_path, redis_url, key, ttl, 2) as children,
    ):
        watcher = arl.leader(key, backend=backend)
        await until(lambda: leads(watcher), what="a leader", within=60)
        first = await watcher.current()
        assert first is not None
        (leader,) = [c for c in children if c.proc.pid == pid_of(first)]
        (follower,) = [c for c in children if c is not leader]
        assert (await leader.next())["event"] == "elected"
        leader.proc.send_signal(signal.SIGTERM)
        second = await next_leader(watcher, first)
        assert pid_of(second) == follower.proc.pid
        assert first.epoch < second.epoch < first.epoch + int(ttl * 1e6)
        assert [s["event"] for s in await leader.rest()] == ["ready", "elected", "stopped"]
        assert leader.proc.returncode == 0
        assert (await follower.next()) == {
            "event": "elected",
            "pid": follower.proc.pid,
            "epoch": second.epoch,
        }


@pytest.mark.timeout(120)
async def test_a_blackholed_leader_stops_before_its_term_ends(
    own_redis: RedisServer, key: str
) -> None:
    """The leader's connection is stalled: its renewals get no answer, and its block is
    cancelled before its term's TTL ends by its own clock (from the last renewal that was
    sent); only then does the other candidate lead, with a higher epoch."""
    loop = asyncio.get_running_loop()
    ttl = 2.0
    order: list[str] = []
    times: dict[str, float] = {}
    epochs: dict[str, int] = {}
    with FaultProxy(own_redis.port) as proxy:
        stalled = arl.Backend.from_url(proxy.url, timeout=0.25)
        direct = arl.Backend.from_url(own_redis.url)
        old = arl.leader(key, ttl=ttl, identity="old", backend=stalled)

        async def old_leader() -> None:
            async with old as term:
                epochs["old"] = term.epoch
                order.append("old leads")
                proxy.stall()
                try:
                    await asyncio.sleep(60)
                finally:
                    times["cancelled"] = loop.time()
                    hold = old._hold
                    assert hold is not None
                    lease = hold._lease
                    assert lease is not None
                    times["term ends"] = lease._sent + lease.ttl  # by its own clock
                    order.append("old cancelled")

        async def new_leader() -> None:
            async with arl.leader(key, ttl=ttl, identity="new", backend=direct) as term:
                epochs["new"] = term.epoch
                order.append("new leads")

        try:
            first = asyncio.create_task(old_leader())
            await until(lambda: order == ["old leads"], what="the old leads")
            second = asyncio.create_task(new_leader())
            with pytest.raises(arl.LockLost):
                await first
            await second
        finally:
            proxy.passthrough()
            await stalled.aclose()
            await direct.aclose()
    assert order == ["old leads", "old cancelled", "new leads"]
    assert times["cancelled"] < times["term ends"]
    assert epochs["new"] > epochs["old"]
