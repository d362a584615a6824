"""``Admission``, a limiter's ``async with limiter(key)``, and ``limit_calls``, what its
``@limiter.limit`` decorator builds: both take a hit through the limiter's ``acquire``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from .._args import binder
from .._rates import Decision

P = ParamSpec("P")
R = TypeVar("R")


#: A limiter's ``acquire(key, cost, wait=, timeout=)``.
Acquire = Callable[..., Awaitable[Decision]]


class Admission:
    """``async with limiter(key, ...) as decision``: entering takes the hit (and waits, with
    ``wait=True``) or raises ``RateLimited``; leaving gives nothing back."""

    __slots__ = ("_acquire", "_cost", "_key", "_timeout", "_wait")

    def __init__(
        self,
        acquire: Callable[..., Awaitable[Decision]],
        key: str,
        cost: int,
        wait: bool,
        timeout: float | None,
    ) -> None:
        self._acquire, self._key, self._cost = acquire, key, cost
        self._wait, self._timeout = wait, timeout

    async def __aenter__(self) -> Decision:
        return await self._acquire(self._key, self._cost, wait=self._wait, timeout=self._timeout)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A rate limit is not a resource held by the block: nothing to give back.
        return None


def limit_calls(
    acquire: Acquire,
    key: str | Callable[..., str],
    cost: int,
    wait: bool,
    timeout: float | None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """The decorator of ``@limiter.limit(key, ...)`` (its arguments checked already)."""
    key_of, fixed_key = (None, key) if isinstance(key, str) else (key, "")

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@limit decorates an async function (async def), not {fn!r}")
        bind = binder(fn)

        @functools.wraps(fn)
        async def limited(*args: P.args, **kwargs: P.kwargs) -> R:
            bound, named = bind(args, kwargs)
            k = fixed_key if key_of is None else key_of(*bound, **named)
            await acquire(k, cost, wait=wait, timeout=timeout)
            return await fn(*args, **kwargs)

        return limited

    return decorate
