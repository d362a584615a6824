"""aioratelimit: distributed rate limits, locks and idempotency for asyncio on Redis.

Every operation is one atomic Lua script (one round trip) on the backend's shared,
multiplexed connection, decided on the Redis server's clock. ``memory://`` is an
in-process store with the same semantics, and the default when nothing is configured.
"""

from . import _public
from ._backend import Backend, configure, get_backend
from ._errors import (
    AioRateLimitError,
    BackendError,
    BackendUnavailable,
    IdempotencyInProgress,
    IdempotencyKeyMismatch,
    LockLost,
    LockNotOwned,
    LockTimeout,
    RateLimited,
    ResultNotStored,
    ResultTooLarge,
    TokenRejected,
)
from ._idempotency.decorator import idempotent
from ._idempotency.results import Serializer
from ._idempotency.tokens import consume_token, consumes_token, issue_token
from ._limits.algorithms import FixedWindow, SlidingWindow, TokenBucket
from ._limits.calendar import Quota
from ._limits.failure import Breaker, BreakerListener, Fallback, OnUnavailable
from ._limits.limiter import Admission, Limiter
from ._limits.lists import AccessList, ListEntry
from ._limits.pause import Pause
from ._limits.reservation import Reservation
from ._locks.lease import Hold, Lease
from ._locks.lock import Lock, Semaphore, lock, semaphore
from ._observe import Recorder, set_recorder
from ._rates import Decision, Rate, RateLike, parse_rates
from ._scripts import OnCall, ScriptCall
from ._version import __version__
from ._web.headers import ratelimit_headers

__all__ = [
    "AccessList",
    "Admission",
    "AioRateLimitError",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Breaker",
    "BreakerListener",
    "Decision",
    "Fallback",
    "FixedWindow",
    "Hold",
    "IdempotencyInProgress",
    "IdempotencyKeyMismatch",
    "Lease",
    "Limiter",
    "ListEntry",
    "Lock",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "OnCall",
    "OnUnavailable",
    "Pause",
    "Quota",
    "Rate",
    "RateLike",
    "RateLimited",
    "Recorder",
    "Reservation",
    "ResultNotStored",
    "ResultTooLarge",
    "ScriptCall",
    "Semaphore",
    "Serializer",
    "SlidingWindow",
    "TokenBucket",
    "TokenRejected",
    "__version__",
    "configure",
    "consume_token",
    "consumes_token",
    "get_backend",
    "idempotent",
    "issue_token",
    "lock",
    "parse_rates",
    "ratelimit_headers",
    "semaphore",
    "set_recorder",
]

_public.publish(__name__, __all__)
