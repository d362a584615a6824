"""The connections ``Backend.from_url`` runs scripts on (``aioratelimit._connections``).

Each call writes one pre-packed EVALSHA on one connection and reads one reply. These tests
pin what that path must keep from redis-py's: the exact wire form, a reply never reaching
another call (whatever is cancelled), connections that survive script errors but not broken
exchanges, and a pool that is bounded and closed with the backend.
"""

from __future__ import annotations

import asyncio
import random

import loops
import pytest
from redis.asyncio.connection import Connection
from servers import RedisServer

import aioratelimit as arl
from aioratelimit._backend import Gate
from aioratelimit._connections import pack
from aioratelimit._memory import Arg
from aioratelimit._scripts import script

#: Echoes its key and arguments: a reply that reached the wrong call would show it.
ECHO = script("test_echo", "return {KEYS[1], ARGV[1]}")
#: Fails inside the server with a script error (the exchange itself completes).
FAIL = script("test_fail", "return redis.error_reply('ERR test failure')")


def _clients(server: RedisServer) -> int:
    """Connections the server has open, without the one asking."""
    inspector = server.client()
    try:
        return len(inspector.client_list()) - 1
    finally:
        inspector.close()


@pytest.mark.parametrize(
    ("keys", "args"),
    [
        (["k"], []),
        (["arl:fw:{user:42}:60"], [1, 1, 100, 60_000_000]),
        (["ключ-{é}", "two"], ["ünïcode", b"\x00\xffraw", 0, -7, 2**62]),
        ([], ["", "a" * 70_000]),
    ],
)
def test_pack_matches_redis_py_byte_for_byte(keys: list[str], args: list[Arg]) -> None:
    """The pre-packed command is exactly what redis-py would have sent for the same call."""
    for s in (ECHO, FAIL):
        theirs = b"".join(Connection().pack_command("EVALSHA", s.sha, len(keys), *keys, *args))
        assert pack(s.evalsha_head, keys, args) == theirs
        theirs = b"".join(Connection().pack_command("EVAL", s.source, len(keys), *keys, *args))
        assert pack(s.eval_head, keys, args) == theirs


@pytest.mark.parametrize("bad", [1.5, True, None, object()])
def test_pack_refuses_what_it_cannot_encode(bad: object) -> None:
    with pytest.raises(TypeError, match="script argument"):
        pack(ECHO.evalsha_head, ["k"], [bad])  # type: ignore[list-item]


async def test_no_reply_ever_reaches_another_call(own_redis: RedisServer) -> None:
    """Calls cancelled at random points (before, during and after their exchange) never
    leave a reply behind for the next call on the same connection."""
    rng = random.Random(7)
    async with arl.Backend.from_url(own_redis.url, max_connections=3) as backend:

        async def call(i: int) -> None:
            assert await backend.run(ECHO, [f"k{i}"], [str(i)]) == [
                f"k{i}".encode(),
                str(i).encode(),
            ]

        for round_ in range(40):
            tasks = [asyncio.ensure_future(call(round_ * 100 + i)) for i in range(12)]
            for _ in range(rng.randrange(4)):
                await asyncio.sleep(0)
            for task in rng.sample(tasks, 6):
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            # Everything not cancelled answered its own call (call() asserts the echo).
            assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results)
        # And afterwards every connection is in step again.
        await asyncio.gather(*(call(i) for i in range(50)))
        assert _clients(own_redis) <= 3


async def test_script_error_keeps_the_connection(own_redis: RedisServer) -> None:
    """An error reply completes the exchange: the connection is reused, not reopened."""
    inspector = own_redis.client()

    def received() -> int:
        return int(inspector.info("stats")["total_connections_received"])

    try:
        async with arl.Backend.from_url(own_redis.url, max_connections=1) as backend:
            await backend.run(ECHO, ["k"], ["1"])
            opened = received()
            for _ in range(5):
                with pytest.raises(arl.BackendUnavailable, match="test failure"):
                    await backend.run(FAIL, ["k"], [])
                assert await backend.run(ECHO, ["k"], ["2"]) == [b"k", b"2"]
            assert received() == opened
    finally:
        inspector.close()


async def test_aclose_closes_every_connection(own_redis: RedisServer) -> None:
    """Idle connections close with the backend; one busy at that moment closes when its
    call ends, and the backend opens no more."""
    backend = arl.Backend.from_url(own_redis.url, max_connections=8)
    await asyncio.gather(*(backend.run(ECHO, ["k"], [str(i)]) for i in range(8)))
    assert 1 <= _clients(own_redis) <= 8
    slow = script("test_slow", "local t = redis.call('TIME') return 1")
    busy = asyncio.ensure_future(backend.run(slow, ["k"], []))
    await asyncio.sleep(0)  # the call has its connection
    await backend.aclose()
    assert await busy == 1
    for _ in range(50):
        if _clients(own_redis) == 0:
            break
        await asyncio.sleep(0.02)
    assert _clients(own_redis) == 0


def test_one_backend_serves_successive_event_loops(own_redis: RedisServer) -> None:
    """A backend used by one ``asyncio.run`` and then by another (an application run twice,
    a test suite with a loop per test) decides on the second loop too, gate included; the
    connections of the ended loop are dropped rather than awaited."""
    backend = arl.Backend.from_url(own_redis.url, max_connections=2)
    limiter = arl.FixedWindow("100/hour", backend=backend)

    async def burst() -> list[int]:
        # 20 calls on 2 connections: 18 of them wait at the gate of this loop.
        decisions = await asyncio.gather(*(limiter.hit("k") for _ in range(20)))
        return sorted(d.remaining for d in decisions)

    assert loops.run(burst()) == list(range(80, 100))
    assert loops.run(burst()) == list(range(60, 80))

    async def check() -> None:
        assert (await limiter.peek("k")).remaining == 59  # after one more hit

    async def close() -> None:
        await backend.aclose()

    loops.run(check())
    loops.run(close())  # from a loop that made no call: it closes the last loop's sockets


# -- the gate in front of the connections ---------------------------------------------------


async def test_gate_bounds_orders_and_never_loses_a_slot() -> None:
    """Random holders, waiters that give up (timeout) or are cancelled at random moments,
    including just as a slot is handed to them: never more than ``size`` inside, waiters
    enter in arrival order, and every slot is back at the end."""
    rng = random.Random(11)
    size = 3
    gate = Gate(size)
    inside = 0
    most = 0
    entered: list[int] = []

    async def call(i: int, timeout: float) -> None:
        nonlocal inside, most
        if gate.free:
            gate.free -= 1
        else:
            await gate.wait(timeout)
        inside += 1
        most = max(most, inside)
        entered.append(i)
        try:
            await asyncio.sleep(rng.choice([0, 0, 0.001, 0.002]))
        finally:
            inside -= 1
            gate.leave()

    for _ in range(20):
        tasks = [
            asyncio.ensure_future(call(i, rng.choice([0.0005, 0.003, 1.0]))) for i in range(30)
        ]
        for _ in range(rng.randrange(6)):
            await asyncio.sleep(rng.choice([0, 0.0005]))
            rng.choice(tasks).cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            assert r is None or isinstance(r, (asyncio.CancelledError, arl.BackendUnavailable)), r
        assert inside == 0
        assert gate.free == size  # no slot lost, none made up
    assert most == size


async def test_gate_serves_waiters_first_come_first_served() -> None:
    gate = Gate(1)
    gate.free -= 1  # held
    order: list[int] = []

    async def waiter(i: int) -> None:
        await gate.wait(5)
        order.append(i)
        gate.leave()

    tasks = [asyncio.ensure_future(waiter(i)) for i in range(10)]
    await asyncio.sleep(0)
    gate.leave()
    await asyncio.gather(*tasks)
    assert order == list(range(10))
    assert gate.free == 1


async def test_gate_timeout_is_backend_unavailable_and_frees_nothing() -> None:
    gate = Gate(1)
    gate.free -= 1
    started = asyncio.get_running_loop().time()
    with pytest.raises(arl.BackendUnavailable, match="no pooled connection came free"):
        await gate.wait(0.05)
    assert asyncio.get_running_loop().time() - started < 1
    gate.leave()
    assert gate.free == 1


async def test_a_slot_handed_to_a_cancelled_waiter_goes_to_the_next() -> None:
    gate = Gate(1)
    gate.free -= 1
    first = asyncio.ensure_future(gate.wait(5))
    second = asyncio.ensure_future(gate.wait(5))
    await asyncio.sleep(0)
    gate.leave()  # hands the slot to `first`...
    first.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1)  # the slot went on to `second`
    gate.leave()
    assert gate.free == 1


def test_contended_locks_on_successive_event_loops(own_redis: RedisServer) -> None:
    """Waiters woken through the shared subscriber work on a second ``asyncio.run`` too:
    the subscriber of the ended loop is closed without it and a new one opened, and the
    backend closes from a third loop, with no socket left behind (a ResourceWarning fails
    the suite). (A cluster backend does not follow a new loop: see docs/index.md.)"""
    backend = arl.Backend.from_url(own_redis.url)
    name = f"successive-{random.random()}"
    held = 0
    most = 0

    async def contended() -> None:
        async def worker() -> None:
            nonlocal held, most
            async with arl.lock(name, ttl=5, timeout=5, backend=backend):
                held += 1
                most = max(most, held)
                await asyncio.sleep(0.005)
                held -= 1

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(6))), 10)

    loops.run(contended())
    loops.run(contended())
    assert most == 1

    async def close() -> None:
        await backend.aclose()

    loops.run(close())
