"""What a limiter with ``policies=`` sends and answers: a key's resolved ``View``, the
decoding of a reply made under it, and ``Direct``, the guard of a limiter with policies and
no other option (``policies`` resolves the views).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .. import _observe
from .._args import MAX_COUNT, check_count, check_key
from .._backend import Backend
from .._rates import Decision
from .._scripts import Script
from .._stores.subscription import Subscription
from .guard import Guard
from .policy import Policy


class View:
    """One key's resolved policy, ready to send: the script's KEYS, the preamble's ARGV,
    the rates' arguments, and until when it is trusted (``clock``)."""

    __slots__ = (
        "asked",
        "backend",
        "consts",
        "expires",
        "head",
        "keys",
        "name",
        "policy",
        "refund",
        "stale",
        "version",
    )

    def __init__(
        self,
        backend: Backend,
        name: str,
        policy: Policy,
        version: int,
        keys: list[str],
        consts: tuple[int, ...],
        refund: tuple[int, ...],
        kind: str,
        expires: float,
        stale: bool,
    ) -> None:
        self.name, self.policy, self.keys, self.consts, self.refund = (
            name,
            policy,
            keys,
            consts,
            refund,
        )
        # ``lua/policy_stamp.lua``'s ARGV: the stamp this call makes, and how to convert
        self.head = (f"{version}|{','.join(map(str, consts))}", f"{kind}|{policy.rule}")
        self.version = version
        self.backend, self.expires, self.stale = backend, expires, stale
        #: the name the key's override or the lookup gave, known or not
        self.asked: str | None = None


#: A limiter script's reply, with the view it was made under.
PolicyReply = tuple[list[Any], View]

_set = object.__setattr__


def decode(reply: PolicyReply | list[Any]) -> Decision:
    """``Decision.from_reply``, naming the policy (and whether it was the last known); a
    fallback limiter's reply (``on_unavailable=Fallback``, a plain list) names none."""
    if not isinstance(reply, tuple):
        return Decision.from_reply(reply)
    return decide(*reply)


def decide(raw: list[Any], view: View) -> Decision:
    """The ``Decision`` of a reply made under ``view``."""
    d = Decision.from_reply(raw)
    _set(d, "policy", view.name)
    if view.stale:
        _set(d, "policy_stale", True)
    return d


class Inbox(Subscription):
    """The store's channel: each message is handled as it is delivered (several may be
    delivered before a waiter runs; none may be merged)."""

    __slots__ = ("handle",)
    handle: Callable[[bytes], None]

    def _wake(self, payload: bytes) -> None:
        self.handle(payload)
        super()._wake(payload)


class Direct(Guard[Any]):
    """The guard of a limiter with policies and no other option: a decision is the view's
    one script call, without ``Guard``'s bookkeeping (a deny cache, a breaker, shadow mode
    and a fallback take the full ``Guard``); reported through it while a recorder is on."""

    __slots__ = ("policies", "script")
    policies: Any  # (``policies.Policies``, which imports this module)
    script: Script

    def cached(self, key: str, cost: int, mode: int) -> Decision | None:
        return None

    def decide(self, key: str, cost: int, mode: int) -> Awaitable[Decision]:
        if _observe.recorder is not None:
            return super().decide(key, cost, mode)
        return self._direct(key, cost, mode)

    async def _direct(self, key: str, cost: int, mode: int) -> Decision:
        if type(key) is not str or not key:
            check_key(key)
        if type(cost) is not int or not 0 < cost <= MAX_COUNT:
            check_count(cost, "cost")
        view = self.policies._ready(key)
        if view is not None:  # the usual call: one frame, the view's one script call
            args = (*view.head, cost, mode, *view.consts)
            reply = await view.backend._run(self.script, view.keys, args)
            if reply[0] != -1:
                return decide(reply, view)
        # (A refused call wrote nothing: ``send`` reads the store and calls again.)
        return decode(await self.policies._send(self.script, key, cost, mode))
