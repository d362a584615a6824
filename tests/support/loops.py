"""The event loop the tests run on: asyncio's own, or uvloop with AIORATELIMIT_TEST_LOOP=uvloop.

conftest.py hands the choice to pytest-asyncio for the async tests; the loops the tests make
themselves (an application run twice, a worker process, a server thread, a state machine)
come from ``run`` and ``new_loop`` here, so they follow the same choice. Unset, both are
exactly ``asyncio.run`` and ``asyncio.new_event_loop``.

Also the lane of scripts/test the run belongs to (``AIORATELIMIT_TEST_LANE``, set by the
lanes' tox configuration in pyproject.toml): ``MAIN_LANE`` is what the checks that run once,
in the main lane, read (the docs examples' cold starts, the benchmarks' smoke runs); a run
outside scripts/test counts as the main lane.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: "asyncio" (the default) or "uvloop".
NAME = os.environ.get("AIORATELIMIT_TEST_LOOP") or "asyncio"
NAMES = ("asyncio", "uvloop")
#: The lane of scripts/test this run belongs to ("main" for a run of pytest outside it).
LANE = os.environ.get("AIORATELIMIT_TEST_LANE") or "main"
#: Whether this is scripts/test's main lane (or a run of pytest outside it).
MAIN_LANE = LANE == "main"


def _factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if NAME == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


#: The selected loop's factory; None for asyncio's default (its event loop policy decides).
FACTORY = _factory()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a new loop of the selected kind."""
    with asyncio.Runner(loop_factory=FACTORY) as runner:
        return runner.run(main)


def new_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.new_event_loop()`` of the selected kind."""
    return FACTORY() if FACTORY is not None else asyncio.new_event_loop()
