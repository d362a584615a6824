"""The virtual clock of the memory lane (support/virtual_clock.py): what it jumps over and
what it waits for in real time."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from support import loops
from support.virtual_clock import VirtualClockLoop

import aioratelimit as arl

pytestmark = pytest.mark.skipif(loops.NAME != "asyncio", reason="asyncio's loop only")


async def test_an_idle_wait_costs_no_real_time() -> None:
    """An hour's sleep on the virtual clock moves the loop's clock an hour, at once."""
    loop = asyncio.get_running_loop()
    assert type(loop) is VirtualClockLoop
    started, real = loop.time(), time.monotonic()
    await asyncio.sleep(3600)
    assert loop.time() - started >= 3600
    assert time.monotonic() - real < 1


async def test_the_memory_store_and_the_deny_cache_follow_the_clock() -> None:
    """A window slept through has passed for memory:// and for the deny cache: the key
    that was denied for an hour is admitted an hour later, from the store."""
    async with arl.Backend.from_url("memory://") as backend:
        limiter = arl.FixedWindow("1/hour", backend=backend, deny_cache=10)
        assert (await limiter.hit("k")).allowed
        for _ in range(200):  # denied, until the cache answers (once it has subscribed)
            denied = await limiter.hit("k")
            assert not denied.allowed
            if denied.source == "cache":
                break
            await asyncio.sleep(0.01)
        assert denied.source == "cache"
        await asyncio.sleep(denied.retry_after)
        again = await limiter.hit("k")
        assert (again.allowed, again.source) == (True, "redis")


async def test_a_call_in_a_thread_is_waited_for_in_real_time() -> None:
    """While a call sent to a thread runs, a timer beside it is not jumped to: the call
    ends first, as on asyncio's own loop."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(asyncio.to_thread(time.sleep, 0.2), timeout=30)
    assert 0.2 <= loop.time() - started < 30


async def test_a_socket_is_waited_on_in_real_time() -> None:
    """While the loop waits on a socket of its own, a timer beside it is not jumped to:
    bytes a thread sends 0.2 s later arrive before a 30 s timeout."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    sender = threading.Timer(0.2, theirs.send, (b"x",))
    try:
        sender.start()
        assert await asyncio.wait_for(loop.sock_recv(ours, 1), timeout=30) == b"x"
    finally:
        sender.cancel()
        ours.close()
        theirs.close()


@pytest.mark.real_time
async def test_a_real_time_test_keeps_asyncios_own_loop() -> None:
    """A memory test marked real_time runs on asyncio's own loop, on the real clock."""
    assert type(asyncio.get_running_loop()) is not VirtualClockLoop
    assert isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)


@pytest.mark.parametrize("backend", ["memory", "redis", "cluster", "sentinel"])
async def test_only_memory_tests_run_on_the_virtual_clock(backend: str) -> None:
    """A test on a server keeps the real clock: the server's clock would not jump."""
    on_virtual = type(asyncio.get_running_loop()) is VirtualClockLoop
    assert on_virtual == (backend == "memory")
