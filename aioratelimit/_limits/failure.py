"""What a limiter does when its backend is unavailable: the policy and the circuit breaker.

``on_unavailable`` is ``"raise"`` (the core's default: ``BackendUnavailable`` reaches the
caller), ``"allow"`` or ``"deny"`` (answered at once, nothing counted anywhere), or a
``Fallback(share)``: an in-process limiter of the same algorithm whose limits are ``share``
of the real ones (e.g. ``1 / expected_instances``), counted while the backend is away.

A ``Breaker`` saves every call of an outage from first waiting for its own timeout: after
``failures`` consecutive unavailable calls it opens, and for ``cooldown`` seconds the
limiter serves the policy without calling the backend; then ONE call goes through as a
probe (``half_open``): if the backend answers, the breaker closes and decisions count on
the backend again at once; if not, it opens for another cool-down. Every change of state
is logged and told to ``Breaker.on_change`` (one place to hook metrics to).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Literal

from .._args import check_int, check_seconds

log = logging.getLogger("aioratelimit")

BreakerState = Literal["closed", "open", "half_open"]
CLOSED: BreakerState = "closed"
OPEN: BreakerState = "open"
HALF_OPEN: BreakerState = "half_open"
BreakerListener = Callable[["Breaker", str, str], None]
"""A ``Breaker.on_change`` listener: called as ``listener(breaker, old_state, new_state)``
on every change of state."""

POLICIES = ("raise", "allow", "deny")


class Fallback:
    """``on_unavailable=Fallback(share)``: while the backend is unavailable, count hits on
    an in-process limiter of the same algorithm whose every limit (a TokenBucket's burst
    too) is ``floor(limit * share)``, at least 1. ``share`` is in ``(0, 1]``: one process
    never admits more than its share of the real limit."""

    __slots__ = ("share",)

    def __init__(self, share: float) -> None:
        if isinstance(share, bool) or not isinstance(share, (int, float)):
            raise TypeError(f"Fallback share must be a number, not {type(share).__name__}")
        if math.isnan(share) or not 0 < share <= 1:
            raise ValueError(
                f"Fallback share must be in (0, 1] (a share of the limit), got {share}"
            )
        self.share = float(share)

    def scale(self, limit: int) -> int:
        """This process's part of ``limit`` (at least 1, never more than ``limit``)."""
        return max(1, math.floor(limit * self.share + 1e-9))

    def __repr__(self) -> str:
        return f"Fallback({self.share!r})"


OnUnavailable = Literal["raise", "allow", "deny"] | Fallback
"""What ``on_unavailable=`` takes: ``"raise"``, ``"allow"``, ``"deny"`` or a ``Fallback``."""


def check_on_unavailable(
    value: object, words: tuple[str, ...] = POLICIES, *, fallback: bool = True
) -> OnUnavailable:
    """``value`` if it is one of ``words``, or a ``Fallback`` where one is taken (a web face
    takes other words than a limiter)."""
    if fallback and isinstance(value, Fallback):
        return value
    names = [repr(w) for w in words] + (["a Fallback"] if fallback else [])
    choices = ", ".join(names[:-1]) + " or " + names[-1]
    if not isinstance(value, str):
        raise TypeError(f"on_unavailable must be {choices}, not {type(value).__name__}")
    if value not in words:
        raise ValueError(f"on_unavailable must be {choices}, got {value!r}")
    return value  # type: ignore[return-value]


class Breaker:
    """A circuit breaker, shareable by several limiters (one per backend is typical).

    ``closed``: every call goes to the backend; ``failures`` consecutive unavailable
    calls open it. ``open``: no call goes to the backend for ``cooldown`` seconds.
    ``half_open``: one probe is under way; the others are served by the policy.
    """

    __slots__ = ("_failed", "_listeners", "_opened_at", "cooldown", "failures", "name", "state")

    def __init__(self, failures: int = 5, cooldown: float = 5.0, *, name: str = "") -> None:
        self.failures = check_int(failures, "failures")
        self.cooldown = check_seconds(cooldown, "cooldown")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        self.name = name
        self.state: str = CLOSED  # a BreakerState
        self._failed = 0  # consecutive unavailable calls
        self._opened_at = 0.0
        self._listeners: list[BreakerListener] = []

    def on_change(self, listener: BreakerListener) -> None:
        """Call ``listener(breaker, old_state, new_state)`` on every change of state."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, not {type(listener).__name__}")
        self._listeners.append(listener)

    def allow(self) -> bool:
        """May this call go to the backend? (True in ``closed``; once per cool-down as the
        probe, which moves it to ``half_open``.)"""
        state = self.state
        if state == CLOSED:
            return True
        if state == OPEN and time.monotonic() >= self._opened_at + self.cooldown:
            self._change(HALF_OPEN)
            return True
        return False

    def succeeded(self) -> None:
        """The backend answered (a reply, or an error reply: it is up)."""
        self._failed = 0
        if self.state != CLOSED:
            self._change(CLOSED)

    def failed(self) -> None:
        """A call found the backend unavailable."""
        self._failed += 1
        if self.state == HALF_OPEN or (self.state == CLOSED and self._failed >= self.failures):
            self._opened_at = time.monotonic()
            self._change(OPEN)

    def abandoned(self) -> None:
        """The probe ended without an answer either way (cancelled): let the next call probe."""
        if self.state == HALF_OPEN:
            self._opened_at = time.monotonic() - self.cooldown
            self._change(OPEN)

    def _change(self, new: BreakerState) -> None:
        old, self.state = self.state, new
        if new == OPEN:
            log.warning(
                "aioratelimit: circuit breaker %s open: backend unavailable (%d calls);"
                " serving the failure policy for %.3g s",
                self.name or hex(id(self)),
                self._failed,
                self.cooldown,
            )
        else:
            log.info("aioratelimit: circuit breaker %s %s", self.name or hex(id(self)), new)
        for listener in self._listeners:
            try:
                listener(self, old, new)
            except Exception:  # a listener's bug must not break a decision
                log.exception("aioratelimit: a breaker listener raised")

    def __repr__(self) -> str:
        return (
            f"<Breaker {self.state} failures={self._failed}/{self.failures}"
            f" cooldown={self.cooldown}>"
        )
