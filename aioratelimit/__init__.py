"""aioratelimit: distributed rate limits, locks and idempotency for asyncio on Redis.

Every operation is one atomic Lua script (one round trip) through one shared, bounded
connection pool per backend, decided on the Redis server's clock. ``memory://`` is an
in-process store with the same semantics, and the default when nothing is configured.
"""

from ._backend import Backend, configure, get_backend
from ._errors import (
    AioRateLimitError,
    BackendUnavailable,
    IdempotencyInProgress,
    IdempotencyKeyMismatch,
    LockLost,
    LockNotOwned,
    LockTimeout,
    RateLimited,
    TokenRejected,
)
from ._ratelimit import Decision, FixedWindow, SlidingWindow, TokenBucket
from ._rates import Rate

__version__ = "0.1.0"

__all__ = [
    "AioRateLimitError",
    "Backend",
    "BackendUnavailable",
    "Decision",
    "FixedWindow",
    "IdempotencyInProgress",
    "IdempotencyKeyMismatch",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "Rate",
    "RateLimited",
    "SlidingWindow",
    "TokenBucket",
    "TokenRejected",
    "__version__",
    "configure",
    "get_backend",
]
