"""``Reservation``: a cost admitted on an estimate, then settled to the real cost once the
work has told it (the tokens of a streamed answer, the bytes of a response).

Taking a reservation is a plain hit for the estimate (one script call). ``settle(actual)``
returns at once; one script call then runs in the background, on the limiter's refund
script (``lua/*_refund.lua``): below the estimate it gives the unused part back, above it
charges the excess. The call carries a record, a random id the script stores under the
user key's tag with a TTL, so a repeat of the same call changes nothing: it is safe to
send again after a lost reply (``Backend._run_repeatable``), and is applied exactly once.
The backend tracks the call (``Backend.drain``, ``aclose``); a failure is logged (and the
store reports it to the metrics as a backend error), never raised at the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Generator
from types import TracebackType
from typing import Any, Protocol

from .. import _keys, _observe
from .._args import MAX_COUNT, to_ms
from .._backend import Backend, get_backend
from .._errors import RateLimited
from .._public import NoPublicConstructor
from .._rates import Decision
from .._scripts import Script
from .guard import Guard

log = logging.getLogger("aioratelimit")

#: How long a settlement's record lives, in multiples of the backend's ``timeout``: a
#: resend comes within two of them of the first send (``_run_repeatable``); at least
#: ``RECORD_MIN_SECONDS``, so a short timeout still covers a reply late on the wire.
RECORD_TIMEOUTS = 4
RECORD_MIN_SECONDS = 1.0


class Reserving(Protocol):
    """What a reservation uses of its ``Limiter`` (which imports this module)."""

    name: str | None
    _backend: Backend | None
    _guard: Guard[Any] | None
    _head_id: tuple[str, str | None]
    _hit_mode: int
    _kind: str
    _refund_args: tuple[int | str, ...]
    _refund_script: Script
    _reserves: bool
    _script: Script
    _suffixes: tuple[str, ...]

    def _keys(self, backend: Backend, key: str) -> list[str]: ...

    def _tag(self, key: str) -> str | None: ...

    def _send(self, key: str, cost: int, mode: int, *extra: int) -> Awaitable[Any]: ...


class Reservation(metaclass=NoPublicConstructor):
    """A cost admitted on an estimate and settled later: ``limiter.reserve(key, estimate)``.

    ``async with limiter.reserve(key, estimate) as r:`` (or ``r = await
    limiter.reserve(key, estimate)``) takes one hit for ``estimate``, raising
    ``RateLimited`` when denied. ``r.settle(actual)`` then corrects it, in the background:
    below the estimate the unused part is given back (only to the window, or sliding-window
    bucket, that counted it: one that has ended gets nothing back; a TokenBucket's TAT moves
    back, never before the clock), above it the excess is charged (into the window or
    bucket open then, or the TAT moves forward) even past the limit: a debt that denies the
    key's next hits until it has passed. Left unsettled, the estimate stands (leaving the
    ``async with``, with or without an exception, keeps it).

    ``settle`` may be called from anywhere on the event loop, after the response was sent
    (a middleware's callback): it returns at once; ``await r.wait()``, or the backend's
    ``drain()`` (``aclose()`` drains), waits for the call. ``state`` says where it is:
    ``"new"``, ``"taking"`` (its hit in flight), ``"held"``, ``"denied"``, ``"settling"``,
    ``"settled"``, or ``"failed"`` (logged; the estimate stands).
    """

    __slots__ = ("_at_us", "_limiter", "_task", "actual", "decision", "estimate", "key", "state")

    def __init__(self, limiter: Reserving, key: str, estimate: int) -> None:
        self._limiter = limiter
        #: the user key and the cost admitted on the estimate
        self.key, self.estimate = key, estimate
        #: the hit's ``Decision`` (None until taken)
        self.decision: Decision | None = None
        #: the cost settled (None until ``settle``)
        self.actual: int | None = None
        self.state = "new"
        # The server's clock at the hit (µs; a TokenBucket's TAT after it): a give-back
        # reaches only the window that counted it (the tokens of it still lacking). 0 when
        # the hit went through the limiter's options (deny cache, failure policy, shadow
        # mode), which answer a Decision only: settled against the windows open then.
        self._at_us = 0
        self._task: asyncio.Task[Any] | None = None

    # -- taking it ---------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Reservation]:
        return self._take().__await__()

    async def __aenter__(self) -> Reservation:
        return await self._take()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Unsettled, the estimate stands: the work it paid for may have been done, in part.
        return None

    async def _take(self) -> Reservation:
        if self.state != "new":
            raise RuntimeError(f"{self!r} was taken already")
        self.state = "taking"
        try:
            decision = await self._hit()
        except BaseException:
            self.state = "new"
            raise
        self.decision = decision
        if not decision.allowed:
            self.state = "denied"
            raise RateLimited(f"rate limited: {self.key!r}", decision=decision)
        self.state = "held"
        return self

    async def _hit(self) -> Decision:
        limiter, key, cost = self._limiter, self.key, self.estimate
        mode = limiter._hit_mode
        guard = limiter._guard
        if guard is not None:
            return guard.cached(key, cost, mode) or await guard.decide(key, cost, mode)
        replies: list[Any] = []

        async def send(*args: Any) -> Any:
            reply = await limiter._send(*args)
            replies.append(reply)
            return reply

        if _observe.recorder is not None:
            decision = await _observe.decide(
                limiter.name, limiter._script.name, send, key, cost, mode
            )
        else:
            decision = Decision.from_reply(await send(key, cost, mode))
        # now_us: the clock the hit was counted on; a TokenBucket's (a script that books a
        # slot: ``_reserves``) is the TAT the hit left, now_us + reset_after_us.
        reply = replies[0]
        self._at_us = int(reply[5]) + (int(reply[3]) if limiter._reserves else 0)
        return decision

    # -- settling it -------------------------------------------------------------------

    def settle(self, actual: int) -> None:
        """Settle the reservation to ``actual`` (an int from 0 up), once, in the background:
        one script call, applied exactly once (see the class). Returns at once; raises
        ``RuntimeError`` on a reservation not held (not taken, denied, settled already)
        and ``ValueError``/``TypeError`` for a bad ``actual``, changing nothing."""
        if type(actual) is not int:
            raise TypeError(f"actual must be an int, not {type(actual).__name__}")
        limiter = self._limiter
        # A TokenBucket's charge moves its TAT by the excess times its interval: both must
        # stay within what the script computes exactly.
        unit = int(limiter._refund_args[-1]) if limiter._reserves else 1
        if actual < 0 or (actual - self.estimate) * unit > MAX_COUNT:
            raise ValueError(
                f"actual must be from 0 to {self.estimate + MAX_COUNT // unit}, got {actual}"
            )
        if self.state != "held":
            raise RuntimeError(f"{self!r} is not held: only an admitted reservation settles, once")
        decision = self.decision
        assert decision is not None
        give = self.estimate - actual
        # Nothing to correct, or nothing was counted (a failure policy's or fallback's
        # admission, or one that shadow mode let through): no call.
        if give == 0 or decision.source != "redis" or decision.shadow_denied:
            self.actual, self.state = actual, "settled"
            return
        backend = limiter._backend or get_backend()
        keys = limiter._keys(backend, self.key)[: len(limiter._suffixes)]
        head = backend._heads.get(limiter._head_id) or backend._head(limiter._kind, limiter.name)
        keys.append(_keys.settlement(head, self.key, _keys.new_token(), limiter._tag(self.key)))
        record_ms = to_ms(max(RECORD_MIN_SECONDS, RECORD_TIMEOUTS * backend.timeout))
        args = (give, self._at_us, record_ms, *limiter._refund_args)
        call = self._apply(backend, keys, args)
        try:
            self._task = backend._spawn(call)
        except RuntimeError:  # no running event loop: nothing was started
            call.close()
            raise
        self.actual, self.state = actual, "settling"

    async def _apply(self, backend: Backend, keys: list[str], args: tuple[int | str, ...]) -> None:
        limiter = self._limiter
        try:
            await backend._run_repeatable(limiter._refund_script, keys, args)
        except Exception as exc:  # reported here: nobody awaits the call to hear it
            self.state = "failed"
            log.error(
                "aioratelimit: a settlement of %s (%s, %d) failed: %r",
                limiter.name or limiter._kind,
                limiter._refund_script.name,
                args[0],
                exc,
            )
            return
        except BaseException:
            self.state = "failed"
            raise
        self.state = "settled"
        guard = limiter._guard
        if int(args[0]) > 0 and guard is not None:
            # What was given back may admit a hit this process's deny cache would refuse.
            guard.forget(self.key)

    async def wait(self) -> None:
        """Wait until the settlement's call has ended (at once when there is none); its
        outcome is ``state``. Cancelling the wait leaves the call running."""
        if self._task is not None:
            await asyncio.wait((self._task,))

    def __repr__(self) -> str:
        settled = "" if self.actual is None else f" actual={self.actual}"
        return f"<Reservation {self.key!r} estimate={self.estimate}{settled} {self.state}>"
