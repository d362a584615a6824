"""The ``RateLimit`` and ``RateLimit-Policy`` fields of a ``Decision``: one formatting for
every web face (ASGI, FastAPI, aiohttp) and for any other framework (``ratelimit_headers``).

Written to draft-ietf-httpapi-ratelimit-headers-11 (May 2026): both fields are Structured
Field lists (RFC 9651) of items named by a quoted policy name. ``RateLimit-Policy`` carries
each policy's quota ``q`` and window ``w``; ``RateLimit`` the available quota ``r`` and the
*effective window* ``t``: the seconds within which the client can use no more than ``r``.
That is not "until the quota is full again": for a token bucket it is the time to the next
token, for a sliding window the time to the end of the current sub-window (no counted hit
can leave the window before), for a fixed window the time to its end. On a refusal ``t`` is
the ``Retry-After`` wait, which the draft asks never to end before the effective window.

Whole seconds, rounded up (the draft has no sub-second precision): a client that spreads
``r`` over ``t`` never outpaces the limit. No partition key (``pk``) is sent: the key a
limiter counts under is the client's identity, never something to echo in a header.

A quota's shape is per algorithm (``SHAPES``): a new kind of limit (an in-flight quota,
``qu="concurrent-requests"`` and no window; a calendar quota, ``t`` to the period's end)
registers one ``Shape`` and every face formats it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .._args import US, check_key
from .._limits.algorithms import FixedWindow, SlidingWindow, TokenBucket
from .._limits.limiter import Limiter
from .._rates import Decision, token_bucket


@dataclass(frozen=True, slots=True)
class Quota:
    """One ``RateLimit-Policy`` item's parameters: quota ``q``, window ``w`` in whole
    seconds (``None``: no window, an in-flight quota), quota unit ``qu`` (``None``: the
    draft's default, ``"requests"``)."""

    q: int
    w: int | None
    qu: str | None = None


class Shape:
    """How one algorithm's quotas read as fields: its policy items (``quotas``), and the
    effective window of an admitted decision (``window``, in seconds; ``None``: no ``t``).

    This base is the fixed window's: each rate a quota, ``t`` the time to its end.
    """

    __slots__ = ()

    def quotas(self, limiter: Limiter) -> list[Quota]:
        assert isinstance(limiter, (FixedWindow, SlidingWindow))
        return [Quota(r.limit, seconds_header(r.window)) for r in limiter.rates]

    def window(self, limiter: Limiter, decision: Decision) -> float | None:
        return decision.reset_after


class _Sliding(Shape):
    """A counted hit stays in its sub-window's bucket until the whole window has passed it,
    and the oldest bucket leaves only when the next one begins: nothing returns before the
    current bucket ends. An admitted hit's ``reset_after`` is that end plus ``n`` buckets."""

    __slots__ = ()

    def window(self, limiter: Limiter, decision: Decision) -> float | None:
        assert isinstance(limiter, SlidingWindow)
        n = limiter.buckets
        rates = [r for r in limiter.rates if r.limit == decision.limit] or list(limiter.rates)
        size = -(-rates[0].window_us // n)  # as the script cuts the window
        return _phase(round(decision.reset_after * US), size)


class _Bucket(Shape):
    """GCRA: one token every ``interval``; ``reset_after`` is the time to a full bucket, so
    the next token is its remainder modulo the interval. The quota is the burst, its window
    the time a full burst takes to refill (the rate's long-run pace)."""

    __slots__ = ()

    def quotas(self, limiter: Limiter) -> list[Quota]:
        assert isinstance(limiter, TokenBucket)
        rate = limiter.rate
        return [Quota(limiter.burst, seconds_header(limiter.burst * rate.window / rate.limit))]

    def window(self, limiter: Limiter, decision: Decision) -> float | None:
        assert isinstance(limiter, TokenBucket)
        interval = token_bucket(limiter.rate, limiter.burst)[1]
        return _phase(round(decision.reset_after * US), interval)


def _phase(reset_us: int, period_us: int) -> float:
    """Seconds to the next multiple of ``period_us`` before ``reset_us`` runs out: a full
    period when it falls on one (a full bucket's next token is an interval away)."""
    rest = reset_us % period_us
    return (rest or period_us) / US


#: The shape of each limiter class the fields describe (subclasses included).
SHAPES: dict[type[Limiter], Shape] = {
    FixedWindow: Shape(),
    SlidingWindow: _Sliding(),
    TokenBucket: _Bucket(),
}


def shape_of(limiter: object) -> Shape | None:
    for kind in type(limiter).__mro__:
        shape = SHAPES.get(kind)
        if shape is not None:
            return shape
    return None


def check_limiter(limiter: object) -> Limiter:
    """``limiter`` if it is one whose quota the ``RateLimit`` fields can describe."""
    if shape_of(limiter) is None:
        names = ", ".join(k.__name__ for k in SHAPES)
        raise TypeError(f"limiter must be one of {names}, not {type(limiter).__name__}")
    assert isinstance(limiter, Limiter)
    return limiter


def sf_string(text: str) -> str:
    """``text`` as a Structured Field string (RFC 9651 §3.3.3)."""
    if not all(" " <= c <= "~" for c in text):
        raise ValueError(f"a policy name must be printable ASCII: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def seconds_header(seconds: float) -> int:
    """Whole seconds for ``Retry-After``, ``w`` and a refusal's ``t``: rounded up, at least 1."""
    return max(1, math.ceil(seconds - 1e-9))


def _whole(seconds: float) -> int:
    return max(0, math.ceil(seconds - 1e-9))


def choose_policy_name(given: str | None, limiter: Limiter, default: str) -> str:
    """The policy name a limiter's fields carry: ``given`` (a face's ``policy_name=`` or a
    rule's ``name=``), else the limiter's own ``name``, else ``default``. The one place the
    name is chosen: a decision that names its own policy would be read here."""
    return given or limiter.name or default


class QuotaPolicy:
    """A limiter's quota policies under one name, and the fields they produce.

    A limiter with one rate is one policy named ``name``; with several, one per rate,
    ``name-1``, ``name-2``..., and ``RateLimit`` reports the one the decision speaks for
    (the binding rate: the decision's limit). Names are the application's, never a client's.
    """

    __slots__ = ("_dynamic", "_items", "_shape", "limiter", "name", "names", "policy_header")

    def __init__(self, limiter: Limiter, name: str) -> None:
        self.limiter = check_limiter(limiter)
        shape = shape_of(limiter)
        assert shape is not None
        self._shape = shape
        self._fill(self.check_name(name), shape.quotas(limiter))
        # A limiter made with ``policies=``: (policy name, policy) -> its fields' view
        self._dynamic: dict[tuple[str, object], QuotaPolicy] = {}

    def _fill(self, name: str, quotas: list[Quota]) -> None:
        self.name = name
        n = len(quotas)
        #: the unquoted name of each policy item
        self.names = (name,) if n == 1 else tuple(f"{name}-{i}" for i in range(1, n + 1))
        self._items = [(sf_string(p), q) for p, q in zip(self.names, quotas, strict=True)]
        self.policy_header = ", ".join(
            item + "".join(f";{k}={v}" for k, v in _params(q)) for item, q in self._items
        )

    def _view(self, decision: Decision) -> QuotaPolicy:
        """The policy ``decision`` obeyed: this one, or for a limiter made with
        ``policies=`` the named policy's rates (``"pro"``; the code's rates keep this name);
        a key's own override (``"key"``) or a policy not read yet in this process shows
        the decision's limit without a window."""
        name = decision.policy
        policies = getattr(self.limiter, "_policies", None)
        if name is None or policies is None or name == "default":
            return self
        policy = policies.known(name)
        found = self._dynamic.get((name, policy or decision.limit))
        if found is not None:
            return found
        quotas = [Quota(decision.limit, None)]
        if policy is not None:
            quotas = [Quota(r.limit, seconds_header(r.window)) for r in policy.rates[:1]]
            if not isinstance(self.limiter, TokenBucket):
                quotas = [Quota(r.limit, seconds_header(r.window)) for r in policy.rates]
        found = object.__new__(QuotaPolicy)
        found.limiter, found._shape, found._dynamic = self.limiter, self._shape, {}
        try:
            found._fill(self.check_name(name), quotas)
        except (ValueError, TypeError):  # a name a field cannot carry: the limiter's own
            found._fill(self.name, quotas)
        if len(self._dynamic) < 256:
            self._dynamic[name, policy or decision.limit] = found
        return found

    @staticmethod
    def check_name(name: object) -> str:
        """A policy name: a non-empty printable-ASCII ``str``."""
        check_key(name, "policy_name")
        assert isinstance(name, str)
        sf_string(name)
        return name

    def _index(self, decision: Decision) -> int:
        """The policy item ``decision`` speaks for: the rate whose quota is its limit."""
        for i, (_, quota) in enumerate(self._items):
            if quota.q == decision.limit:
                return i
        return 0

    def violated(self, decision: Decision) -> str:
        """The name of the policy a refused ``decision`` exceeded (``violated-policies``)."""
        view = self._view(decision)
        return view.names[view._index(decision)]

    def effective_window(self, decision: Decision) -> int | None:
        """``t``: on a refusal the ``Retry-After`` wait; admitted, the shape's window.
        A decision made without the backend (a fallback twin's, whose rates are scaled)
        says only when its quota is full again."""
        if not decision.allowed:
            return seconds_header(decision.retry_after)
        if decision.source != "redis":
            return _whole(decision.reset_after)
        seconds = self._shape.window(self.limiter, decision)
        return None if seconds is None else _whole(seconds)

    def ratelimit(self, decision: Decision) -> str:
        """The ``RateLimit`` field: the available quota and the effective window."""
        t = self.effective_window(decision)
        view = self._view(decision)
        item = view._items[view._index(decision)][0]
        return f"{item};r={decision.remaining}" + ("" if t is None else f";t={t}")

    def pairs(self, decision: Decision, legacy: bool = False) -> list[tuple[str, str]]:
        """The fields of a response to ``decision``: ``RateLimit-Policy``, ``RateLimit``,
        ``Retry-After`` on a refusal, ``X-RateLimit-Shadow`` for a shadow decision; with
        ``legacy``, ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` (a Unix time in
        whole seconds, as GitHub and most clients read it: when the quota is whole again,
        or on a refusal when the request could pass)."""
        policy_header = self._view(decision).policy_header
        fields = [("RateLimit-Policy", policy_header), ("RateLimit", self.ratelimit(decision))]
        if not decision.allowed:
            fields.append(("Retry-After", str(seconds_header(decision.retry_after))))
        if decision.shadow:
            fields.append(("X-RateLimit-Shadow", "denied" if decision.shadow_denied else "allowed"))
        if legacy:
            reset = (
                _whole(decision.reset_after)
                if decision.allowed
                else seconds_header(decision.retry_after)
            )
            fields += [
                ("X-RateLimit-Limit", str(decision.limit)),
                ("X-RateLimit-Remaining", str(decision.remaining)),
                ("X-RateLimit-Reset", str(math.ceil(time.time()) + reset)),
            ]
        return fields

    def headers(self, decision: Decision, legacy: bool = False) -> list[tuple[bytes, bytes]]:
        """``pairs`` as ASGI headers: lower-case names, latin-1 bytes."""
        return [(k.lower().encode(), v.encode("ascii")) for k, v in self.pairs(decision, legacy)]

    def __repr__(self) -> str:
        return f"<QuotaPolicy {self.policy_header}>"


def _params(quota: Quota) -> list[tuple[str, str]]:
    params = [("q", str(quota.q))]
    if quota.qu is not None:
        params.append(("qu", sf_string(quota.qu)))
    if quota.w is not None:
        params.append(("w", str(quota.w)))
    return params


#: Policies ``ratelimit_headers`` remembers, by (limiter, name): emptied when full.
_POLICIES: dict[tuple[Limiter, str], QuotaPolicy] = {}
_POLICY_CACHE = 256


def ratelimit_headers(
    decision: Decision,
    limiter: Limiter,
    *,
    policy_name: str | None = None,
    legacy: bool = False,
) -> list[tuple[str, str]]:
    """The response fields for ``decision``, a decision of ``limiter``, in any framework.

    ``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-ratelimit-headers-11), plus
    ``Retry-After`` when the decision is a refusal and ``X-RateLimit-Shadow`` for a shadow
    limiter's; with ``legacy=True`` also ``X-RateLimit-Limit``, ``-Remaining`` and
    ``-Reset``. The policy is named ``policy_name``, else the limiter's ``name``, else
    ``"default"``. The same fields, formatted in the same place, as the web faces send::

        decision = await limiter.hit(client)
        for name, value in arl.ratelimit_headers(decision, limiter):
            response.headers[name] = value
    """
    if not isinstance(decision, Decision):
        raise TypeError(f"decision must be a Decision, not {type(decision).__name__}")
    check_limiter(limiter)
    if policy_name is not None:
        QuotaPolicy.check_name(policy_name)
    if not isinstance(legacy, bool):
        raise TypeError(f"legacy must be a bool, not {type(legacy).__name__}")
    name = choose_policy_name(policy_name, limiter, "default")
    policy = _POLICIES.get((limiter, name))
    if policy is None:
        if len(_POLICIES) >= _POLICY_CACHE:
            _POLICIES.clear()
        policy = _POLICIES[limiter, name] = QuotaPolicy(limiter, name)
    return policy.pairs(decision, legacy)
