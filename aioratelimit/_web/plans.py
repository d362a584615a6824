"""Which limiter, cost and policy a request is counted under.

A rate-limit face takes a limiter, or a ``LimiterFunc``: a callable given the request's
scope (sync or async) that picks the limiter, and the cost if it likes, per request. That
is how tiers are written ("free" 10 a minute, "pro" 1000) without one middleware per tier.
``Plan`` holds either and answers each request with a ``Pick``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from .._args import check_int
from .._limits.limiter import Limiter
from .._limits.lists import AccessList, check_lists
from .clients import ClientFunc
from .headers import QuotaPolicy, check_limiter, choose_policy_name
from .metering import CostFunc, check_cost_func
from .types import Scope

#: What a ``LimiterFunc`` answers: a limiter (counted at the plan's cost), a limiter and
#: the cost of this request, or ``None``: this request is not limited.
Choice = Limiter | tuple[Limiter, int] | None
#: Picks the limiter (and the cost) for a request from its ASGI scope; sync or async.
LimiterFunc = Callable[[Scope], Choice | Awaitable[Choice]]

#: Policies remembered for limiters a ``LimiterFunc`` picked (emptied when full: a
#: function that built a new limiter per request must not grow this without bound).
POLICY_CACHE = 256


class Pick:
    """One request's limiter, cost, client function and policy (and ``cost_from``: the
    cost is an estimate, settled by the response)."""

    __slots__ = ("client", "cost", "cost_from", "limiter", "policy")

    def __init__(
        self,
        limiter: Limiter,
        cost: int,
        client: ClientFunc,
        policy: QuotaPolicy,
        cost_from: CostFunc | None = None,
    ) -> None:
        self.limiter, self.cost, self.client, self.policy = limiter, cost, client, policy
        self.cost_from = cost_from


class Plan:
    """A limiter or a ``LimiterFunc``, with the client function, cost and policy name that
    go with it.

    The policy is named ``name`` if given, else the limiter's own ``name``, else
    ``default_name``. With ``cost_from`` the cost is an estimate, settled by the response
    (``metering``). ``lists``: the access list its clients are looked up on first.
    """

    __slots__ = (
        "_cost",
        "_fixed",
        "_func",
        "_policies",
        "client",
        "cost_from",
        "default_name",
        "lists",
        "name",
    )

    def __init__(
        self,
        limiter: Limiter | LimiterFunc,
        client: ClientFunc,
        cost: int,
        name: str | None,
        default_name: str,
        cost_from: CostFunc | None = None,
        *,
        lists: AccessList | None = None,
    ) -> None:
        self.cost_from = check_cost_func(cost_from)
        self.lists = check_lists(lists)
        if name is not None:
            QuotaPolicy.check_name(name)
        QuotaPolicy.check_name(default_name)
        self.client, self.name, self.default_name = client, name, default_name
        self._policies: dict[Limiter, QuotaPolicy] = {}
        self._fixed: Pick | None = None
        self._func: LimiterFunc | None = None
        if isinstance(limiter, Limiter):
            fixed = check_limiter(limiter)
            self._fixed = Pick(
                fixed, fixed._check_cost(cost), client, self._policy(fixed), self.cost_from
            )
        elif callable(limiter):
            self._func = limiter
        else:
            raise TypeError(
                "limiter must be a FixedWindow, SlidingWindow or TokenBucket, or a function"
                f" of the scope that picks one, not {type(limiter).__name__}"
            )
        self._cost = cost if self._fixed is not None else check_int(cost, "cost")

    @property
    def limiter(self) -> Limiter | LimiterFunc:
        return self._fixed.limiter if self._fixed is not None else self._func  # type: ignore[return-value]

    def _policy(self, limiter: Limiter) -> QuotaPolicy:
        policy = self._policies.get(limiter)
        if policy is None:
            if len(self._policies) >= POLICY_CACHE:
                self._policies.clear()
            policy = QuotaPolicy(limiter, choose_policy_name(self.name, limiter, self.default_name))
            self._policies[limiter] = policy
        return policy

    async def pick(self, scope: Scope) -> Pick | None:
        """This request's pick, or ``None`` when the ``LimiterFunc`` leaves it unlimited."""
        if self._fixed is not None:
            return self._fixed
        assert self._func is not None
        choice = self._func(scope)
        if inspect.isawaitable(choice):
            choice = await choice
        if choice is None:
            return None
        if isinstance(choice, tuple) and len(choice) == 2:
            limiter, cost = choice
        else:
            limiter, cost = choice, self._cost
        if not isinstance(limiter, Limiter):
            raise TypeError(
                "the limiter function must return a limiter, (limiter, cost) or None,"
                f" not {choice!r}"
            )
        # A cost above this limiter's limit is a bug in the function: ValueError, no hit.
        return Pick(
            limiter, limiter._check_cost(cost), self.client, self._policy(limiter), self.cost_from
        )

    def __repr__(self) -> str:
        return repr(self.limiter)
