"""One decision over several keys, all or nothing: ``hit_all``, ``peek_all``,
``acquire_all`` and ``admit_all`` (its ``async with``).

``hit_all([(per_user, "u1"), (per_ip, ip), (per_tenant, "acme")])`` admits the hit only if
every key's limit admits it, and then counts it on every key; denied, it counts on none
(but the keys of a limiter made with ``count_denied=True``). It is ONE run of the
limiters' script (``lua/fixed_window.lua`` or ``lua/sliding_window.lua``, which already
decide all-or-nothing over several counters) with every key's counters and blocks, so no
other decision can come in between: chained checks (hit one key, then the next, giving
back on a denial) admit past a limit under concurrency, and count a hit that the next key
then refuses. The reply names the key that binds (its 8th element, an index in KEYS),
which becomes ``Decision.binding``.

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
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from .. import _keys
from .._args import check_count, check_key
from .._backend import Backend, get_backend
from .._errors import BackendError, BackendUnavailable, RateLimited
from .._rates import Binding, Decision, Rate, new_decision
from .._scripts import Mode
from .algorithms import SlidingWindow, TokenBucket
from .deny_cache import clock
from .failure import Breaker, Fallback
from .guard import check_cost
from .limiter import Limiter

_PEEK, _HIT, _COUNT_DENIED, _PARTIAL = int(Mode.PEEK), int(Mode.HIT), 2, int(Mode.PARTIAL)
#: ARGV[2] + 8k: a denied hit is counted on the first k rates only (``decode_mode`` in
#: ``lua/rates_common.lua``)
_COUNTED = 8


class _Plan:
    """One multi-key decision's script call, checked and built before any I/O: its KEYS,
    ARGV and who owns each KEY (the pair's index, and its rate, or None for a block)."""

    __slots__ = ("args", "backend", "cost", "keys", "limiters", "owners", "pairs", "script")

    def __init__(self, pairs: object, cost: object, mode: int) -> None:
        pairs = _check_pairs(pairs)
        self.pairs: list[tuple[Limiter, str]] = pairs
        self.limiters = [limiter for limiter, _ in pairs]
        first = self.limiters[0]
        kind = type(first)
        for limiter in self.limiters[1:]:
            if type(limiter) is not kind:
                raise TypeError(
                    "the limiters of one multi-key decision must be of one algorithm (their"
                    f" scripts differ): {kind.__name__} and {type(limiter).__name__}; make"
                    f" them all {kind.__name__}, or decide them separately"
                )
        if isinstance(first, TokenBucket):
            raise TypeError(
                "TokenBucket limiters are not decided over several keys: use FixedWindow or"
                " SlidingWindow for a multi-key decision"
            )
        if isinstance(first, SlidingWindow):
            for limiter in self.limiters:
                assert isinstance(limiter, SlidingWindow)
                if limiter.buckets != first.buckets:
                    raise ValueError(
                        "the SlidingWindow limiters of one multi-key decision must cut their"
                        f" windows into as many buckets (one script argument): {first.buckets}"
                        f" and {limiter.buckets}; give them the same buckets="
                    )
        backends = {id(limiter._backend or get_backend()) for limiter in self.limiters}
        if len(backends) > 1:
            raise ValueError(
                "the limiters of one multi-key decision must use one backend (one script"
                " call): give them the same backend="
            )
        self.backend: Backend = first._backend or get_backend()
        if mode >= _PARTIAL:
            self.cost = check_count(cost, "cost")
        else:
            self.cost = check_cost(cost, min(limiter._max_cost for limiter in self.limiters))
        if len({limiter.shadow for limiter in self.limiters}) > 1:
            raise ValueError(
                "a multi-key decision admits or denies as one: its limiters must all be in"
                " shadow mode, or none; make them alike, or decide the shadow ones apart"
            )
        self.script = first._script
        self._build(mode)

    def _build(self, mode: int) -> None:
        """KEYS: the rates' counters of the limiters that count a denied hit first, then
        the others', then the blocks; ARGV: cost, mode and the (limit, window) pairs."""
        backend = self.backend
        counting = [i for i, lim in enumerate(self.limiters) if lim.count_denied]
        order = counting + [i for i, lim in enumerate(self.limiters) if not lim.count_denied]
        keys: list[str] = []
        owners: list[tuple[int, Rate | None]] = []
        rates_args: list[int] = []
        blocks: list[str] = []
        block_owners: list[tuple[int, Rate | None]] = []
        counted = 0
        for i in order:
            limiter, key = self.pairs[i]
            own = limiter._keys(backend, key)
            nrates = len(limiter._suffixes)
            keys += own[:nrates]
            owners += [(i, rate) for rate in _rates_of(limiter)]
            rates_args += limiter._args[-2 * nrates :]  # (a SlidingWindow's buckets first)
            if limiter.count_denied:
                counted += nrates
            if len(own) > nrates:
                blocks.append(own[nrates])
                block_owners.append((i, None))
        if len(set(keys)) < len(keys):
            raise ValueError(
                "a multi-key decision names one counter twice (the same limiter and key, or"
                " two limiters of one kind, name and rates): list each (limiter, key) once,"
                " or give the limiters different names"
            )
        keys += blocks
        owners += block_owners
        if backend._publish_command == "SPUBLISH":  # Redis Cluster: one slot per script
            tags = {_keys.hash_tag(k) for k in keys}
            if len(tags) > 1:
                raise ValueError(
                    "on Redis Cluster the keys of one decision must share a hash tag (one"
                    " slot), and these do not: make each limiter with hash_tag=, a function"
                    " of its key naming the tag they share (e.g. the tenant:"
                    " hash_tag=lambda key: key.split('/')[0])"
                )
        if mode != _PEEK and counted:
            # Every limiter counting denied hits: the plain mode; some: the first k rates.
            mode = (
                _COUNT_DENIED if counted == len(owners) - len(blocks) else mode + _COUNTED * counted
            )
        if isinstance(self.limiters[0], SlidingWindow):
            head: tuple[int, ...] = (self.cost, mode, self.limiters[0]._args[0])
        else:
            head = (self.cost, mode)
        self.keys, self.owners = keys, owners
        self.args = (*head, *rates_args)

    def decision(self, reply: Sequence[int]) -> Decision:
        """The reply as a ``Decision`` naming the key and rate that bind."""
        d = Decision.from_reply(reply)
        index, rate = self.owners[int(reply[7]) - 1]
        limit = d.limit
        if rate is None:  # a block denied: the limit is its limiter's tightest
            limit = self.limiters[index]._max_cost
        binding = Binding(index, self.pairs[index][1], rate)
        return new_decision(
            d.allowed, limit, d.remaining, d.reset_after, d.retry_after, "redis",
            granted=d.granted, binding=binding,
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
        check_key(key)
        limiter._tag(key)  # a hash_tag that fails or answers no tag: raises here
        checked.append((limiter, key))
    return checked


async def _decide(pairs: object, cost: object, mode: int) -> Decision:
    plan = _Plan(pairs, cost, mode)
    limiters, keys_of = plan.limiters, [key for _, key in plan.pairs]
    guards = [(i, lim._guard) for i, lim in enumerate(limiters) if lim._guard is not None]
    for i, guard in guards:
        cached = guard.cached(keys_of[i], plan.cost, mode)
        if cached is not None:  # (shaped already, in shadow mode)
            rate = next((r for r in _rates_of(limiters[i]) if r.limit == cached.limit), None)
            return dataclasses.replace(cached, binding=Binding(i, keys_of[i], rate))
    breakers = [b for _, g in guards if (b := g.breaker) is not None]
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
        reply = await plan.backend._run(plan.script, plan.keys, plan.args)
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
    binding = decision.binding
    if not decision.allowed and binding is not None and binding.index in gens:
        # The key that refused: its limiter's cache keeps the denial (true of that key
        # alone, whatever the others hold).
        refusing = limiters[binding.index]._guard
        assert refusing is not None
        assert refusing.cache is not None
        cache = refusing.cache
        cache.remember(
            binding.key, plan.cost, decision, sent, gens[binding.index], refusing._watcher(cache)
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
    if not plan.limiters[0].shadow or decision.shadow:
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

    The limiters must be of one algorithm, FixedWindow or SlidingWindow (with one
    ``buckets``), on one backend; on Redis Cluster the keys must share a hash tag (the
    limiters' ``hash_tag=``). ``partial=True``: admit as much of ``cost`` as every limit
    allows (at least 1), as ``Limiter.hit`` does."""
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
