"""The wire ``Backend.from_url`` runs scripts on (``aioratelimit._stores.wire``).

Every call goes over one multiplexed connection: the commands of one event-loop iteration
are written together and the replies matched in order. These tests pin the exact wire
form, a reply never reaching another call (whatever is cancelled), one connection for any
crowd, batching that the server can see, NOSCRIPT answered per call, a bounded number of
calls in flight, a connection that survives script errors and cancellations, and a close
that lets the calls in flight finish.
"""

from __future__ import annotations

import asyncio
import random
from typing import cast

import pytest
from redis.asyncio.connection import Connection
from support import loops
from support.faultproxy import FaultProxy
from support.servers import RedisServer

import aioratelimit as arl
from aioratelimit._scripts import Arg, script
from aioratelimit._stores.resp import pack

#: Echoes its key and arguments: a reply that reached the wrong call would show it.
ECHO = script("test_echo", "return {KEYS[1], ARGV[1]}")
#: Fails inside the server with a script error (the exchange itself completes).
FAIL = script("test_fail", "return redis.error_reply('ERR test failure')")


def _clients(server: RedisServer, name: str | None = None) -> int:
    """Connections the server has open (named ``name``, if given), without the one asking."""
    inspector = server.client()
    try:
        clients = inspector.client_list()
        if name is not None:
            return sum(1 for c in clients if c.get("name") == name)
        return len(clients) - 1
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
    """The pre-packed command is exactly what redis-py would have sent for the same call,
    and so is the one whose arguments come from the cache (a tuple packed before)."""
    for s in (ECHO, FAIL):
        for given in (args, tuple(args), tuple(args)):
            theirs = b"".join(Connection().pack_command("EVALSHA", s.sha, len(keys), *keys, *args))
            assert pack(s.evalsha_head, keys, given) == theirs
            theirs = b"".join(Connection().pack_command("EVAL", s.source, len(keys), *keys, *args))
            assert pack(s.eval_head, keys, given) == theirs


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
            assert await backend._run(ECHO, [f"k{i}"], [str(i)]) == [
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
        # And afterwards the connection is in step again.
        await asyncio.gather(*(call(i) for i in range(50)))
        assert _clients(own_redis) == 1


async def test_script_error_keeps_the_connection(own_redis: RedisServer) -> None:
    """An error reply completes the exchange: the connection is reused, not reopened."""
    inspector = own_redis.client()

    def received() -> int:
        return int(inspector.info("stats")["total_connections_received"])

    try:
        async with arl.Backend.from_url(own_redis.url, max_connections=1) as backend:
            await backend._run(ECHO, ["k"], ["1"])
            opened = received()
            for _ in range(5):
                with pytest.raises(arl.BackendError, match="test failure"):
                    await backend._run(FAIL, ["k"], [])
                assert await backend._run(ECHO, ["k"], ["2"]) == [b"k", b"2"]
            assert received() == opened
    finally:
        inspector.close()


async def test_aclose_lets_the_calls_in_flight_finish_then_closes(own_redis: RedisServer) -> None:
    """A call in flight when the backend closes gets its reply; then no connection is left."""
    backend = arl.Backend.from_url(own_redis.url)
    await asyncio.gather(*(backend._run(ECHO, ["k"], [str(i)]) for i in range(8)))
    assert _clients(own_redis) == 1
    slow = script("test_slow", "local t = redis.call('TIME') return 1")
    busy = asyncio.ensure_future(backend._run(slow, ["k"], []))
    await asyncio.sleep(0)  # the call is on the wire
    await backend.aclose()
    assert await busy == 1
    for _ in range(50):
        if _clients(own_redis) == 0:
            break
        await asyncio.sleep(0.02)
    assert _clients(own_redis) == 0


class _CountingTransport(asyncio.Transport):
    """A transport that counts the writes handed to it (and passes everything on)."""

    writes = 0

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        super().__init__()
        self._inner = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        _CountingTransport.writes += 1
        self._inner.write(data)

    def abort(self) -> None:
        self._inner.abort()

    def close(self) -> None:
        self._inner.close()

    def is_closing(self) -> bool:
        return self._inner.is_closing()


async def test_a_crowd_shares_one_connection_and_its_writes(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 concurrent calls: one connection, every caller its own reply, and one socket
    write per ``CHUNK`` of them (the commands of one loop iteration go out together, in
    chunks), not one per call."""
    from aioratelimit._stores.wire import CHUNK, Wire

    made = Wire.connection_made
    monkeypatch.setattr(Wire, "connection_made", lambda self, t: made(self, _CountingTransport(t)))
    inspector = own_redis.client()
    try:
        async with arl.Backend.from_url(own_redis.url, client_name="crowd") as backend:
            await backend._run(ECHO, ["warm"], ["0"])
            opened = inspector.info("stats")["total_connections_received"]
            _CountingTransport.writes = 0
            replies = await asyncio.gather(
                *(backend._run(ECHO, [f"k{i}"], [str(i)]) for i in range(500))
            )
            assert replies == [[f"k{i}".encode(), str(i).encode()] for i in range(500)]
            # The first command at once, then one write per chunk, the last at the end.
            assert _CountingTransport.writes <= 2 + 500 // CHUNK, _CountingTransport.writes
            assert inspector.info("stats")["total_connections_received"] == opened
            assert _clients(own_redis, "crowd") == 1
    finally:
        inspector.close()


async def test_a_lone_caller_writes_each_call_at_once_and_schedules_nothing(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequential calls: each is one write of its own, written at once, and none leaves a
    batch to flush at the end of its loop iteration (no callback per call)."""
    from aioratelimit._stores.wire import Wire

    made, flush = Wire.connection_made, Wire._flush
    flushes = 0

    def counted(self: Wire) -> None:
        nonlocal flushes
        flushes += 1
        flush(self)

    monkeypatch.setattr(Wire, "connection_made", lambda self, t: made(self, _CountingTransport(t)))
    monkeypatch.setattr(Wire, "_flush", counted)
    async with arl.Backend.from_url(own_redis.url) as backend:
        await backend._run(ECHO, ["warm"], ["0"])
        _CountingTransport.writes, flushes = 0, 0
        for i in range(50):
            assert await backend._run(ECHO, [f"k{i}"], [str(i)]) == [f"k{i}".encode(), b"%d" % i]
        assert (_CountingTransport.writes, flushes) == (50, 0)


async def test_a_call_made_before_any_reply_came_opens_a_batch(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call made in a later loop iteration than a call written alone, before any reply
    came, opens a batch (written when its iteration ends) that later calls of that
    iteration join; every caller gets its own reply, and once replies are read the next
    call goes alone again."""
    from aioratelimit._stores.wire import Wire

    made = Wire.connection_made
    monkeypatch.setattr(Wire, "connection_made", lambda self, t: made(self, _CountingTransport(t)))
    with FaultProxy(own_redis.port) as proxy:
        async with arl.Backend.from_url(proxy.url) as backend:
            await backend._run(ECHO, ["warm"], ["0"])
            _CountingTransport.writes = 0
            proxy.stall()  # no reply comes back until it passes again
            first = asyncio.ensure_future(backend._run(ECHO, ["k"], ["first"]))
            await asyncio.sleep(0)  # the first call is written, alone
            assert _CountingTransport.writes == 1
            later = [asyncio.ensure_future(backend._run(ECHO, ["k"], [str(i)])) for i in range(3)]
            await asyncio.sleep(0)  # the three open a batch and join it...
            await asyncio.sleep(0)  # ...written in one write once their iteration ended
            assert _CountingTransport.writes == 2
            proxy.passthrough()
            replies = await asyncio.gather(first, *later)
            assert replies == [[b"k", b"first"], *([b"k", b"%d" % i] for i in range(3))]
            assert await backend._run(ECHO, ["k"], ["next"]) == [b"k", b"next"]
            assert _CountingTransport.writes == 3


async def test_cancelled_callers_never_cost_the_shared_connection(own_redis: RedisServer) -> None:
    """Hundreds of callers cancelled in flight: their replies are read and dropped, the
    connection stays the same one, and the next calls are answered correctly."""
    inspector = own_redis.client()
    rng = random.Random(3)
    try:
        async with arl.Backend.from_url(own_redis.url) as backend:
            await backend._run(ECHO, ["warm"], ["0"])
            opened = inspector.info("stats")["total_connections_received"]
            for _ in range(20):
                tasks = [
                    asyncio.ensure_future(backend._run(ECHO, [f"k{i}"], [str(i)]))
                    for i in range(50)
                ]
                await asyncio.sleep(0)
                for task in rng.sample(tasks, 25):
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            assert await backend._run(ECHO, ["k"], ["last"]) == [b"k", b"last"]
            assert inspector.info("stats")["total_connections_received"] == opened
    finally:
        inspector.close()


async def test_noscript_is_answered_per_call_in_a_crowd(own_redis: RedisServer) -> None:
    """After SCRIPT FLUSH, each of a crowd of calls gets its own reply (the NOSCRIPT ones
    by EVAL), in one connection, and nothing is answered twice."""
    inspector = own_redis.client()
    try:
        async with arl.Backend.from_url(own_redis.url, client_name="flushed") as backend:
            await backend._run(ECHO, ["warm"], ["0"])
            for _ in range(3):
                inspector.script_flush()
                replies = await asyncio.gather(
                    *(backend._run(ECHO, [f"k{i}"], [str(i)]) for i in range(100))
                )
                assert replies == [[f"k{i}".encode(), str(i).encode()] for i in range(100)]
            assert _clients(own_redis, "flushed") == 1
    finally:
        inspector.close()


async def test_ten_thousand_callers_all_get_answers_within_the_cap(own_redis: RedisServer) -> None:
    """10,000 concurrent callers through a cap of 100 calls in flight: every one answered,
    and never more than 100 replies owed on the wire at once."""
    from aioratelimit._stores.wire import Wire

    most = 0
    send = Wire.send

    def counting(
        self: Wire, data: bytes, *, preface: bytes | None = None
    ) -> asyncio.Future[object]:
        nonlocal most
        waiter = send(self, data, preface=preface)
        most = max(most, self.pending)
        return waiter

    Wire.send = counting  # type: ignore[method-assign]
    try:
        async with arl.Backend.from_url(own_redis.url, max_in_flight=100, timeout=30) as backend:
            limiter = arl.FixedWindow("100000/hour", backend=backend)
            decisions = await asyncio.gather(*(limiter.hit(f"k{i % 50}") for i in range(10_000)))
    finally:
        Wire.send = send  # type: ignore[method-assign]
    assert all(d.allowed for d in decisions)
    assert sorted(d.remaining for d in decisions)[:50] == [100000 - 200] * 50
    assert most <= 100


async def test_on_call_reports_every_call_without_its_keys(own_redis: RedisServer) -> None:
    """The instrumentation hook sees each script call once it is over: the script's name,
    the server, a duration, the error if any; never a key or an argument."""
    calls: list[arl.ScriptCall] = []
    async with arl.Backend.from_url(own_redis.url, on_call=calls.append) as backend:
        limiter = arl.FixedWindow("10/minute", backend=backend)
        await limiter.hit("secret-user-key")
        with pytest.raises(arl.BackendError):
            await backend._run(FAIL, ["k"], [])
    assert [c.script for c in calls] == ["fixed_window", "test_fail"]
    assert all(c.server == f"127.0.0.1:{own_redis.port}" for c in calls)
    assert all(c.duration_ns > 0 and c.start_ns > 0 for c in calls)
    assert calls[0].error is None
    assert isinstance(calls[1].error, arl.BackendError)
    assert "secret-user-key" not in repr(calls)


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
