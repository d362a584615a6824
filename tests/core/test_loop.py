"""The event loop the tests run on: asyncio's own, or uvloop when it is selected."""

from __future__ import annotations

import asyncio
import os

import pytest
from support import loops

#: What AIORATELIMIT_TEST_LOOP asks for, read here independently of loops.py.
EXPECTED = os.environ.get("AIORATELIMIT_TEST_LOOP") or "asyncio"


def kind(loop: asyncio.AbstractEventLoop) -> str:
    """The top-level package the loop's class comes from: asyncio or uvloop."""
    return type(loop).__module__.partition(".")[0]


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
