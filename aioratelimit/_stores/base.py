"""What every store answers to, and the one translation of redis-py and socket errors."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from redis import exceptions as redis_errors

from .._errors import AioRateLimitError, BackendError, BackendUnavailable
from .._notify import Notifier
from .._scripts import Arg, Reply, Script

#: Defaults of what ``Backend.from_url`` builds.
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0

#: What a store's call may raise that ``unavailable`` translates.
TRANSLATED = (redis_errors.RedisError, OSError, asyncio.TimeoutError)


class Store(Protocol):
    """Runs one script atomically, closes, and owns the backend's wake-up subscriber."""

    #: What a script that wakes waiters publishes with: ``"SPUBLISH"`` on a cluster
    #: (shard-local, heard by the notifier), else ``"PUBLISH"``.
    publish_command: str

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply: ...

    async def aclose(self) -> None: ...

    @property
    def notifier(self) -> Notifier: ...


def unavailable(exc: BaseException) -> AioRateLimitError:
    """The one translation of a redis-py or socket error (raise it ``from exc``): an error
    reply is ``BackendError`` (the server is there and said no), anything else
    ``BackendUnavailable``."""
    if isinstance(exc, redis_errors.ResponseError):
        return BackendError(f"Redis answered with an error: {exc}")
    if isinstance(exc, (redis_errors.TimeoutError, asyncio.TimeoutError, TimeoutError)):
        return BackendUnavailable(f"Redis did not answer in time: {exc or type(exc).__name__}")
    return BackendUnavailable(f"Redis is unreachable: {exc or type(exc).__name__}")
