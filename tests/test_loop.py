"""The event loop the async tests run on: asyncio's own, or uvloop when it is selected."""

from __future__ import annotations

import asyncio
import os

import pytest


@pytest.fixture
async def fixture_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


async def test_async_tests_and_fixtures_run_on_the_selected_loop(
    fixture_loop: asyncio.AbstractEventLoop,
) -> None:
    """AIORATELIMIT_TEST_LOOP=uvloop puts every async test and its async fixtures on one
    uvloop loop; unset (or asyncio), on one of asyncio's own loops."""
    expected = os.environ.get("AIORATELIMIT_TEST_LOOP") or "asyncio"
    loop = asyncio.get_running_loop()
    assert loop is fixture_loop
    assert type(loop).__module__.partition(".")[0] == expected, type(loop)
