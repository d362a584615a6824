"""What every store answers to, and the one translation of redis-py and socket errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import hiredis
from redis import exceptions as redis_errors

from .._errors import AioRateLimitError, BackendError, BackendUnavailable
from .._notify import Notifier
from .._scripts import Arg, Reply, Script, ScriptCall

#: Observes every script call of a Redis store once it is over (``from_url(on_call=)``).
OnCall = Callable[[ScriptCall], None]

#: Defaults of what ``Backend.from_url`` builds.
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_MAX_IN_FLIGHT = 1024
DEFAULT_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 2.0

#: What a store's call may raise that ``translate`` translates.
TRANSLATED = (redis_errors.RedisError, OSError, TimeoutError, hiredis.ReplyError)


class Store(Protocol):
    """Runs one script atomically, closes, and owns the backend's wake-up subscriber."""

    #: What a script that wakes waiters publishes with: ``"SPUBLISH"`` on a cluster
    #: (shard-local, heard by the notifier), else ``"PUBLISH"``.
    publish_command: str

    @property
    def run(self) -> Callable[[Script, Sequence[str], Sequence[Arg]], Awaitable[Reply]]:
        """``await store.run(script, keys, args)``: one script, atomically."""

    async def aclose(self) -> None: ...

    @property
    def notifier(self) -> Notifier: ...


#: Error replies that mean "not now" (a failover, a restart, a busy server), not "no".
_TRANSIENT = ("READONLY", "LOADING", "MASTERDOWN", "BUSY", "CLUSTERDOWN", "TRYAGAIN")


def translate(exc: BaseException) -> AioRateLimitError:
    """The one translation of what a call to Redis raised (raise it ``from exc``).

    An error reply is ``BackendError`` (the server is there and said no: a permission, a
    script error, maxmemory), except the replies that only mean "not now", which are
    ``BackendUnavailable`` like a connection that broke or a reply that never came.
    """
    if isinstance(exc, (redis_errors.ResponseError, hiredis.ReplyError)):
        message = str(exc)
        if message.startswith(_TRANSIENT):
            return BackendUnavailable(f"Redis cannot answer now: {message}")
        return BackendError(f"Redis answered with an error: {message}")
    if isinstance(exc, (redis_errors.TimeoutError, TimeoutError)):
        return BackendUnavailable(f"Redis did not answer in time: {exc or type(exc).__name__}")
    return BackendUnavailable(f"Redis is unreachable: {exc or type(exc).__name__}")
