"""One decision over several keys, all or nothing: ``hit_all``, ``peek_all``,
``acquire_all`` and ``admit_all`` (its ``async with``).

``hit_all([(per_user, "u1"), (per_ip, ip), (per_tenant, "acme")])`` admits the hit only if
every key's limit admits it, and then counts it on every key; denied, it counts on none
(but the keys of a limiter made with ``count_denied=True``). It is ONE run of the
limiters' script (``lua/fixed_window.lua``, ``lua/sliding_window.lua`` or
``lua/token_bucket.lua``, each all-or-nothing over several counters or buckets) with
every key's counters and blocks, so no other decision can come in between: chained
checks (hit one key, then the next, giving back on a denial) admit past a limit under
concurrency, and count a hit that the next key then refuses. The reply names the key that
binds (its 8th element, an index in KEYS), which becomes ``Decision.binding``.

On Redis Cluster the keys of one decision must share a slot, so they must share a hash
tag: each limiter's ``hash_tag=`` names it (the same tag for a key whether it is hit alone
or here). Keys with different tags are refused with ``ValueError`` before any I/O.

The limiters' options, in a multi-key decision:

- deny cache: a cached denial of any of the keys denies at once, with no round trip; a
  denial that the call brings back is remembered by the limiter whose key refused it;
- shadow: all the limiters or none (``ValueError`` otherwise); in shadow mode the decision
  is admitted and says whether the limits would have denied it;
- on_unavailable: the strictest policy among the limiters is served: ``"raise"``, then
  ``"deny"`` (which a ``Fallback`` counts as: its in-process share is per limiter, and
  counting on some of the keys only is what this decision exists to avoid), then
  ``"allow"``. The breakers of all the limiters are consulted and told the outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import Any

from .. import _keys, _observe
from .._args import US, check_count, check_key
from .._backend import Backend, get_backend
from .._errors import BackendError, BackendUnavailable, RateLimited
from .._rates import Binding, Decision, Rate, new_decision
from .._scripts import Mode
from .algorithms import SlidingWindow
from .calendar import Quota
from .deny_cache import clock
from .failure import Breaker, Fallback
from .guard import check_cost
from .limiter import Limiter

_PEEK, _HIT, _COUNT_DENIED, _PARTIAL = int(Mode.PEEK), int(Mode.HIT), 2, int(Mode.PARTIAL)
#: ARGV[2] + 8k: a denied hit is counted on the first k rates only (``decode_mode`` in
#: ``lua/rates_common.lua``)
_COUNTED = 8


class _Shape:
    """What a multi-key decision's limiters fix, checked and built once per list of
    limiters (``_shape``): the order of their KEYS (the rates of the limiters that count
    a denied hit first, then the others', then the blocks), the owner of each KEY (the
    pair's index, and its rate, or None for a block), the rates' ARGV and the mode added
    for count_denied. A decision then only builds its keys."""

    __slots__ = (
        "counting", "limit", "observed", "order", "owners", "rates_args", "risky",
        "same_backend", "script", "shadow", "sliding",
    )  # fmt: skip

    def __init__(self, limiters: tuple[Limiter, ...]) -> None:
        for limiter in limiters:
            if limiter._policies is not None:
                raise TypeError(
                    f"{limiter!r} has policies=, which a multi-key decision does not take:"
                    " decide it with its own hit"
                )
            if limiter._ban is not None:
                # Its strikes are counted per key by its own script, around one key's hit.
                raise TypeError(
                    f"{limiter!r} has ban=, which a multi-key decision does not take:"
                    " decide it with its own hit"
                )
            if any(isinstance(rate, Quota) for rate in getattr(limiter, "rates", ())):
                # Its periods' bounds change with the clock; a plan's arguments are fixed.
                raise TypeError(
                    f"{limiter!r} counts a calendar Quota, which a multi-key decision does"
                    " not take: decide it with its own hit"
                )
        first = limiters[0]
        kind = type(first)
        for limiter in limiters[1:]:
            if type(limiter) is not kind:
                raise TypeError(
                    "the limiters of one multi-key decision must be of one algorithm (their"
                    f" scripts differ): {kind.__name__} and {type(limiter).__name__}; make"
                    f" them all {kind.__name__}, or decide them separately"
                )
        #: a SlidingWindow's buckets: one ARGV for all the rates, so one value for all
        self.sliding: tuple[int, ...] = ()
        if isinstance(first, SlidingWindow):
            for limiter in limiters:
                assert isinstance(limiter, SlidingWindow)
                if limiter.buckets != first.buckets:
                    raise ValueError(
                        "the SlidingWindow limiters of one multi-key decision must cut their"
                        f" windows into as many buckets (one script argument): {first.buckets}"
                        f" and {limiter.buckets}; give them the same buckets="
                    )
            self.sliding = (first.buckets,)
        if len({limiter.shadow for limiter in limiters}) > 1:
            raise ValueError(
                "a multi-key decision admits or denies as one: its limiters must all be in"
                " shadow mode, or none; make them alike, or decide the shadow ones apart"
            )
        self.shadow = first.shadow
        self.script = first._script
        #: the name its decisions are reported under (``_observe``): the limiters', by +
        self.observed = "+".join(limiter.name or limiter._kind for limiter in limiters)
        self.limit = min(limiter._max_cost for limiter in limiters)
        #: every limiter names its backend (the same one), or none does (the default)
        self.same_backend = all(limiter._backend is first._backend for limiter in limiters)
        n = range(len(limiters))
        self.order = [i for i in n if limiters[i].count_denied]
        self.order += [i for i in n if not limiters[i].count_denied]
        owners: list[tuple[int, Rate | None]] = []
        rates_args: list[int] = []
        counted = 0
        for i in self.order:
            limiter = limiters[i]
            nrates = len(limiter._suffixes)
            owners += [(i, rate) for rate in _rates_of(limiter)]
            rates_args += map(
                int, limiter._args[-2 * nrates :]
            )  # (a SlidingWindow's buckets first)
            if limiter.count_denied:
                counted += nrates
        owners += [(i, None) for i in self.order if limiters[i]._blockable]
        self.owners, self.rates_args = owners, tuple(rates_args)
        #: what a hit's mode gains: every rate counting denied hits, mode 2 (_COUNT_DENIED
        #: rather than _HIT: + 1); some, + 8k (count them on the first k rates); none, 0
        self.counting = 0
        if counted:
            everyone = counted == len(rates_args) // 2
            self.counting = _COUNT_DENIED - _HIT if everyone else _COUNTED * counted
        #: two limiters whose keys could be one counter (same kind, name and a rate): a
        #: decision then checks its keys are distinct
        heads = [(lim._head_id, suffix) for lim in limiters for suffix in lim._suffixes]
        self.risky = len(set(heads)) < len(heads)


#: _Shape by list of limiters: an application has a few such lists, made once; bounded
#: all the same (cleared when full), so one made per request costs a rebuild, not memory.
_SHAPES: dict[tuple[Limiter, ...], _Shape] = {}
_MAX_SHAPES = 256


def _shape(limiters: tuple[Limiter, ...]) -> _Shape:
    shape = _SHAPES.get(limiters)
    if shape is None:
        shape = _Shape(limiters)
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()
        _SHAPES[limiters] = shape
    return shape


class _Plan:
    """One multi-key decision's script call, checked and built before any I/O: its KEYS
    and ARGV, and its shape (``_Shape``)."""

    __slots__ = ("args", "backend", "cost", "keys", "limiters", "pairs", "shape")

    def __init__(self, pairs: object, cost: object, mode: int) -> None:
        self.pairs = _check_pairs(pairs)
        self.limiters = limiters = tuple(limiter for limiter, _ in self.pairs)
        self.shape = shape = _shape(limiters)
        first = limiters[0]
        self.backend: Backend = first._backend or get_backend()
        if not shape.same_backend and any(
            (lim._backend or get_backend()) is not self.backend for lim in limiters
        ):
            raise ValueError(
                "the limiters of one multi-key decision must use one backend (one script"
                " call): give them the same backend="
            )
        if type(cost) is not int or not 0 < cost <= shape.limit:
            # (a partial hit may ask for more than a limit: it gets what is left)
            cost = check_count(cost, "cost") if mode >= _PARTIAL else check_cost(cost, shape.limit)
        self.cost: int = cost
        self._build(mode)

    def _build(self, mode: int) -> None:
        backend, pairs, shape = self.backend, self.pairs, self.shape
        keys: list[str] = []
        blocks: list[str] = []
        for i in shape.order:
            limiter, key = pairs[i]
            own = limiter._keys(backend, key)
            nrates = len(limiter._suffixes)
            if len(own) > nrates:
                blocks.append(own[nrates])
                del own[nrates:]
            keys += own
        if shape.risky and len(set(keys)) < len(keys):
            raise ValueError(
                "a multi-key decision names one counter twice (the same limiter and key, or"
                " two limiters of one kind, name and rates): list each (limiter, key) once,"
                " or give the limiters different names"
            )
        keys += blocks
        if backend._publish_command == "SPUBLISH":  # Redis Cluster: one slot per script
            tag = _keys.hash_tag(keys[0])
            if any(_keys.hash_tag(k) != tag for k in keys):
                raise ValueError(
                    "on Redis Cluster the keys of one decision must share a hash tag (one"
                    " slot), and these do not: make each limiter with hash_tag=, a function"
                    " of its key naming the tag they share (e.g. the tenant:"
                    " hash_tag=lambda key: key.split('/')[0])"
                )
        if mode & 3 == _HIT:  # (partial or not; a peek counts nothing)
            mode += shape.counting
        self.keys = keys
        self.args = (self.cost, mode, *shape.sliding, *shape.rates_args)

    def decision(self, reply: Sequence[int]) -> Decision:
        """The reply as a ``Decision`` naming the key and rate that bind."""
        allowed, limit, remaining, reset_us, retry_us, _, granted, at = reply
        index, rate = self.shape.owners[at - 1]
        if rate is None:  # a block denied: the limit is its limiter's tightest
            limit = self.limiters[index]._max_cost
        binding = Binding(index, self.pairs[index][1], rate)
        return new_decision(
            allowed == 1, limit, remaining if remaining > 0 else 0, reset_us / US,
            retry_us / US, "redis", granted=granted, binding=binding,
        )  # fmt: skip


def _rates_of(limiter: Limiter) -> tuple[Rate, ...]:
    rates: tuple[Rate, ...] = getattr(limiter, "rates")  # noqa: B009 (each subclass has them)
    return rates


def _check_pairs(pairs: object) -> list[tuple[Limiter, str]]:
    if not isinstance(pairs, (list, tuple)):
        raise TypeError(
            f"a multi-key decision takes a list of (limiter, key) pairs, not {type(pairs).__name__}"
        )
    if not pairs:
        raise ValueError("a multi-key decision needs at least one (limiter, key) pair")
    checked = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], Limiter):
            raise TypeError(f"each item must be a (limiter, key) pair, not {pair!r}")
        limiter, key = pair
        check_key(key)  # (its tag is checked as its keys are built: ``Limiter._tag``)
        checked.append((limiter, key))
    return checked


def _decide(pairs: object, cost: object, mode: int) -> Awaitable[Decision]:
    """The decision, checked (bad input raises here, before any I/O) and reported to the
    recorder (``_observe``) when there is one, as ONE decision of the limiters' names
    joined by ``+`` (the deny cache's answers included: not as the limiter's own)."""
    plan = _Plan(pairs, cost, mode)
    if _observe.recorder is None:
        return _decided(plan, mode)
    return _observe.guarded(plan.shape.observed, plan.shape.script.name, _decided(plan, mode))


async def _decided(plan: _Plan, mode: int) -> Decision:
    limiters, keys_of = plan.limiters, [key for _, key in plan.pairs]
    guards = [(i, lim._guard) for i, lim in enumerate(limiters) if lim._guard is not None]
    for i, guard in guards:
        cache = guard.cache
        if cache is None or mode >= _PARTIAL or cache.backend is not plan.backend:
            continue  # (a partial hit's denial says nothing of a smaller cost: ``Guard``)
        cached = cache.answer(keys_of[i], plan.cost)
        if cached is not None:
            rate = next((r for r in _rates_of(limiters[i]) if r.limit == cached.limit), None)
            binding = Binding(i, keys_of[i], rate)
            return _shaped(plan, dataclasses.replace(cached, binding=binding))
    # Each breaker once, though its limiter be in several pairs: a half-open breaker lets
    # one probe through, which a second ``allow`` would refuse.
    breakers = list({id(b): b for _, g in guards if (b := g.breaker) is not None}.values())
    allowed = [b for b in breakers if b.allow()]
    if len(allowed) < len(breakers):
        for b in allowed:
            b.abandoned()
        return _shaped(plan, _degraded(plan, None))
    # The deny caches learn on this backend (as ``Guard`` does): a generation each, so a
    # denial that a reset overtook is not kept.
    gens: dict[int, int] = {}
    if mode < _PARTIAL:
        for i, guard in guards:
            if guard.cache is not None:
                if guard.cache.backend is not plan.backend:
                    guard.cache.use(plan.backend)
                gens[i] = guard.cache.gen
    sent = clock()
    try:
        reply = await plan.backend._run(plan.shape.script, plan.keys, plan.args)
    except BackendUnavailable as exc:
        _tell(breakers, Breaker.failed)
        return _shaped(plan, _degraded(plan, exc))
    except BackendError:
        _tell(breakers, Breaker.succeeded)
        raise
    except BaseException:
        _tell(breakers, Breaker.abandoned)
        raise
    _tell(breakers, Breaker.succeeded)
    decision = plan.decision(reply)
    bound = decision.binding
    if not decision.allowed and bound is not None and bound.index in gens:
        # The key that refused: its limiter's cache keeps the denial (true of that key
        # alone, whatever the others hold).
        refusing = limiters[bound.index]._guard
        assert refusing is not None
        assert refusing.cache is not None
        cache = refusing.cache
        cache.remember(
            bound.key, plan.cost, decision, sent, gens[bound.index], refusing._watcher(cache)
        )
    return _shaped(plan, decision)


def _tell(breakers: list[Breaker], what: Any) -> None:
    for breaker in breakers:
        what(breaker)


def _degraded(plan: _Plan, exc: BackendUnavailable | None) -> Decision:
    """The strictest of the limiters' failure policies (see the module)."""
    policies = [limiter.on_unavailable for limiter in plan.limiters]
    if "raise" in policies:
        if exc is not None:
            raise exc
        raise BackendUnavailable("the backend is unavailable (circuit breaker open)")
    limit = min(limiter._max_cost for limiter in plan.limiters)
    if "deny" in policies or any(isinstance(p, Fallback) for p in policies):
        cooldowns = [b.cooldown for lim in plan.limiters if (b := lim.breaker) is not None]
        retry = max(cooldowns, default=1.0)
        return Decision(False, limit, 0, retry, retry, source="policy")
    granted = min(plan.cost, limit)
    return Decision(True, limit, limit - granted, 0.0, 0.0, granted=granted, source="policy")


def _shaped(plan: _Plan, decision: Decision) -> Decision:
    """In shadow mode (all the limiters are, or none): admitted, saying what it would be."""
    if not plan.shape.shadow or decision.shadow:
        return decision
    return dataclasses.replace(
        decision, allowed=True, shadow=True, shadow_denied=not decision.allowed
    )


async def hit_all(
    pairs: Sequence[tuple[Limiter, str]], cost: int = 1, *, partial: bool = False
) -> Decision:
    """Count ``cost`` hits for every (limiter, key) pair if every one of their limits
    admits them, in one script call; denied, count none (but on the keys of a limiter made
    with ``count_denied=True``). ``Decision.binding`` names the pair and rate that refused
    it, or for an admitted one, that binds (the fewest hits left after it).

    The limiters must be of one algorithm (FixedWindow, SlidingWindow with one
    ``buckets``, or TokenBucket), on one backend; on Redis Cluster the keys must share a
    hash tag (the limiters' ``hash_tag=``). ``partial=True``: admit as much of ``cost`` as
    every limit allows (at least 1), as ``Limiter.hit`` does."""
    if partial is not True and partial is not False:
        raise TypeError(f"partial must be a bool, not {type(partial).__name__}")
    return await _decide(pairs, cost, _HIT + _PARTIAL if partial else _HIT)


async def peek_all(
    pairs: Sequence[tuple[Limiter, str]], cost: int = 1, *, partial: bool = False
) -> Decision:
    """What ``hit_all`` would answer now; changes nothing."""
    if partial is not True and partial is not False:
        raise TypeError(f"partial must be a bool, not {type(partial).__name__}")
    return await _decide(pairs, cost, _PEEK + _PARTIAL if partial else _PEEK)


async def acquire_all(pairs: Sequence[tuple[Limiter, str]], cost: int = 1) -> Decision:
    """``hit_all``, raising ``RateLimited`` (its ``decision`` naming the key that refused)
    when denied."""
    decision = await _decide(pairs, cost, _HIT)
    if not decision.allowed:
        key = decision.binding.key if decision.binding is not None else None
        raise RateLimited(f"rate limited: {key!r}", decision=decision)
    return decision


class AllAdmission:
    """``async with admit_all(pairs) as decision``: entering takes the hit on every key
    (``acquire_all``) or raises ``RateLimited``; leaving gives nothing back."""

    __slots__ = ("_cost", "_pairs", "decision")

    def __init__(self, pairs: Sequence[tuple[Limiter, str]], cost: int) -> None:
        self._pairs, self._cost = pairs, cost
        #: the decision entering took (None until then)
        self.decision: Decision | None = None

    async def __aenter__(self) -> Decision:
        self.decision = await acquire_all(self._pairs, self._cost)
        return self.decision

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A rate limit is not a resource held by the block: nothing to give back.
        return None

    def __repr__(self) -> str:
        keys = ", ".join(repr(key) for _, key in self._pairs)
        return f"<AllAdmission {keys} cost={self._cost} decision={self.decision!r}>"


def admit_all(pairs: Sequence[tuple[Limiter, str]], cost: int = 1) -> AllAdmission:
    """``async with admit_all([(per_user, "u1"), (per_ip, ip)]) as decision:`` runs the
    block only when every key admits the hit (``acquire_all``)."""
    return AllAdmission(pairs, cost)
