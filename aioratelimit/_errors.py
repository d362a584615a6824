"""The exceptions aioratelimit raises.

::

    AioRateLimitError
    ├── RateLimited             a hit was denied      (.decision, .retry_after)
    ├── LockTimeout             a lock wait ran out   (.name, .timeout)
    ├── LockLost                a held lock was lost  (.name)
    ├── LockNotOwned            extend/release of a lease no longer held (.name)
    ├── TokenRejected           a one-shot token was not consumed
    ├── IdempotencyInProgress   the first call with this key still runs (.key, .retry_after)
    ├── IdempotencyKeyMismatch  the key was used with another fingerprint (.key)
    ├── ResultNotStored         the key's call completed, its result could not be stored
    │                           (.key, .reason)
    ├── BackendUnavailable      Redis unreachable or too slow (cause chained)
    └── BackendError            the server answered with an error that is not an outage
        │                       (a permission, a script error, maxmemory; cause chained)
        └── NotReplicated       a write asked to be confirmed by replicas was not
                                (.wanted, .acknowledged, .fsynced)

Bad arguments raise the built-in ``ValueError`` / ``TypeError`` before any I/O. One more
``ValueError`` carries data: ``ResultTooLarge`` (an ``@idempotent`` result over its cap;
.key, .size, .limit), raised by the store before any I/O.
"""

from __future__ import annotations

import copyreg
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._rates import Decision


def _reduce(exc: BaseException) -> tuple[Any, ...]:
    """Pickle an exception whose data are keyword-only (``LockLost(name=...)``) whole:
    rebuilt without calling ``__init__`` (``BaseException``'s own way calls it with the
    message alone, which such an ``__init__`` refuses), then given its attributes back."""
    # copyreg.__newobj__(cls, *args) is cls.__new__(cls, *args): pickle's NEWOBJ, untyped.
    return copyreg.__newobj__, (type(exc), *exc.args), exc.__dict__  # type: ignore[attr-defined]


class AioRateLimitError(Exception):
    """Root of every exception raised by aioratelimit (besides ValueError/TypeError)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)

    __reduce__ = _reduce


class RateLimited(AioRateLimitError):
    """A hit was denied; ``retry_after`` seconds until the same cost could be admitted."""

    def __init__(self, message: str = "rate limited", *, decision: Decision) -> None:
        super().__init__(message)
        self.decision = decision
        self.retry_after = decision.retry_after


class LockTimeout(AioRateLimitError):
    """The lock (or semaphore) could not be acquired within ``timeout`` seconds."""

    def __init__(self, message: str = "", *, name: str, timeout: float | None) -> None:
        super().__init__(message or f"could not acquire {name!r} within {timeout} s")
        self.name = name
        self.timeout = timeout


class LockLost(AioRateLimitError):
    """A held lock expired or was taken by another holder while its block ran."""

    def __init__(self, message: str = "", *, name: str) -> None:
        super().__init__(message or f"lock {name!r} was lost while held")
        self.name = name


class LockNotOwned(AioRateLimitError):
    """``extend`` or ``release`` of a lease that no longer holds the lock."""

    def __init__(self, message: str = "", *, name: str) -> None:
        super().__init__(message or f"lock {name!r} is not held by this lease")
        self.name = name


class TokenRejected(AioRateLimitError):
    """A one-shot token was unknown, expired, already used or issued for another subject."""


class IdempotencyInProgress(AioRateLimitError):
    """A call with this idempotency key is still running elsewhere."""

    def __init__(self, message: str = "", *, key: str, retry_after: float) -> None:
        super().__init__(message or f"a call with idempotency key {key!r} is in progress")
        self.key = key
        self.retry_after = retry_after


class IdempotencyKeyMismatch(AioRateLimitError):
    """The idempotency key was first used with a different request fingerprint."""

    def __init__(self, message: str = "", *, key: str) -> None:
        super().__init__(message or f"idempotency key {key!r} was used with another request")
        self.key = key


class ResultNotStored(AioRateLimitError):
    """The first call with this idempotency key completed, but its result could not be
    stored (not serializable, or over the size cap): the function is not run again, and
    every later call with the key raises this until the record's ``ttl`` passes."""

    def __init__(self, message: str = "", *, key: str, reason: str) -> None:
        super().__init__(
            message
            or f"the call with idempotency key {key!r} completed, but its result could not be"
            f" stored ({reason}); it is not run again"
        )
        self.key = key
        self.reason = reason


class BackendUnavailable(AioRateLimitError):
    """Redis could not be reached or did not answer in time; the cause is chained."""


class BackendError(AioRateLimitError):
    """The server answered with an error that is not an outage: a command the ACL user may
    not run, a script error, maxmemory reached, a server or test double that cannot run
    the scripts. The message is the server's, with the fix where it is known."""


class NotReplicated(BackendError):
    """A write made with ``replicas=`` (or ``aof=True``) was not acknowledged in time by as
    many replicas as it asked for (``WAIT``), or not written to the AOF (``WAITAOF``).

    The primitive has already given back what can be given back (a lock or a semaphore
    slot released, an issued token withdrawn, an idempotency claim released); what cannot
    (a consumed token, a stored result) stands, and the message says what to do.
    ``wanted``: the replicas asked for; ``acknowledged``: those that confirmed;
    ``fsynced``: whether the master's own AOF confirmed (``None`` without ``aof``).
    """

    def __init__(
        self,
        message: str = "",
        *,
        wanted: int = 0,
        acknowledged: int = 0,
        fsynced: bool | None = None,
    ) -> None:
        super().__init__(
            message or f"the write was confirmed by {acknowledged} of {wanted} replicas"
        )
        self.wanted = wanted
        self.acknowledged = acknowledged
        self.fsynced = fsynced


class ResultTooLarge(ValueError):
    """A result, serialized, is over the store's cap (``max_result_bytes``): refused before
    any I/O. ``@idempotent`` then records the key as completed without a result
    (``ResultNotStored`` for later calls)."""

    def __init__(self, message: str = "", *, key: str, size: int, limit: int) -> None:
        super().__init__(
            message
            or f"the result of idempotency key {key!r} is {size} bytes, over the cap of {limit}"
        )
        self.key = key
        self.size = size
        self.limit = limit

    __reduce__ = _reduce
