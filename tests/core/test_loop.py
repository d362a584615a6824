"""The event loop the tests run on: asyncio's own, or uvloop when it is selected."""

from __future__ import annotations

import asyncio
import os

import pytest
from support import loops
from support.virtual_clock import VirtualClockLoop

#: What AIORATELIMIT_TEST_LOOP asks for, read here independently of loops.py.
EXPECTED = os.environ.get("AIORATELIMIT_TEST_LOOP") or "asyncio"


def kind(loop: asyncio.AbstractEventLoop) -> str:
    """The top-level package the loop's class comes from, asyncio or uvloop (a subclass of
    asyncio's own loop, as the virtual clock's, is asyncio's)."""
    packages = (cls.__module__.partition(".")[0] for cls in type(loop).__mro__)
    return next(package for package in packages if package in ("asyncio", "uvloop"))


@pytest.fixture
async def fixture_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


async def test_async_tests_and_fixtures_run_on_the_selected_loop(
    fixture_loop: asyncio.AbstractEventLoop,
) -> None:
    """AIORATELIMIT_TEST_LOOP=uvloop puts every async test and its async fixtures on one
    uvloop loop; unset (or asyncio), on one of asyncio's own loops."""
    loop = asyncio.get_running_loop()
    assert loop is fixture_loop
    assert kind(loop) == EXPECTED, type(loop)


async def test_a_memory_test_runs_on_the_virtual_clock_on_asyncio_only(
    fixture_loop: asyncio.AbstractEventLoop,
) -> None:
    """A memory test and its async fixtures share one loop: asyncio's own on the virtual
    clock (support/virtual_clock.py), or uvloop unchanged when that is selected."""
    loop = asyncio.get_running_loop()
    assert loop is fixture_loop
    if EXPECTED == "asyncio":
        assert type(loop) is VirtualClockLoop
        assert isinstance(loop, asyncio.SelectorEventLoop)
    else:
        assert kind(loop) == EXPECTED, type(loop)


def test_the_loops_tests_make_follow_the_selection() -> None:
    """loops.run and loops.new_loop, which the tests use instead of asyncio.run and
    asyncio.new_event_loop, give a loop of the selected kind too."""

    async def running() -> str:
        return kind(asyncio.get_running_loop())

    assert loops.run(running()) == EXPECTED
    loop = loops.new_loop()
    try:
        assert kind(loop) == EXPECTED, type(loop)
    finally:
        loop.close()
