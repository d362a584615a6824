"""Instrumentation: what the primitives report, and the one recorder that hears it.

``recorder`` is None until instrumentation is switched on (``aioratelimit.otel.instrument``
or ``set_recorder``); a hot path (a decision, an acquire, a claim) tests it once and, when
it is None, does nothing else. Everything reported names the operation (the limiter's
name, its algorithm, lock or semaphore, the outcome), never the user's key, token or lock
name: those are unbounded and private. A recorder is a ``Recorder`` (a base class whose
methods do nothing): ``aioratelimit.otel`` turns its calls into OpenTelemetry instruments;
an application without OpenTelemetry subclasses it (both public: ``docs/metrics.md``).

A decision that did not come from a script (the deny cache, a pause, a fallback, shadow
mode, an
access list) is reported with ``decided(..., result=DENIED_CACHED | PAUSED | DEGRADED |
SHADOW_DENIED | ALLOWED_LISTED | DENIED_LISTED)``, and a
circuit breaker's change of state with ``breaker_changed(state)``.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._errors import BackendError, BackendUnavailable, LockTimeout
from ._rates import Decision
from ._scripts import Claim

T = TypeVar("T")

# -- the vocabularies (attribute values; each is a closed set) ---------------------------

#: A decision's result (``aioratelimit.rate_limiting.result``).
ALLOWED = "allowed"
DENIED = "denied"
DENIED_CACHED = "denied_cached"  # denied by the local cache of denials, without a round trip
DEGRADED = "degraded"  # answered by the fallback policy while the backend is unavailable
PAUSED = "paused"  # denied by a shared pause (``Pause``) known here, without a round trip
SHADOW_DENIED = "shadow_denied"  # would have been denied; admitted because the limit is shadowed
ALLOWED_LISTED = "allowed_listed"  # on an access list's allow entries: no limit counted
DENIED_LISTED = "denied_listed"  # on an access list's deny entries: refused, no limit counted
ERROR = "error"  # no decision: the backend failed (the error is counted in backend errors)
RESULTS = (
    *(ALLOWED, DENIED, DENIED_CACHED, PAUSED, DEGRADED, SHADOW_DENIED, ERROR),
    *(ALLOWED_LISTED, DENIED_LISTED),
)

#: How a lock or semaphore acquire ended (``aioratelimit.lock.result``).
ACQUIRED, TIMEOUT, CANCELED = "acquired", "timeout", "canceled"
ACQUIRE_RESULTS = (ACQUIRED, TIMEOUT, CANCELED, ERROR)

#: How one background renewal ended: extended, refused (the lease was gone), or failed
#: (the backend did not answer; it is tried again until the lease's deadline).
RENEWED, REFUSED, FAILED = "renewed", "refused", "failed"
RENEWAL_RESULTS = (RENEWED, REFUSED, FAILED)

#: What a claim of an idempotency key found (``aioratelimit.idempotency.outcome``).
FIRST_RUN, REPLAY, IN_PROGRESS, MISMATCH = "first_run", "replay", "in_progress", "mismatch"
OUTCOMES = (FIRST_RUN, REPLAY, IN_PROGRESS, MISMATCH)

#: What happened to a leader's term in this process (``aioratelimit.leader.event``): it
#: began leading, resigned (left its block), or lost the term under its block.
ELECTED, RESIGNED, LOST = "elected", "resigned", "lost"
LEADER_EVENTS = (ELECTED, RESIGNED, LOST)

#: A circuit breaker's states (``aioratelimit.breaker.state``).
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
BREAKER_STATES = (CLOSED, OPEN, HALF_OPEN)

#: Why a backend call failed (``aioratelimit.backend.reason``), next to ``error.type``.
REASONS = ("timeout", "unreachable", "busy", "error_reply")


class Recorder:
    """What instrumentation hears: subclass it, override what you collect, and install it
    with ``set_recorder`` (every method here does nothing). Times are seconds; no argument
    is ever a user's key, token or lock name. Each method is called on the event loop, on
    the path of the operation it reports: keep it short and never let it raise."""

    __slots__ = ()

    def decision(
        self, limiter: str | None, algorithm: str, result: str, seconds: float, decision: Any
    ) -> None:
        """One rate-limit decision: the limiter's ``name``, its algorithm (the script:
        ``fixed_window``, ``sliding_window``, ``token_bucket``), the result (``RESULTS``), how
        long it took, and its ``Decision`` (None without one: an error)."""

    def acquire(self, kind: str, result: str, seconds: float) -> None:
        """One lock (``kind="lock"``) or semaphore acquire, waits included, by how it ended
        (``ACQUIRE_RESULTS``)."""

    def renewal(self, kind: str, result: str) -> None:
        """One background renewal of a lease (``RENEWAL_RESULTS``)."""

    def lost(self, kind: str) -> None:
        """A lease lost under its ``async with`` block (``LockLost``)."""

    def leader(self, name: str, event: str) -> None:
        """This process began or ended a term of the leader election ``name`` (the name
        the application gave ``arl.leader``, a role: never a user's key), by ``event``
        (``LEADER_EVENTS``)."""

    def claim(self, name: str | None, outcome: str) -> None:
        """One claim of an idempotency key (``name``: the store's or decorator's ``name=``,
        never the key) by what it found (``OUTCOMES``)."""

    def backend_error(self, error_type: str, reason: str, script: str | None) -> None:
        """A call to the backend raised ``error_type`` (``"BackendUnavailable"`` or
        ``"BackendError"``) for ``reason`` (``REASONS``), running ``script`` if known."""

    def breaker(self, state: str, server: str | None) -> None:
        """A circuit breaker entered ``state`` (``BREAKER_STATES``)."""

    def ban(self, limiter: str | None, algorithm: str, seconds: float) -> None:
        """A limiter made with ``ban=`` banned a key for ``seconds`` (the denial that
        issued it is reported as a decision too)."""


#: The recorder, or None: instrumentation off (the one test a hot path makes).
recorder: Recorder | None = None

#: The name of the limiter whose decision is in flight in this context (spans read it).
LIMITER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "aioratelimit_limiter", default=None
)

_clock = time.perf_counter


def set_recorder(new: Recorder | None) -> Recorder | None:
    """Make ``new`` the recorder every primitive reports to (None: off, the default);
    returns the one it replaces."""
    global recorder
    if new is not None and not isinstance(new, Recorder):
        raise TypeError(f"a recorder must be an aioratelimit.Recorder, not {type(new).__name__}")
    old, recorder = recorder, new
    return old


# -- what primitives call when ``recorder`` is not None ----------------------------------


async def decide(
    limiter: str | None, algorithm: str, send: Callable[..., Awaitable[Any]], *args: Any
) -> Decision:
    """``Decision.from_reply(await send(*args))``, timed and reported as one decision."""
    began = _clock()
    token = LIMITER.set(limiter)
    try:
        decision = banned(limiter, algorithm, await send(*args))
    except (BackendUnavailable, BackendError):  # not bad input: that is no decision at all
        decided(limiter, algorithm, ERROR, _clock() - began, None)
        raise
    finally:
        LIMITER.reset(token)
    decided(limiter, algorithm, ALLOWED if decision.allowed else DENIED, _clock() - began, decision)
    return decision


async def guarded(limiter: str | None, algorithm: str, call: Awaitable[Decision]) -> Decision:
    """``await call`` (a decision through a limiter's options: ``_limits.guard``), timed and
    reported with the result its fields say (``result_of``)."""
    began = _clock()
    token = LIMITER.set(limiter)
    try:
        decision = await call
    except (BackendUnavailable, BackendError):
        decided(limiter, algorithm, ERROR, _clock() - began, None)
        raise
    finally:
        LIMITER.reset(token)
    decided(limiter, algorithm, result_of(decision), _clock() - began, decision)
    return decision


def banned(limiter: str | None, algorithm: str, reply: Any) -> Decision:
    """``Decision.from_reply``, reporting first a ban the reply says it issued (a ninth
    element: a limiter made with ``ban=``, ``lua/ban_common.lua``)."""
    if len(reply) > 8 and recorder is not None:
        recorder.ban(limiter, algorithm, reply[4] / 1_000_000)
    return Decision.from_reply(reply)


def result_of(decision: Decision) -> str:
    """The result a decision reports: where it came from, and what it said."""
    if decision.shadow:
        return SHADOW_DENIED if decision.shadow_denied else ALLOWED
    if decision.source == "cache":
        return DENIED_CACHED
    if decision.source == "pause":
        return PAUSED
    if decision.degraded:
        return DEGRADED
    return ALLOWED if decision.allowed else DENIED


def breaker_listener(breaker: object, old: str, new: str) -> None:
    """A ``Breaker.on_change`` listener: every change of state reported (``breaker_changed``)."""
    breaker_changed(new)


def decided(
    limiter: str | None, algorithm: str, result: str, seconds: float, decision: Any = None
) -> None:
    """Report one decision made elsewhere (the local deny cache, a fallback, shadow mode)."""
    if recorder is not None:
        recorder.decision(limiter, algorithm, result, seconds, decision)


async def acquire(kind: str, call: Awaitable[T]) -> T:
    """``await call`` (a lock's or semaphore's acquire), timed and reported by its end
    (bad arguments, refused before any I/O, are not reported)."""
    began = _clock()
    try:
        lease = await call
    except LockTimeout:
        _acquired(kind, TIMEOUT, began)
        raise
    except asyncio.CancelledError:
        _acquired(kind, CANCELED, began)
        raise
    except (BackendUnavailable, BackendError):
        _acquired(kind, ERROR, began)
        raise
    _acquired(kind, ACQUIRED, began)
    return lease


def _acquired(kind: str, result: str, began: float) -> None:
    if recorder is not None:
        recorder.acquire(kind, result, _clock() - began)


#: A claim's outcome by the first element of ``idem_claim``'s reply.
_CLAIMS: dict[int, str] = {
    Claim.CLAIMED: FIRST_RUN,
    Claim.COMPLETED: REPLAY,
    Claim.IN_PROGRESS: IN_PROGRESS,
    Claim.MISMATCH: MISMATCH,
}


def claimed(name: str | None, code: int) -> None:
    """Report one idempotency claim by the code its script answered."""
    if recorder is not None:
        recorder.claim(name, _CLAIMS[code])


def renewal(kind: str, result: str) -> None:
    if recorder is not None:
        recorder.renewal(kind, result)


def leader(name: str, event: str) -> None:
    if recorder is not None:
        recorder.leader(name, event)


def lost(kind: str) -> None:
    if recorder is not None:
        recorder.lost(kind)


def backend_error(error: BaseException, reason: str, script: str | None) -> None:
    if recorder is not None:
        recorder.backend_error(type(error).__name__, reason, script)


def breaker_changed(state: str, server: str | None = None) -> None:
    """Report that a circuit breaker entered ``state`` (``CLOSED``, ``OPEN``, ``HALF_OPEN``);
    ``server`` names what it guards (``host:port``), never a URL with a password."""
    if state not in BREAKER_STATES:
        raise ValueError(f"a breaker state is one of {BREAKER_STATES}, not {state!r}")
    if recorder is not None:
        recorder.breaker(state, server)
