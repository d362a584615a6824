"""aioratelimit: distributed rate limits, locks and idempotency for asyncio on Redis.

Every operation is one atomic Lua script (one round trip) through one shared, bounded
connection pool per backend, decided on the Redis server's clock. ``memory://`` is an
in-process store with the same semantics, and the default when nothing is configured.
"""

from importlib.metadata import PackageNotFoundError, version

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
from ._failure import Breaker, Fallback
from ._idempotent import idempotent
from ._lease import Hold, Lease
from ._limiters import FixedWindow, SlidingWindow, TokenBucket
from ._lock import Lock, Semaphore, lock, semaphore
from ._observe import Recorder, set_recorder
from ._ratelimit import Admission, Limiter
from ._rates import Decision, Rate
from ._results import Serializer
from ._scripts import ScriptCall
from ._tokens import consume_token, consumes_token, issue_token

try:
    __version__ = version("aioratelimit")  # one source of truth: pyproject.toml
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

__all__ = [
    "Admission",
    "AioRateLimitError",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Breaker",
    "Decision",
    "Fallback",
    "FixedWindow",
    "Hold",
    "IdempotencyInProgress",
    "IdempotencyKeyMismatch",
    "Lease",
    "Limiter",
    "Lock",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "Rate",
    "RateLimited",
    "Recorder",
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
    "semaphore",
    "set_recorder",
]
