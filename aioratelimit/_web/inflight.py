"""In-flight (concurrency) limits for HTTP: "100 requests a minute, and 2 at once".

A ``Rule`` with ``in_flight=n`` gives each client key ``n`` slots. A request takes one,
together with its rate's hit, in ONE script call (``lua/inflight_acquire.lua``): the slot is
taken only if every rate admits the hit, and the hit is counted only if a slot is free. The
slot is a semaphore slot (``_locks``'s holders and fences, under the client key's hash tag,
the tag of the rate's counters too), held by a ``Lease`` for the whole request: renewed
while a long or streaming response runs, given back when the response ends, when the client
goes away (``http.disconnect``, a failing ``send``) or when the request's task is cancelled.

A lost acquire reply is never sent again (the hit may have been counted): the token is
released instead (its tombstone bars a late copy of the acquire), as a semaphore does.

A slot frees when a request ends, which no server clock can foretell: a refusal for a full
set of slots says ``Retry-After: 1`` (``INFLIGHT_RETRY_AFTER``, the shortest the field can
say). The soonest holder's TTL would only bound a crashed holder, and renewals push it on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .. import _keys, _scripts
from .._aio import finish, finish_within
from .._args import check_int, check_seconds, to_ms
from .._backend import Backend, get_backend
from .._errors import AioRateLimitError, LockNotOwned
from .._limits.algorithms import FixedWindow, _CalendarWindow
from .._limits.failure import Fallback
from .._locks.lease import RENEW_EVERY, RENEW_RETRY, Lease, Names
from .._locks.lock import _never_sent
from .._rates import Decision, new_decision
from .answers import PROBLEM_JSON
from .clients import ClientFunc, resolve
from .flow import Verdict, placed
from .headers import QuotaPolicy, choose_policy_name, seconds_header, sf_string
from .types import Message, Receive, Scope, Send

log = logging.getLogger("aioratelimit")

#: ``Retry-After`` (seconds) of a refusal for a full set of in-flight slots (see above).
INFLIGHT_RETRY_AFTER = 1
#: The quota unit of an in-flight policy item (draft-ietf-httpapi-ratelimit-headers-11).
CONCURRENT_REQUESTS = "concurrent-requests"

_ADMITTED, _FULL, _RATE_DENIED = 1, 0, -1


def check_in_flight_limiter(limiter: object) -> FixedWindow | None:
    """The rate an in-flight rule decides with its slot: none, or a plain ``FixedWindow``
    (its keys and arguments are what the combined script reads; its own options would
    each be a call of their own, which the one decision cannot make)."""
    if limiter is None:
        return None
    if not isinstance(limiter, FixedWindow) or isinstance(limiter, _CalendarWindow):
        raise ValueError(
            "a rule with in_flight= takes a FixedWindow of plain rates (or no limiter),"
            f" not {limiter!r}"
        )
    if limiter._guard is not None or limiter._blockable or limiter.count_denied:
        raise ValueError(
            "a rule with in_flight= takes a FixedWindow without deny_cache, on_unavailable,"
            " breaker, shadow, pause, blockable or count_denied: the slot and the rate are"
            " decided in one script call"
        )
    return limiter


def check_in_flight_options(
    in_flight: bool, on_unavailable: object, breaker: object, shadow: object
) -> None:
    """A middleware's options, where a rule has ``in_flight=``: ``on_unavailable`` is
    ``"deny"`` or ``"allow"`` (a ``Fallback``'s in-process twin would hold no slot), no
    ``breaker`` nor ``shadow`` (each would split the one decision)."""
    if not in_flight:
        return
    if isinstance(on_unavailable, Fallback) or breaker is not None or shadow is True:
        raise ValueError(
            "a rule with in_flight= works with on_unavailable='deny' or 'allow', without"
            " a Fallback, a breaker or shadow=True"
        )


class InFlightPlan:
    """One rule's in-flight limit: ``slots`` per client key, each held ``ttl`` seconds
    unless renewed, with the rule's rate (``limiter``, optional) decided in the same call.

    Its policy items: the rate's (``QuotaPolicy``), then ``"<name>-in-flight"`` (or
    ``"<name>"`` alone) with ``qu="concurrent-requests"`` and no window.
    """

    __slots__ = (
        "_backend",
        "_cache",
        "_item",
        "_policy_header",
        "client",
        "cost",
        "limiter",
        "name",
        "place",
        "rate_policy",
        "slots",
        "ttl",
    )

    def __init__(
        self,
        slots: object,
        ttl: object,
        limiter: object,
        client: ClientFunc,
        cost: int,
        name: str | None,
        default_name: str,
        place: str | None,
        backend: Backend | None,
    ) -> None:
        self.slots = check_int(slots, "in_flight")
        self.ttl = check_seconds(ttl, "in_flight_ttl")
        self.limiter = check_in_flight_limiter(limiter)
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        if self.limiter is not None:
            if backend is not None and self.limiter._backend not in (None, backend):
                raise ValueError("an in-flight rule's backend must be its limiter's")
            backend = backend or self.limiter._backend
            self.cost = self.limiter._check_cost(cost)
        else:
            self.cost = check_int(cost, "cost")
        self._backend = backend
        self.client, self.place = client, place
        if name is not None:
            QuotaPolicy.check_name(name)
        if self.limiter is not None:
            self.name = choose_policy_name(name, self.limiter, default_name)
        else:
            self.name = QuotaPolicy.check_name(name or default_name)
        self.rate_policy = None if self.limiter is None else QuotaPolicy(self.limiter, self.name)
        self._item = sf_string(self.name if self.limiter is None else f"{self.name}-in-flight")
        own = f'{self._item};q={self.slots};qu="{CONCURRENT_REQUESTS}"'
        rates = "" if self.rate_policy is None else self.rate_policy.policy_header + ", "
        self._policy_header = rates + own
        self._cache: tuple[Backend, str] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every policy item's name (what a 503's ``violated-policies`` lists)."""
        rates = () if self.rate_policy is None else self.rate_policy.names
        return (*rates, self._item[1:-1])

    def _head(self, backend: Backend) -> str:
        cache = self._cache
        if cache is None or cache[0] is not backend:
            # One namespace per rule (its place) or per named limiter.
            where = self.limiter.name if self.limiter and self.limiter.name else self.place
            cache = self._cache = (backend, backend._head(_keys.INFLIGHT_KIND, where or "default"))
        return cache[1]

    def _names(self, backend: Backend, key: str) -> Names:
        holders, fences, channel = _keys.in_flight(self._head(backend), key)
        keys = [holders, fences]
        if self.limiter is not None:
            keys += self.limiter._keys(backend, key)
        return Names(
            "in-flight",
            key,
            keys,
            [holders, fences],
            channel,
            backend._publish_command,
            _scripts.SEMAPHORE_RELEASE,
            _scripts.SEMAPHORE_EXTEND,
        )

    async def holders(self, client: str) -> int:
        """How many requests of ``client`` (as the client function names it) hold a slot
        now. Reads only."""
        backend = self._backend or get_backend()
        zset = self._names(backend, self.key_of(client)).owner_keys[:1]
        return int(await backend._run(_scripts.SEMAPHORE_HOLDERS, zset, ()))

    def key_of(self, client: str) -> str:
        """The key ``client`` counts under (its slots' and its rate's hash tag)."""
        if self.place is not None and (self.limiter is None or self.limiter.name is None):
            return placed(self.place, client)
        return client

    async def enter(self, scope: Scope) -> tuple[Verdict | None, Lease | None]:
        """Take a slot (and the rate's hit) for this request: the verdict (None: not
        limited) and, when admitted, the lease holding the slot."""
        client = await resolve(self.client, scope)
        if client is None:
            return None, None
        key = self.key_of(client)
        backend = self._backend or get_backend()
        names = self._names(backend, key)
        token = _keys.new_token()
        args: tuple[int | str, ...] = (token, to_ms(self.ttl), self.slots, self.cost)
        if self.limiter is not None:
            args += self.limiter._args
        sent = asyncio.get_running_loop().time()
        try:
            reply = await backend._run(_scripts.INFLIGHT_ACQUIRE, names.acquire_keys, args)
        except BaseException as exc:
            if not _never_sent(exc):
                # It may have run with only its reply lost: never sent again (the hit
                # would count twice); the token is released, which also bars a late copy.
                await finish_within(
                    _release_token(backend, names, token, self.ttl), backend.timeout
                )
            raise
        # (free is below 0 where callers with more slots hold more: none is free here)
        code, fence, free = int(reply[0]), int(reply[1]), max(int(reply[2]), 0)
        decision = Decision.from_reply(reply[3:10]) if self.limiter is not None else None
        if code == _ADMITTED:
            lease = Lease._create(backend, names, token, fence, self.ttl, sent)
            return Verdict(200, self._fields(decision, free), decision), lease
        if code == _RATE_DENIED:
            assert decision is not None
            assert self.rate_policy is not None
            fields = self._fields(decision, free)
            violated = (self.rate_policy.violated(decision),)
            detail = f"rate limit exceeded; try again in {seconds_header(decision.retry_after)} s"
            return Verdict(429, fields, decision, detail, self.name, violated), None
        # Every slot is held (or the token was seen already, which a fresh one never is).
        wait = float(INFLIGHT_RETRY_AFTER)
        full = new_decision(False, self.slots, 0, wait, wait, "redis")
        fields = self._fields(decision, 0, refused=True)
        detail = f"too many requests in flight; try again in {INFLIGHT_RETRY_AFTER} s"
        return Verdict(429, fields, full, detail, self.name, (self._item[1:-1],)), None

    def _fields(
        self, decision: Decision | None, free: int, *, refused: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """``RateLimit-Policy`` (every item), ``RateLimit`` (the rate's binding item, then
        the slots left) and, on a refusal, ``Retry-After``."""
        own = f"{self._item};r={free}"
        if decision is None or self.rate_policy is None:
            pairs = [("RateLimit", own)]
        else:
            pairs = self.rate_policy.pairs(decision)
            pairs = [(k, f"{v}, {own}" if k == "RateLimit" else v) for k, v in pairs]
            pairs = [p for p in pairs if p[0] != "RateLimit-Policy"]
        if refused:
            pairs.append(("Retry-After", str(INFLIGHT_RETRY_AFTER)))
        pairs.insert(0, ("RateLimit-Policy", self._policy_header))
        return [(k.lower().encode(), v.encode("ascii")) for k, v in pairs]

    def __repr__(self) -> str:
        return f"<InFlightPlan {self._policy_header} ttl={self.ttl}>"


async def _release_token(backend: Backend, names: Names, token: str, ttl: float) -> None:
    try:
        await backend._run_repeatable(
            names.release, names.owner_keys, names.release_args(token, ttl)
        )
    except AioRateLimitError as exc:
        log.debug("aioratelimit: release of in-flight slot %r: %r", names.name, exc)


class Slot:
    """The slot one request holds, from admission to the end of its response: renewed in
    the background every ttl/3, released once, whichever comes first of the response's
    end, the client's disconnect, a failing ``send`` and a cancellation."""

    __slots__ = ("_done", "_lease", "_renewal")

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._done = False
        self._renewal: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """Extend the lease every ttl/3 (sooner after a failure). A lost slot is let go:
        the response it admitted runs on (the limit admitted it; cutting it off would
        fail a client for the store's outage), it simply holds nothing any more."""
        lease = self._lease
        wait = lease.ttl / RENEW_EVERY
        while True:
            await asyncio.sleep(wait)
            try:
                await lease.extend()
            except LockNotOwned:
                log.debug("aioratelimit: in-flight slot %r was lost", lease.name)
                return
            except AioRateLimitError as exc:
                log.debug("aioratelimit: renewal of in-flight slot %r: %r", lease.name, exc)
                wait = min(lease.ttl / 10, RENEW_RETRY)
            else:
                wait = lease.ttl / RENEW_EVERY

    async def release(self) -> None:
        """Give the slot back (once; later calls do nothing), to the end even if the
        caller is cancelled meanwhile."""
        if self._done:
            return
        self._done = True
        self._renewal.cancel()
        await finish(self._give_back())

    async def _give_back(self) -> None:
        try:
            await self._lease.release()
        except (LockNotOwned, AioRateLimitError) as exc:  # expired, or the store is away
            log.debug("aioratelimit: release of in-flight slot %r: %r", self._lease.name, exc)

    def receive(self, receive: Receive) -> Receive:
        """``receive`` that gives the slot back as soon as the client has gone."""

        async def receiver() -> Message:
            message = await receive()
            if message["type"] in ("http.disconnect", "websocket.disconnect"):
                await self.release()
            return message

        return receiver

    def send(self, send: Send, extra: Callable[[Message], Message] | None = None) -> Send:
        """``send`` that gives the slot back once the response has ended, or when sending
        fails (the client has gone)."""

        async def sender(message: Message) -> None:
            if extra is not None:
                message = extra(message)
            try:
                await send(message)
            except BaseException:
                await self.release()
                raise
            kind = message["type"]
            if (kind == "http.response.body" and not message.get("more_body", False)) or (
                kind == "websocket.close"
            ):
                await self.release()

        return sender


#: The close code of a refused WebSocket handshake where the server cannot answer it with
#: an HTTP response: 1013, "Try Again Later" (RFC 6455's registry).
WEBSOCKET_TRY_AGAIN_LATER = 1013


async def refuse_websocket(verdict: Verdict, scope: Scope, send: Send) -> None:
    """Refuse a WebSocket handshake: with the server's ``websocket.http.response``
    extension, the same 429 or 503 problem document an HTTP request gets; else a close
    before the accept (which the server turns into a 403) with code 1013."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = verdict.problem()
        headers = [
            (b"content-type", PROBLEM_JSON),
            (b"content-length", str(len(body)).encode()),
            *verdict.fields,
        ]
        await send(
            {"type": "websocket.http.response.start", "status": verdict.status, "headers": headers}
        )
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
        return
    await send({"type": "websocket.close", "code": WEBSOCKET_TRY_AGAIN_LATER})
