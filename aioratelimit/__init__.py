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
    NotReplicated,
    RateLimited,
    ResultNotStored,
    ResultTooLarge,
    TokenRejected,
)
from ._idempotency.decorator import idempotent
from ._idempotency.results import Serializer
from ._idempotency.tokens import consume_token, consumes_token, issue_token
from ._limits.admission import Admission
from ._limits.algorithms import FixedWindow, SlidingWindow, TokenBucket
from ._limits.bans import Ban, BannedKey, BanState
from ._limits.calendar import Quota
from ._limits.failure import Breaker, BreakerListener, Fallback, OnUnavailable
from ._limits.limiter import Limiter
from ._limits.lists import AccessList, ListEntry
from ._limits.multi import AllAdmission, acquire_all, admit_all, hit_all, peek_all
from ._limits.pause import Pause
from ._limits.policies import Policies
from ._limits.policy import Policy, PolicyStore
from ._limits.reservation import Reservation
from ._locks.every import every
from ._locks.fair import FairLock, fair_lock
from ._locks.holding import lock, semaphore
from ._locks.leader import Leader, Term, leader
from ._locks.lease import Hold, Lease
from ._locks.lock import Lock, Semaphore
from ._locks.rwlock import ReadWriteLock, RWState
from ._observe import Recorder, set_recorder
from ._rates import Binding, Decision, Rate, RateLike, parse_rates
from ._scripts import OnCall, ScriptCall
from ._version import __version__
from ._web.headers import ratelimit_headers

__all__ = [
    "AccessList",
    "Admission",
    "AioRateLimitError",
    "AllAdmission",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Ban",
    "BanState",
    "BannedKey",
    "Binding",
    "Breaker",
    "BreakerListener",
    "Decision",
    "FairLock",
    "Fallback",
    "FixedWindow",
    "Hold",
    "IdempotencyInProgress",
    "IdempotencyKeyMismatch",
    "Leader",
    "Lease",
    "Limiter",
    "ListEntry",
    "Lock",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "NotReplicated",
    "OnCall",
    "OnUnavailable",
    "Pause",
    "Policies",
    "Policy",
    "PolicyStore",
    "Quota",
    "RWState",
    "Rate",
    "RateLike",
    "RateLimited",
    "ReadWriteLock",
    "Recorder",
    "Reservation",
    "ResultNotStored",
    "ResultTooLarge",
    "ScriptCall",
    "Semaphore",
    "Serializer",
    "SlidingWindow",
    "Term",
    "TokenBucket",
    "TokenRejected",
    "__version__",
    "acquire_all",
    "admit_all",
    "configure",
    "consume_token",
    "consumes_token",
    "every",
    "fair_lock",
    "get_backend",
    "hit_all",
    "idempotent",
    "issue_token",
    "leader",
    "lock",
    "parse_rates",
    "peek_all",
    "ratelimit_headers",
    "semaphore",
    "set_recorder",
]

_public.publish(__name__, __all__)
