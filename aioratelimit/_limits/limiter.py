"""``Limiter``, the common base of ``FixedWindow``, ``SlidingWindow`` and ``TokenBucket``,
and ``Admission``, its ``async with``.

Each decision is one script run (``lua/fixed_window.lua``, ``lua/sliding_window.lua``,
``lua/token_bucket.lua``, or with ``ban=`` their ban variants) over one key per (user key,
rate), the key's block (``blockable=True``) and strike record (``ban=``), all under the
user key's hash tag. The three limiters share everything but the scripts and their
arguments: validation, key building, the reply-to-``Decision`` decoding, blocks, bans and
refunds (``bans``), the context manager and the decorator. The deny cache, the failure
policy and shadow mode are a ``Guard`` around the script call.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .. import _keys, _observe, _scripts
from .._args import MAX_COUNT, check_count, check_int, check_key, check_timeout
from .._backend import Backend, get_backend
from .._errors import RateLimited
from .._rates import Decision, Rate
from .._scripts import Mode, Script
from . import waiting as _waiting
from .admission import Admission, limit_calls
from .bans import Ban, Penalties, check_ban, spec
from .calendar import Quota
from .deny_cache import DenyCache
from .failure import Breaker, Fallback, OnUnavailable
from .guard import Guard, Options, check_cost
from .pause import Pause, as_pause
from .policies import Policies
from .policy import MAX_RATES, Policy
from .policy_views import Direct
from .policy_views import decode as policy_decode
from .reservation import Reservation

P = ParamSpec("P")
R = TypeVar("R")

#: Script modes as plain ints (what the wire packs fastest).
_PEEK, _PARTIAL = int(Mode.PEEK), int(Mode.PARTIAL)


class Limiter(Penalties):
    """The common base of ``FixedWindow``, ``SlidingWindow`` and ``TokenBucket``: annotate
    with it where any of the three will do (``hit``, ``peek``, ``reset``, ``acquire``,
    ``async with limiter(key)`` and ``@limiter.limit`` are the same on all three).

    Not instantiated itself; a subclass names its script, kind and arguments.
    """

    __slots__ = (
        "_args",
        "_backend",
        "_ban",
        "_ban_args",
        "_blockable",
        "_decider",
        "_default_policy",
        "_fallback",
        "_guard",
        "_hash_tag",
        "_head_id",
        "_hit_mode",
        "_max_cost",
        "_policies",
        "_refund_args",
        "_suffixes",
        "count_denied",
        "name",
        "on_unavailable",
        "shadow",
    )

    _script: Script
    _refund_script: Script
    #: its script with ``lua/policy_stamp.lua`` in front (``policies=``)
    _policy_script: Script
    _kind: str
    #: its script books a later slot for a waiter (``waiting``): TokenBucket
    _reserves = False

    def __init__(
        self,
        backend: Backend | None,
        name: str | None,
        count_denied: bool = False,
        blockable: bool = False,
        hash_tag: Callable[[str], str] | None = None,
        ban: Ban | None = None,
    ) -> None:
        if type(self) is Limiter:
            raise TypeError("Limiter is a base: use FixedWindow, SlidingWindow or TokenBucket")
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        if name is not None:
            check_key(name, "name")
        if not isinstance(count_denied, bool):
            raise TypeError(f"count_denied must be a bool, not {type(count_denied).__name__}")
        if not isinstance(blockable, bool):
            raise TypeError(f"blockable must be a bool, not {type(blockable).__name__}")
        if hash_tag is not None and not callable(hash_tag):
            raise TypeError(
                f"hash_tag must be a function of the key (e.g. lambda key: key.split('/')[0]),"
                f" not {type(hash_tag).__name__}"
            )
        #: key -> the Redis Cluster hash tag of all of the key's Redis keys (None: the key
        #: itself): keys with one tag share a slot, and so one multi-key decision
        self._hash_tag = hash_tag
        # Its hits read the key's block (one more key and GET per hit: opt-in, and a
        # one-rate hit stays a one-key script, served during a cluster slot migration).
        self._blockable = blockable or ban is not None
        #: ``ban=``: the script's ban variant, the key's strike record as a last KEY and the
        #: ban's ``spec`` as a last ARGV (``bans``)
        self._ban = check_ban(ban)
        self._decider = self._script if ban is None else _scripts.banned(self._script)
        self._ban_args: tuple[str, ...] = () if ban is None else (spec(ban),)
        self._backend = backend
        self.name = name
        #: a denied hit counts too (brute-force protection: hammering keeps the key denied)
        self.count_denied = count_denied
        self._hit_mode = int(Mode.HIT_COUNT_DENIED if count_denied else Mode.HIT)
        self._head_id = (self._kind, name)  # its key in Backend._heads
        # Set by subclasses: per-key suffixes, the script's constant arguments, and the
        # largest cost that could ever be admitted.
        self._suffixes: tuple[str, ...] = ()
        self._args: tuple[int | str, ...] = ()  # (str: a calendar quota's bounds)
        self._refund_args: tuple[int | str, ...] = ()  # the refund script's, after the cost
        self._max_cost = 0
        # Set by ``_options`` (a subclass calls it once its rates are known).
        self._guard: Guard[Any] | None = None  # None: no option on, one script call
        self._fallback: Limiter | None = None
        self.on_unavailable: OnUnavailable = "raise"
        self.shadow = False
        self._policies: Policies | None = None
        self._default_policy: Policy | None = None

    def _policy_args(self, policy: Policy) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The script's and the refund script's rate arguments under ``policy``
        (``ValueError`` when this limiter cannot apply it)."""
        raise NotImplementedError

    def _options(
        self,
        rates: tuple[Rate | Quota, ...],
        deny_cache: int | None,
        on_unavailable: OnUnavailable,
        breaker: Breaker | None,
        shadow: bool,
        pause: Pause | str | None = None,
        policies: Policies | None = None,
    ) -> None:
        """The options on top of the plain decision (the guard); with all of them off a
        decision stays the one script call it was. With ``policies`` the rates come from
        data: the keys are per rate *position* with a stamp (``lua/policy_stamp.lua``)."""
        if self._ban is not None and (deny_cache is not None or policies is not None):
            # A denial cached here never reaches the script that counts its strike.
            raise ValueError("ban= cannot be combined with deny_cache= or policies= (not yet)")
        honoured = as_pause(pause)
        if isinstance(pause, str) and honoured is not None:  # a name: on this limiter's backend
            honoured = Pause(pause, backend=self._backend)
        send: Any = self._send
        decode: Callable[[Any], Decision] = Decision.from_reply
        if policies is not None:
            if not isinstance(policies, Policies):
                raise TypeError(f"policies must be a Policies, not {type(policies).__name__}")
            if self._hash_tag is not None:
                raise ValueError("policies= cannot be combined with hash_tag= (not yet)")
            plain = tuple(r for r in rates if isinstance(r, Rate))
            if len(plain) != len(rates):
                raise TypeError("policies= takes a limiter of rates, not of calendar quotas")
            self._default_policy = Policy(*plain)
            policies._bind(self)
            self._policies = policies
            self._suffixes = _keys.policy_suffixes(MAX_RATES)
            self._max_cost = MAX_COUNT  # the key's policy's limit denies what it cannot admit
            send = functools.partial(policies._send, self._policy_script)
            decode = policy_decode
        if deny_cache is not None and self.count_denied:
            # A cached denial never reaches the server, where a denied hit must be counted.
            raise ValueError("deny_cache cannot be combined with count_denied=True")
        cache = None
        if deny_cache is not None:
            size = check_int(deny_cache, "deny_cache")
            # A key stays subscribed for a window after its last denial ran out.
            cache = DenyCache(size, max(r.window for r in rates))
        options = Options(on_unavailable, breaker, shadow, name=self.name or self._kind)
        self.on_unavailable, self.shadow = options.on_unavailable, options.shadow
        if options.breaker is not None:
            options.breaker.on_change(_observe.breaker_listener)
        fallback = None
        if isinstance(self.on_unavailable, Fallback):
            # Its own memory:// store: counted in this process only, never sent anywhere.
            self._fallback = self._scaled(self.on_unavailable, Backend.from_url("memory://"))
            fallback = self._fallback._send
        if self._ban is not None:  # (a guard reports the bans it decodes)
            decode = functools.partial(_observe.banned, self.name, self._script.name)
        if cache is None and options.plain and honoured is None and policies is None:
            return
        direct = policies is not None and cache is None and options.plain and fallback is None
        self._guard = (Direct if direct else Guard)(
            send,
            decode,
            options,
            limit=self._max_cost,
            fallback=fallback,
            cache=cache,
            backend=self._backend,
            head=(self._kind, self.name),
            observed=(self.name, self._script.name),
            pause=honoured,
            tag=self._tag,
        )
        if isinstance(self._guard, Direct) and policies is not None:
            self._guard.policies, self._guard.script = policies, self._policy_script

    def _scaled(self, share: Fallback, backend: Backend) -> Limiter:
        """The same limiter with every limit scaled to ``share``, on ``backend``."""
        raise NotImplementedError

    def _shown(self) -> str:
        """Its options in its repr, with their live state (nothing when all are off)."""
        tag = self._hash_tag
        shown = "" if tag is None else f" hash_tag={getattr(tag, '__qualname__', tag)}"
        if self._ban is not None:
            shown += f" ban={self._ban!r}"
        if self._guard is not None:
            shown += self._guard.shown()
        return shown if self._policies is None else f"{shown} policies={self._policies!r}"

    @property
    def breaker(self) -> Breaker | None:
        """The circuit breaker in front of the backend (None: every call goes to it)."""
        return None if self._guard is None else self._guard.breaker

    @property
    def backend(self) -> Backend:
        return self._backend or get_backend()

    def _tag(self, key: str) -> str | None:
        """The hash tag ``hash_tag`` names for ``key`` (None: no ``hash_tag``), checked:
        a non-empty str, or ``TypeError``/``ValueError`` before any I/O."""
        if self._hash_tag is None:
            return None
        tag = self._hash_tag(key)
        if type(tag) is not str or not tag:
            check_key(tag, "hash_tag(key)")
        return tag

    def _keys(self, backend: Backend, key: str) -> list[str]:
        """The key's counter per rate, then (``blockable``) its block."""
        head = backend._heads.get(self._head_id) or backend._head(self._kind, self.name)
        if self._hash_tag is not None:
            return self._tagged_keys(head, key)
        suffixes = self._suffixes
        if len(suffixes) == 1:  # one rate, the common case: no comprehension frame
            keys = [_keys.tagged(head, key, suffixes[0])]
        else:
            keys = [_keys.tagged(head, key, suffix) for suffix in suffixes]
        if self._blockable:
            keys.append(_keys.block(head, key))
            if self._ban is not None:
                keys.append(_keys.strikes(head, key))
        return keys

    def _tagged_keys(self, head: str, key: str) -> list[str]:
        """``_keys`` under the tag ``hash_tag`` names (``_keys.by_tag``)."""
        tag = self._tag(key)
        assert tag is not None
        keys = [_keys.by_tag(head, tag, key, suffix) for suffix in self._suffixes]
        if self._blockable:
            keys.append(_keys.block(head, key, tag))
            if self._ban is not None:
                keys.append(_keys.strikes(head, key, tag))
        return keys

    def _check_cost(self, cost: object, partial: bool = False) -> int:
        """A cost from 1 to the tightest limit, or to 2**50 for a partial hit (which gets
        what is left)."""
        if partial:
            return check_count(cost, "cost")
        return check_cost(cost, self._max_cost)

    def _send(self, key: str, cost: int, mode: int, *extra: int) -> Awaitable[Any]:
        """Check the arguments and start the script; the caller awaits and decodes the reply.

        A plain function, not a coroutine: a decision pays for one coroutine frame fewer.
        """
        # The usual call (a non-empty str key, an int cost within the limit) passes both
        # checks without the calls; anything else goes through them and raises there.
        if type(key) is not str or not key:
            check_key(key)
        if type(cost) is not int or not 0 < cost <= self._max_cost:
            # A partial hit may ask for more than a limit: it gets what is left.
            cost = self._check_cost(cost, mode >= _PARTIAL)
        backend = self._backend or get_backend()
        args = (cost, mode, *self._args, *extra, *self._ban_args)
        if self._ban is not None:  # (a ban it issues is listed: ``Penalties._banning``)
            return self._banning(backend, key, self._keys(backend, key), args)
        return backend._run(self._decider, self._keys(backend, key), args)

    async def _decide(self, key: str, cost: int, mode: int, *extra: int) -> Decision:
        guard = self._guard
        if guard is not None and not extra:
            return guard.cached(key, cost, mode) or await guard.decide(key, cost, mode)
        # A TokenBucket waiter's booking takes no option but the pause.
        if guard is not None and guard.pause is not None and (paused := await guard.paused()):
            return paused
        if extra and self._policies is not None:  # (a TokenBucket waiter's booking)
            check_key(key)
            return policy_decode(
                await self._policies._send(self._policy_script, key, cost, mode, *extra)
            )
        if _observe.recorder is not None:
            return await _observe.decide(
                self.name, self._script.name, self._send, key, cost, mode, *extra
            )
        return Decision.from_reply(await self._send(key, cost, mode, *extra))

    def _attempt(self, key: str, cost: int, booking_us: int) -> Awaitable[Decision]:
        """A waiter's try: a TokenBucket books a slot up to ``booking_us`` ahead, the
        windows take a plain hit."""
        if self._reserves:
            return self._decide(key, cost, int(Mode.HIT), booking_us)
        return self._decide(key, cost, self._hit_mode)

    async def hit(self, key: str, cost: int = 1, *, partial: bool = False) -> Decision:
        """Count ``cost`` hits for ``key`` if every rate admits them (a denied hit counts
        none, unless the limiter was made with ``count_denied=True``).

        ``partial=True``: admit as much of ``cost`` as the tightest rate allows now (at
        least 1, else denied), atomically; ``Decision.granted`` says how much. ``cost``
        may then be above the limit.
        """
        if partial is False:
            mode = self._hit_mode
        elif partial is True:
            mode = self._hit_mode + _PARTIAL
        else:
            raise TypeError(f"partial must be a bool, not {type(partial).__name__}")
        guard = self._guard
        if guard is not None:
            return guard.cached(key, cost, mode) or await guard.decide(key, cost, mode)
        # Instrumentation off costs this one test (benchmarks/bench_observability.py).
        if _observe.recorder is not None:
            return await _observe.decide(self.name, self._script.name, self._send, key, cost, mode)
        return Decision.from_reply(await self._send(key, cost, mode))

    async def peek(self, key: str, cost: int = 1, *, partial: bool = False) -> Decision:
        """What ``hit`` would answer now; changes nothing."""
        if partial is not True and partial is not False:
            raise TypeError(f"partial must be a bool, not {type(partial).__name__}")
        mode = _PEEK + _PARTIAL if partial else _PEEK
        guard = self._guard
        if guard is not None:
            return guard.cached(key, cost, mode) or await guard.decide(key, cost, mode)
        return Decision.from_reply(await self._send(key, cost, mode))

    async def reset(self, key: str) -> None:
        """Forget every hit counted for ``key`` (under every rate of this limiter), lift its
        block, and tell every process's deny cache (one script; a blockable limiter takes
        the key off its ban index with a second)."""
        check_key(key)
        await self._invalidate(key, reset=True)
        await self._unlisted(key)
        if self._fallback is not None:
            await self._fallback.reset(key)

    async def refund(self, key: str, cost: int = 1) -> int:
        """Give back ``cost`` hits that an admitted hit counted for ``key``, under every rate
        (one script): never below zero, and only to windows still open (a TokenBucket's
        TAT moves back, never before the clock). Answers the most given back under any
        one rate. A cost above what one hit could count raises ``ValueError``."""
        check_key(key)
        cost = self._check_cost(cost)
        backend = self._backend or get_backend()
        rate_keys = self._keys(backend, key)[: len(self._suffixes)]
        refund_args = self._refund_args
        if self._policies is not None:  # the rates the key's counters are under now
            view = await self._policies._current(key)
            rate_keys, refund_args = view.keys[1 : 1 + len(view.policy.rates)], view.refund
        # (at_us 0, record_ms 0: to the windows open now, with no record: see Reservation)
        reply = await backend._run(self._refund_script, rate_keys, (cost, 0, 0, *refund_args))
        await self._invalidate(key)
        return int(reply[0])

    async def _invalidate(self, key: str, *, reset: bool = False) -> None:
        """Forget the local denial of ``key`` at once, then run ``lua/rate_invalidate.lua``,
        which tells every process (with ``reset``, after removing the key's counters)."""
        guard = self._guard
        if guard is not None:
            guard.forget(key)
        backend = self._backend or get_backend()
        channel = _keys.rate_channel(backend._head(self._kind, self.name), key, self._tag(key))
        try:
            await backend._run(
                _scripts.RATE_INVALIDATE,
                self._keys(backend, key),
                (int(reset), channel, backend._publish_command),
            )
        finally:
            if guard is not None:  # a denial sent before the reset, answered after it
                guard.forget(key)

    async def acquire(
        self, key: str, cost: int = 1, *, wait: bool = False, timeout: float | None = None
    ) -> Decision:
        """``hit``, raising ``RateLimited`` when denied; with ``wait=True`` wait until
        admitted, or until ``timeout`` seconds would be exceeded (then ``RateLimited`` at
        once: no sleep that cannot end in time). Waiting costs one or two script calls per
        admitted request (``waiting``): a TokenBucket books its slot, the windows queue
        their waiters per key, first come first served, behind one that retries."""
        check_key(key)
        self._check_cost(cost)
        timeout = check_timeout(timeout)
        if wait:
            backend = self._backend or get_backend()
            line = (id(backend), self._keys(backend, key)[0])
            return await _waiting.wait(self._attempt, self.refund, line, key, cost, timeout)
        decision = await self._decide(key, cost, self._hit_mode)
        if not decision.allowed:
            raise RateLimited(f"rate limited: {key!r}", decision=decision)
        return decision

    def reserve(self, key: str, cost: int = 1) -> Reservation:
        """Admit ``cost``, an estimate, and settle the real cost later:
        ``async with limiter.reserve(key, estimate) as r: ...; r.settle(actual)``, or
        ``r = await limiter.reserve(key, estimate)``. Taking it is one ``hit`` (denied:
        ``RateLimited``); ``settle`` gives back or charges the difference in the
        background, once (``Reservation``). Bad arguments raise here, before any I/O.
        Not on a limiter made with ``policies=`` (``TypeError``): a settlement names the
        code's rates and keys, where such a limiter counts under its keys' policies."""
        if self._policies is not None:
            raise TypeError(f"{self!r} has policies=: reserve() takes a limiter without them")
        check_key(key)
        return Reservation._create(self, key, self._check_cost(cost))

    def __call__(
        self, key: str, cost: int = 1, wait: bool = False, timeout: float | None = None
    ) -> Admission:
        """``async with limiter(key) as decision:`` runs the block only when admitted."""
        return Admission(self.acquire, key, cost, wait, timeout)

    def limit(
        self,
        key: str | Callable[..., str],
        cost: int = 1,
        wait: bool = False,
        timeout: float | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
        """Decorate an async function so each call first takes a hit for ``key``.

        ``key`` is a string, or a callable given the call's arguments as the function
        receives them (defaults filled in) that returns one. A call the function would
        refuse raises its ``TypeError`` before the hit. The decorated function is a
        coroutine function (``asyncio.create_task(job(1))``); a plain ``def`` is refused
        with ``TypeError`` here, not after its body ran.
        """
        if not (isinstance(key, str) or callable(key)):
            raise TypeError(f"key must be a str or a callable, not {type(key).__name__}")
        if isinstance(key, str):
            check_key(key)
        self._check_cost(cost)
        check_timeout(timeout)
        return limit_calls(self.acquire, key, cost, wait, timeout)
