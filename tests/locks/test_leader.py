"""Leader election and interval jobs on every backend: one leader at a time, epochs that
increase, a resignation that hands over at once (woken, not polled), a lost term that
cancels its block, changes any process can wait for, and one run per interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest
from support.pace import asleep, pace, until

import aioratelimit as arl
from aioratelimit import _keys, _observe, _scripts
from aioratelimit._locks import leader as _leader
from aioratelimit._locks import lock as _lock


def term_key(backend: arl.Backend, name: str) -> str:
    return _keys.leader(backend._head(_keys.LEADER_KIND), name)[0]


class Events(arl.Recorder):
    """What the leader election reports, in order."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def leader(self, name: str, event: str) -> None:
        self.seen.append((name, event))


@pytest.fixture
def events() -> Any:
    recorder = Events()
    old = arl.set_recorder(recorder)
    yield recorder
    arl.set_recorder(old)


# -- one leader at a time ------------------------------------------------------------------


async def test_candidates_lead_one_at_a_time_with_increasing_epochs(
    backend: arl.Backend, key: str
) -> None:
    """Six candidates each lead once, never two at a time, and each term's epoch is
    greater than every one before it."""
    state = {"inside": 0, "most": 0}
    epochs: list[int] = []

    async def candidate(i: int) -> None:
        async with arl.leader(key, ttl=30, identity=f"c{i}", backend=backend) as term:
            state["inside"] += 1
            state["most"] = max(state["most"], state["inside"])
            assert term.identity == f"c{i}"
            now = await arl.leader(key, backend=backend).current()
            assert now is not None
            assert (now.name, now.epoch, now.identity) == (key, term.epoch, f"c{i}")
            epochs.append(term.epoch)
            await asyncio.sleep(0.01)
            state["inside"] -= 1

    await asyncio.gather(*(candidate(i) for i in range(6)))
    assert state["most"] == 1
    assert len(epochs) == 6
    assert epochs == sorted(epochs)
    assert len(set(epochs)) == 6
    assert await arl.leader(key, backend=backend).current() is None


async def test_a_resignation_wakes_the_follower_at_once(backend: arl.Backend, key: str) -> None:
    """The leader leaves its block; the follower, asleep on the name's channel, leads next
    with a higher epoch, woken by the resignation: before the term's 30 s TTL would have
    freed it, and (on memory://, where nothing else moves the clock) before the follower's
    fallback timer would have tried again."""
    order: list[str] = []
    leaving = asyncio.Event()
    terms: list[arl.Term] = []

    async def first() -> None:
        async with arl.leader(key, ttl=30, identity="first", backend=backend) as term:
            terms.append(term)
            order.append("first leads")
            await leaving.wait()
        order.append("first resigned")

    async def second() -> None:
        async with arl.leader(key, ttl=30, identity="second", backend=backend) as term:
            terms.append(term)
            order.append("second leads")

    async def too_late(after: float) -> None:
        await asyncio.sleep(after)
        order.append("too late")

    leader = asyncio.create_task(first())
    await until(lambda: order == ["first leads"], what="the first leads")
    follower = asyncio.create_task(second())
    await asleep(backend, waiter=follower)  # refused once, asleep on the channel
    bound = pace(backend, network=30.0, memory=_lock.FALLBACK_WAIT / 2)
    sentinel = asyncio.create_task(too_late(bound))
    leaving.set()
    await asyncio.gather(leader, follower)
    sentinel.cancel()
    assert order == ["first leads", "first resigned", "second leads"]
    assert terms[1].epoch > terms[0].epoch
    assert terms[1].identity == "second"


async def test_a_term_taken_by_another_cancels_the_block(
    backend: arl.Backend, key: str, events: Events
) -> None:
    """If the term is deleted and another candidate leads, the renewal notices, the block
    is cancelled, LockLost is raised, and the metrics tell "lost"; the other leads on."""
    entered = asyncio.Event()
    ttl = pace(backend, network=1.0, memory=0.3)  # the next renewal notices, ttl/3 later
    other = arl.leader(key, ttl=30, identity="other", backend=backend)

    async def block() -> None:
        async with arl.leader(key, ttl=ttl, backend=backend):
            entered.set()
            await asyncio.sleep(60)
            raise AssertionError("the block ran to its end")

    async def take() -> arl.Term:
        await entered.wait()
        await backend._run(_scripts.DELETE, [term_key(backend, key)], ())
        return await other.__aenter__()

    taker = asyncio.create_task(take())
    with pytest.raises(arl.LockLost):
        await block()
    taken = await taker
    now = await other.current()
    assert now is not None
    assert (now.epoch, now.identity) == (taken.epoch, "other")
    await other.__aexit__(None, None, None)
    assert events.seen == [(key, "elected"), (key, "elected"), (key, "lost"), (key, "resigned")]


async def test_cancelling_the_leader_resigns(
    backend: arl.Backend, key: str, events: Events
) -> None:
    """A cancellation of the block (as an application's signal handler does) resigns: the
    term is free at once, its record keeps the epoch, and the metrics tell it."""
    entered = asyncio.Event()

    async def lead() -> None:
        async with arl.leader(key, ttl=30, backend=backend):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(lead())
    await entered.wait()
    held = await arl.leader(key, backend=backend).current()
    assert held is not None
    assert held.identity == arl.leader(key).identity
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await arl.leader(key, backend=backend).current() is None
    state = await backend._run(_scripts.LEADER_STATE, [term_key(backend, key)], ())
    assert state[:2] == [0, held.epoch]  # the tombstone keeps the last epoch
    assert events.seen == [(key, "elected"), (key, "resigned")]


# -- watching ------------------------------------------------------------------------------


async def test_wait_change_and_watch_see_every_term(backend: arl.Backend, key: str) -> None:
    """A watcher sees nobody, then the leader with its identity and TTL, then nobody
    again after it resigns; ``watch`` yields the same."""
    watcher = arl.leader(key, backend=backend)
    seen: list[arl.Term | None] = []

    async def watch() -> None:
        async for term in watcher.watch():
            seen.append(term)
            if len(seen) == 3:
                return

    watching = asyncio.create_task(watch())
    await until(lambda: len(seen) == 1, what="the watch started")
    change = asyncio.create_task(watcher.wait_change(None))
    await asleep(backend, count=2, waiter=change)
    async with arl.leader(key, ttl=30, identity="boss", backend=backend) as term:
        got = await change
        assert got is not None
        assert (got.epoch, got.identity) == (term.epoch, "boss")
        assert 0 < got.ttl <= 30
        await until(lambda: len(seen) == 2, what="the watch saw the term")
        gone = asyncio.create_task(watcher.wait_change(got))
        await asleep(backend, count=2, waiter=gone)
    assert await gone is None
    await watching
    assert seen[0] is None
    assert seen[2] is None
    assert seen[1] is not None
    assert seen[1].epoch == term.epoch


async def test_wait_change_sees_a_term_that_runs_out(backend: arl.Backend, key: str) -> None:
    """A term that expires tells nobody; the watcher reads again when it would end."""
    ttl = pace(backend, network=0.5, memory=0.2)
    candidate = _leader.Candidate(key, ttl, backend, "gone")
    lease = await candidate.acquire(timeout=0)  # never renewed: it runs out
    watcher = arl.leader(key, backend=backend)
    seen = await watcher.current()
    assert seen is not None
    assert seen.epoch == lease.fencing_token
    assert await watcher.wait_change(seen, timeout=30) is None


async def test_repr_shows_whether_it_leads(backend: arl.Backend, key: str) -> None:
    """The election's repr says following, or leading with the term's epoch."""
    election = arl.leader(key, ttl=30, backend=backend)
    assert repr(election) == f"<Leader {key!r} ttl=30.0 following>"
    assert election.term is None
    async with election as term:
        assert repr(election) == f"<Leader {key!r} ttl=30.0 leading epoch={term.epoch}>"
        assert election.term == term
    assert election.term is None
    assert "following" in repr(election)


async def test_an_election_is_entered_once_at_a_time(backend: arl.Backend, key: str) -> None:
    """One ``Leader`` entered twice at once: the second entry is refused at once, even
    while the first still waits to lead; once that wait ends, it may be entered again."""
    async with arl.leader(key, ttl=30, backend=backend):
        election = arl.leader(key, ttl=30, backend=backend)
        waiting = asyncio.create_task(election.__aenter__())
        await asleep(backend, waiter=waiting)  # it waits to lead
        with pytest.raises(RuntimeError, match="already entered"):
            await election.__aenter__()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    async with election as term:
        assert election.term == term


async def test_wait_change_times_out(backend: arl.Backend, key: str) -> None:
    """Nobody leads and nobody comes: ``timeout`` ends the wait."""
    with pytest.raises(TimeoutError):
        await arl.leader(key, backend=backend).wait_change(timeout=0.05)


async def test_bad_arguments_raise_before_any_io(key: str) -> None:
    """Bad names, TTLs, identities, timeouts, intervals and jobs raise before any call."""

    async def job(slot: int) -> None:
        raise AssertionError

    cases: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"name": ""}, ValueError),
        ({"name": 5}, TypeError),
        ({"name": key, "ttl": 0}, ValueError),
        ({"name": key, "identity": ""}, ValueError),
        ({"name": key, "identity": "x" * 257}, ValueError),
        ({"name": key, "identity": 7}, TypeError),
        ({"name": key, "identity": "\udc80"}, ValueError),
        ({"name": key, "timeout": -1}, ValueError),
    ]
    for bad, error in cases:
        with pytest.raises(error):
            arl.leader(**bad)
    with pytest.raises(TypeError):
        await arl.leader(key).wait_change("now")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval must be at least"):
        await arl.every(0.001, key, job)
    with pytest.raises(ValueError, match="name"):
        await arl.every(1, "", job)
    with pytest.raises(TypeError):
        await arl.every(1, key, "job")  # type: ignore[arg-type]


# -- once per interval ---------------------------------------------------------------------


async def test_every_runs_each_interval_once_across_runners(backend: arl.Backend, key: str) -> None:
    """Four runners of one job: each interval runs once, in one of them."""
    interval = pace(backend, network=0.2, memory=0.05)
    runs: list[int] = []
    enough = asyncio.Event()

    async def job(slot: int) -> None:
        runs.append(slot)
        if len(runs) >= 5:
            enough.set()

    runners = [
        asyncio.create_task(arl.every(interval, key, job, backend=backend)) for _ in range(4)
    ]
    try:
        await asyncio.wait_for(enough.wait(), 60)
    finally:
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
    assert len(runs) == len(set(runs)), runs
    assert runs == sorted(runs)


async def test_an_interval_is_claimed_once_even_if_its_runner_dies(
    backend: arl.Backend, key: str
) -> None:
    """Twenty claims at once: one wins the slot. A slot whose runner died mid-job is never
    claimed again: a later claim is refused in that slot, or wins a later one."""
    job = _keys.every(backend._head(_keys.EVERY_KIND), key)
    interval_us = 30_000_000
    replies = await asyncio.gather(
        *(backend._run(_scripts.EVERY_CLAIM, [job], (interval_us,)) for _ in range(20))
    )
    # One winner in each slot the claims fell in (one slot, unless they straddled an edge).
    slots = sorted({r[1] for r in replies})
    assert [sum(r[0] for r in replies if r[1] == s) for s in slots] == [1] * len(slots)
    slot = slots[-1]
    again = await backend._run(_scripts.EVERY_CLAIM, [job], (interval_us,))
    assert (again[0], again[1]) == (0, slot) or (again[0] == 1 and again[1] > slot)


async def test_a_failing_job_does_not_stop_the_runner(backend: arl.Backend, key: str) -> None:
    """A job that raises is logged, and the next interval runs as usual."""
    interval = pace(backend, network=0.1, memory=0.02)
    runs: list[int] = []

    async def job(slot: int) -> None:
        runs.append(slot)
        raise RuntimeError("boom")

    runner = asyncio.create_task(arl.every(interval, key, job, backend=backend))
    try:
        await until(lambda: len(runs) >= 2, what="two runs")
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    assert runs[1] > runs[0]


async def test_every_rides_out_an_outage_logging_it_once(
    key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that refuses the claim (here memory:// full: one key, taken) is tried
    again every ``RETRY`` s; the outage is one WARNING, its retries DEBUG; no job runs."""
    runs: list[int] = []

    async def job(slot: int) -> None:
        runs.append(slot)

    caplog.set_level(logging.DEBUG, logger="aioratelimit")
    async with arl.Backend.from_url("memory://?max_keys=1") as full:
        await arl.FixedWindow("1/minute", backend=full).hit(key)  # the one key
        runner = asyncio.create_task(arl.every(1, key, job, backend=full))
        try:
            await until(
                lambda: sum("could not claim" in r.message for r in caplog.records) >= 3,
                what="three failed claims",
            )
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
    failed = [r.levelno for r in caplog.records if "could not claim" in r.message]
    assert failed[0] == logging.WARNING
    assert set(failed[1:]) == {logging.DEBUG}
    assert runs == []


def test_the_vocabulary_of_events() -> None:
    assert _observe.LEADER_EVENTS == ("elected", "resigned", "lost")
