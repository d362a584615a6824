"""Helpers for testing an application that uses aioratelimit.

Every test gets its own empty in-process store (``memory://``), installed as the default
backend for that test alone, so counts, locks and tokens never leak from one test into the
next, and the default that was there before (none, usually) comes back afterwards. While
it is installed it wins over the application's own ``configure()`` (which returns it), so
an app that configures itself at start-up still runs on the test's store. With a
``ManualClock``, time moves for the store only when the test says so: a test of "denied
now, admitted a minute later" runs in no time.

As a pytest plugin, in the ``conftest.py`` at the top of your tests::

    pytest_plugins = ["aioratelimit.testing"]

    async def test_login_is_limited(arl_backend, arl_clock):
        ...                             # the app's limiters use arl_backend
        arl_clock.advance(60)           # a minute later, for the store

Without pytest (unittest, a script), the same with ``default_backend()``::

    with default_backend(memory_backend(clock=ManualClock())) as backend:
        ...

This module never imports pytest unless pytest is installed; the fixtures exist only then.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

from . import _public
from ._backend import (
    Backend,
    install_test_default,
    memory_backend,
    restore_default,
    swap_default,
)
from ._scripts import OnCall

__all__ = ["ManualClock", "OnCall", "default_backend", "memory_backend", "reset_default"]


class ManualClock:
    """A clock for a ``memory_backend``: it stands still until ``advance`` moves it.

    It replaces the Redis server's clock (``TIME``), which every decision, TTL and expiry
    is computed from. Waiting still happens on the event loop's own clock: with a manual
    clock, ``wait=True`` and lock ``timeout=`` sleep in real time while the store's time
    stands still, so a test advances the clock instead of waiting.
    """

    __slots__ = ("_us",)

    def __init__(self, start: float | None = None) -> None:
        """``start``: seconds since the epoch (default: the wall clock's current whole
        second, so that advancing by a window lands on the millisecond a key expires at)."""
        if start is None:
            start = float(int(time.time()))
        self._us = _micros(start, "start")

    def __call__(self) -> int:
        """The time now, in whole microseconds since the epoch (what the store reads)."""
        return self._us

    @property
    def now(self) -> float:
        """The time now, in seconds since the epoch."""
        return self._us / 1e6

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward (never back: Redis's clock does not run back
        for a decision, and a limiter's answers assume it)."""
        self._us += _micros(seconds, "seconds")

    def __repr__(self) -> str:
        return f"<ManualClock now={self.now:.6f}>"


def _micros(seconds: float, name: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(seconds).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, not {seconds!r}")
    return round(seconds * 1_000_000)


@contextmanager
def default_backend(backend: Backend | None = None) -> Iterator[Backend]:
    """Install ``backend`` (default: a new ``memory_backend()``) as the default backend for
    the ``with`` block, and put back the default that was there before on the way out,
    whatever the block did.

    While it is installed it wins over the application's own set-up: ``configure()``
    (called at start-up, in a FastAPI lifespan run by ``TestClient``) returns it instead of
    building a backend, and ``aclose()`` on it (the app's shutdown) leaves it open.

    The backend is not closed: whoever built it closes it, after the block (a memory
    backend holds no connection and needs no closing).
    """
    if backend is None:
        backend = memory_backend()
    elif not isinstance(backend, Backend):
        raise TypeError(f"default_backend() takes a Backend, not {type(backend).__name__}")
    previous = install_test_default(backend)
    try:
        yield backend
    finally:
        restore_default(previous)


def reset_default() -> None:
    """Forget the default backend, so the next use builds it again from ``REDIS_URL``
    (else ``memory://``), as in a fresh process (a test backend installed around it no
    longer wins over ``configure()``). It is not closed."""
    swap_default(None)


try:
    import pytest
except ImportError:  # pragma: no cover - the helpers above work without pytest
    pass
else:

    @pytest.fixture
    def arl_clock() -> ManualClock:
        """A ``ManualClock`` for this test; ``arl_backend`` runs on it when both are asked for."""
        return ManualClock()

    @pytest.fixture
    def arl_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
        """A new, empty memory:// backend, installed as the default for this test alone
        (the previous default is put back after it); the app's ``configure()`` returns it
        and never closes it (``default_backend``). On ``arl_clock`` when the test asks for
        that fixture too, else on the wall clock."""
        clock: ManualClock | None = None
        if "arl_clock" in request.fixturenames:
            clock = request.getfixturevalue("arl_clock")
        with default_backend(memory_backend(clock=clock)) as backend:
            yield backend


_public.publish(__name__, __all__)
