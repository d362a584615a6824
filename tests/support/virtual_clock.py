"""A virtual clock for the memory lane: an asyncio loop that jumps over the waits it idles in.

A memory:// test that lets a window run out, a lease come due or a retry come round waits
for nothing but a timer: no server, no socket, no other process. On ``VirtualClockLoop``
that wait costs no real time. When the loop has nothing to run and nothing to wait for but
its next timer, it moves its clock to that timer instead of sleeping (as trio's autojump
clock does); every other moment runs in real time. So ``loop.time()`` is the monotonic clock
plus the time jumped over: it never runs back, a stall of this process still counts (the
margins a test keeps against one still hold), and a wait of a minute takes microseconds.

The loop jumps only while nothing outside it can wake it up: no file descriptor of its own
is registered (a socket, a subprocess's pipes) and no call it sent to a thread
(``run_in_executor``, ``asyncio.to_thread``, getaddrinfo, its executor's shutdown) is still
running; otherwise it waits in real time, as asyncio's own loop does (so a test that talks
to a server in a thread keeps real time while a request is open). A test that waits on what
the loop cannot see (a thread of its own that wakes it with ``call_soon_threadsafe``, a child
it waits for with no pipe open) is marked ``real_time`` and keeps asyncio's own loop
(tests/conftest.py).

While a test runs on one (``running``), the package's other clocks follow it too: the
memory store's default clock (microseconds since the epoch, what Redis ``TIME`` answers),
the deny cache's, the pauses' and the access lists', and the one that times what the
metrics report; so a window a test sleeps through has passed for the store, and a wait it
jumped over is reported as long as it was.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any, TypeVar, TypeVarTuple

import pytest

from aioratelimit import _observe
from aioratelimit._limits import deny_cache, guard, list_table, pause
from aioratelimit._stores.memory import store as memory_store

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class VirtualClock:
    """The monotonic clock plus every wait jumped over (seconds)."""

    __slots__ = ("skipped",)

    def __init__(self) -> None:
        #: the seconds of idle waits jumped over so far
        self.skipped = 0.0

    def monotonic(self) -> float:
        """``time.monotonic()``, moved on by the waits jumped over."""
        return time.monotonic() + self.skipped

    def monotonic_ns(self) -> int:
        """``time.monotonic_ns()``, moved on by the waits jumped over."""
        return time.monotonic_ns() + round(self.skipped * 1e9)


class _JumpingSelector(selectors.DefaultSelector):
    """The loop's selector: a wait for a timer becomes a poll, then a jump to the timer."""

    def __init__(self, clock: VirtualClock, may_jump: Callable[[], bool]) -> None:
        super().__init__()
        self.clock = clock
        self.may_jump = may_jump

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # asyncio asks for ``timeout`` = the time to its next timer, None when it has none
        # (then only I/O can wake it: a real wait), 0 when something is ready to run.
        if timeout is None or timeout <= 0 or not self.may_jump():
            return super().select(timeout)
        ready = super().select(0)  # the self-pipe: a callback sent from a thread
        if not ready:
            self.clock.skipped += timeout
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """asyncio's own loop on a ``VirtualClock``: it jumps over the waits it idles in."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = VirtualClock() if clock is None else clock
        #: calls sent to threads and not yet over
        self._in_threads = 0
        selector = _JumpingSelector(self.clock, self._idle)
        super().__init__(selector)
        #: the descriptors the loop registers for itself (its self-pipe): the others are I/O
        self._own_fds = len(selector.get_map())
        self._selector_map = selector.get_map()

    def _idle(self) -> bool:
        return self._in_threads == 0 and len(self._selector_map) <= self._own_fds

    def time(self) -> float:
        return self.clock.monotonic()

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._in_threads += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future[Any]) -> None:
        self._in_threads -= 1

    async def shutdown_default_executor(self, *args: Any) -> None:
        # It waits on a thread of its own (with a timer on 3.12+): no jump past it.
        self._in_threads += 1
        try:
            await super().shutdown_default_executor(*args)
        finally:
            self._in_threads -= 1


#: The clock of the running test, if it runs on one (``running``).
current: VirtualClock | None = None


@contextmanager
def running(clock: VirtualClock) -> Iterator[VirtualClock]:
    """Run the test inside the block on ``clock``: its loop (conftest's factory), and the
    package's clocks (the memory store's, for every store whoever builds it: a fixture, the
    test, an app from a URL; the deny cache's; the metrics')."""
    global current
    with pytest.MonkeyPatch.context() as patch:  # (each name must exist: raising=True)
        patch.setattr(memory_store, "_monotonic_ns", clock.monotonic_ns)
        patch.setattr(deny_cache, "clock", clock.monotonic)
        patch.setattr(guard, "clock", clock.monotonic)
        patch.setattr(pause, "clock", clock.monotonic)
        patch.setattr(list_table, "clock", clock.monotonic)
        patch.setattr(_observe, "_clock", clock.monotonic)  # the durations it reports
        current = clock
        try:
            yield clock
        finally:
            current = None
