"""One decision over several keys (``hit_all``, ``peek_all``, ``acquire_all``,
``admit_all``), all or nothing, on every backend: a key that refuses leaves every other
key uncounted, racing decisions over overlapping keys never admit past any key's limit,
the Decision names the key and rate that bind, and a Cluster refuses keys of different
hash tags before any I/O."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from support.servers import RedisServer

import aioratelimit as arl
from aioratelimit._cli import admin as _admin
from aioratelimit._scripts import ScriptCall

KINDS: dict[str, Callable[..., arl.Limiter]] = {
    "fixed": arl.FixedWindow,
    "sliding": arl.SlidingWindow,
    "token": arl.TokenBucket,
}


def tenant_of(key: str) -> str:
    """The hash tag: the tenant, the part of the key before the first ``/``."""
    return key.split("/", 1)[0]


@pytest.fixture
def tenant() -> str:
    return f"acme-{uuid.uuid4().hex[:10]}"


def make(kind: str, backend: arl.Backend, *rates: str, **options: Any) -> arl.Limiter:
    """A limiter of ``kind`` tagged by the tenant (a TokenBucket takes the first rate, as
    its burst: over the tests' few seconds it refills nothing)."""
    options.setdefault("name", f"n{uuid.uuid4().hex[:6]}")
    if kind == "token":
        rates = rates[:1]
    return KINDS[kind](*rates, backend=backend, hash_tag=tenant_of, **options)


async def used(limiter: arl.Limiter, key: str, limit: int) -> int:
    """The hits ``key`` holds now under a one-rate ``limiter`` of ``limit`` (a peek)."""
    d = await limiter.peek(key)
    return limit - 1 - d.remaining if d.allowed else limit


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_one_key_refuses_and_no_key_counts(
    backend: arl.Backend, tenant: str, kind: str
) -> None:
    """Three keys, the IP's full: denied, the Decision names the IP and its rate, and the
    user's and the tenant's counters are untouched."""
    per_user = make(kind, backend, "5/hour")
    per_ip = make(kind, backend, "2/hour", "100/day")
    per_tenant = make(kind, backend, "50/hour")
    user, ip = f"{tenant}/u1", f"{tenant}/10.0.0.1"
    pairs = [(per_user, user), (per_ip, ip), (per_tenant, tenant)]
    await per_ip.hit(ip, 2)  # the IP's own hits, alone: the same counter as in the decision
    decision = await arl.hit_all(pairs)
    assert not decision.allowed
    assert decision.binding == arl.Binding(1, ip, arl.Rate(2, 3600.0))
    assert decision.limit == 2
    assert decision.retry_after > 0
    assert decision.granted == 0
    assert await used(per_user, user, 5) == 0
    assert await used(per_tenant, tenant, 50) == 0
    assert await used(per_ip, ip, 2) == 2
    with pytest.raises(arl.RateLimited) as raised:
        await arl.acquire_all(pairs)
    assert raised.value.decision is not None
    assert raised.value.decision.binding == decision.binding
    assert await used(per_user, user, 5) == 0


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_admitted_counts_every_key_and_names_the_binding_one(
    backend: arl.Backend, tenant: str, kind: str
) -> None:
    """Admitted: each key counts the cost once, and the binding key is the one with the
    fewest hits left after it; peek_all changes nothing; admit_all is the async with."""
    per_user = make(kind, backend, "5/hour")
    per_ip = make(kind, backend, "4/hour")
    per_tenant = make(kind, backend, "3/hour", "20/day")
    user, ip = f"{tenant}/u1", f"{tenant}/10.0.0.1"
    pairs = [(per_user, user), (per_ip, ip), (per_tenant, tenant)]
    peeked = await arl.peek_all(pairs, 2)
    assert peeked.allowed
    assert peeked.binding == arl.Binding(2, tenant, arl.Rate(3, 3600.0))
    decision = await arl.hit_all(pairs, 2)
    assert decision.allowed
    assert decision.granted == 2
    assert decision.remaining == 1
    assert decision.binding == arl.Binding(2, tenant, arl.Rate(3, 3600.0))
    assert [await used(per_user, user, 5), await used(per_ip, ip, 4)] == [2, 2]
    async with arl.admit_all(pairs) as entered:
        assert entered.allowed
        assert entered.remaining == 0
    with pytest.raises(arl.RateLimited):
        async with arl.admit_all(pairs):
            pytest.fail("entered though the tenant is full")
    assert [await used(per_user, user, 5), await used(per_ip, ip, 4)] == [3, 3]


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_racing_decisions_over_overlapping_keys_never_overshoot(
    backend: arl.Backend, tenant: str, kind: str
) -> None:
    """120 tasks, each over a user, an IP and the tenant (users and IPs shared between
    tasks): no key admits past its limit, and each key holds exactly the admitted
    decisions that named it (none counted by a denied one)."""
    per_user = make(kind, backend, "7/hour")
    per_ip = make(kind, backend, "9/hour")
    per_tenant = make(kind, backend, "25/hour")
    users = [f"{tenant}/u{i}" for i in range(4)]
    ips = [f"{tenant}/ip{i}" for i in range(3)]
    combos = list(itertools.product(users, ips))
    picks = [combos[i % len(combos)] for i in range(120)]
    decisions = await asyncio.gather(
        *(arl.hit_all([(per_user, u), (per_ip, ip), (per_tenant, tenant)]) for u, ip in picks)
    )
    admitted = [pick for pick, d in zip(picks, decisions, strict=True) if d.allowed]
    assert len(admitted) == 25  # enough demand on every user and IP to fill the tenant
    for u in users:
        n = sum(1 for a, _ in admitted if a == u)
        assert n <= 7
        assert await used(per_user, u, 7) == n
    for ip in ips:
        n = sum(1 for _, b in admitted if b == ip)
        assert n <= 9
        assert await used(per_ip, ip, 9) == n
    assert await used(per_tenant, tenant, 25) == 25


async def test_a_block_denies_and_is_named(backend: arl.Backend, tenant: str) -> None:
    """A blockable limiter's live block on its key denies the whole decision; the binding
    names that key with no rate, the limit is that limiter's; nothing is counted."""
    per_user = make("fixed", backend, "5/hour", blockable=True)
    per_tenant = make("fixed", backend, "3/hour", blockable=True)
    user = f"{tenant}/u1"
    await per_user.block(user, 3600)
    decision = await arl.hit_all([(per_tenant, tenant), (per_user, user)])
    assert not decision.allowed
    assert decision.binding == arl.Binding(1, user, None)
    assert decision.limit == 5
    assert decision.retry_after > 3000
    assert await used(per_tenant, tenant, 3) == 0


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_count_denied_counts_on_its_own_keys_only(
    backend: arl.Backend, tenant: str, kind: str
) -> None:
    """A denied decision counts on the keys of the limiters made with count_denied=True,
    and only on them."""
    attempts = make(kind, backend, "10/hour", count_denied=True)
    per_user = make(kind, backend, "1/hour")
    per_tenant = make(kind, backend, "10/hour")
    user = f"{tenant}/u1"
    pairs = [(per_user, user), (attempts, user), (per_tenant, tenant)]
    assert (await arl.hit_all(pairs)).allowed
    for _ in range(3):
        d = await arl.hit_all(pairs)
        assert not d.allowed
        assert d.binding is not None
        assert d.binding.index == 0
    assert await used(attempts, user, 10) == 4
    assert await used(per_tenant, tenant, 10) == 1
    # A peek counts nothing, partial or not; a partial hit denied counts as a hit does.
    for partial in (False, True):
        assert not (await arl.peek_all(pairs, 1, partial=partial)).allowed
    assert await used(attempts, user, 10) == 4
    assert not (await arl.hit_all(pairs, 3, partial=True)).allowed
    assert await used(attempts, user, 10) == 5
    # Every limiter counting denied hits (the plain mode): 4 + 7 > 10 on the user, and
    # the tenant's counts the 7 too.
    tenant_attempts = make(kind, backend, "10/hour", count_denied=True)
    d = await arl.hit_all([(attempts, user), (tenant_attempts, tenant)], 7)
    assert not d.allowed
    assert await used(tenant_attempts, tenant, 10) == 7
    assert (await arl.peek_all([(tenant_attempts, tenant)], 2, partial=True)).granted == 2
    assert await used(tenant_attempts, tenant, 10) == 7


async def test_partial_takes_what_every_key_leaves(backend: arl.Backend, tenant: str) -> None:
    per_user = make("fixed", backend, "5/hour")
    per_tenant = make("fixed", backend, "3/hour")
    pairs = [(per_user, f"{tenant}/u1"), (per_tenant, tenant)]
    d = await arl.hit_all(pairs, 10, partial=True)
    assert (d.allowed, d.granted) == (True, 3)
    assert await used(per_user, f"{tenant}/u1", 5) == 3


async def test_cross_slot_keys_are_refused_on_a_cluster_before_any_io(
    cluster_url: str, redis_url: str, tenant: str
) -> None:
    """On a Cluster, keys of different hash tags: ValueError naming hash_tag=, no call
    made; with hash_tag= the same keys are one call. On a standalone server: any keys."""
    calls: list[ScriptCall] = []
    async with arl.Backend.from_url(cluster_url, on_call=calls.append) as backend:
        per_user = arl.FixedWindow("5/hour", backend=backend, name="mk-user")
        per_ip = arl.FixedWindow("5/hour", backend=backend, name="mk-ip")
        pairs = [(per_user, f"{tenant}/u1"), (per_ip, f"{tenant}/ip1")]
        with pytest.raises(ValueError, match=r"hash tag.*hash_tag="):
            await arl.hit_all(pairs)
        with pytest.raises(ValueError, match="hash_tag="):
            await arl.peek_all(pairs)
        assert calls == []
        tagged = [
            (arl.FixedWindow("5/hour", backend=backend, name="mk-user", hash_tag=tenant_of), k)
            for _, k in pairs
        ]
        assert (await arl.hit_all(tagged)).allowed
        assert [c.script for c in calls] == ["fixed_window"]
    async with arl.Backend.from_url(redis_url) as standalone:
        per_user = arl.FixedWindow("5/hour", backend=standalone, name="mk-user")
        per_ip = arl.FixedWindow("5/hour", backend=standalone, name="mk-ip")
        assert (await arl.hit_all([(per_user, f"{tenant}/u1"), (per_ip, "1.2.3.4")])).allowed


def not_a_tag(key: str) -> Any:
    return 1


async def test_bad_input_is_refused_before_any_io(redis_url: str, tenant: str) -> None:
    """Mixed algorithms, a TokenBucket, different buckets or backends, a counter named
    twice, a bad pair, key, tag or cost: TypeError/ValueError naming the fix, no call."""
    calls: list[ScriptCall] = []
    async with arl.Backend.from_url(redis_url, on_call=calls.append) as backend:
        fw = arl.FixedWindow("5/hour", backend=backend)
        sw = arl.SlidingWindow("5/hour", backend=backend)
        other = arl.Backend.from_url("memory://")
        cases: list[tuple[Any, type[Exception], str]] = [
            ([(fw, "a"), (sw, "b")], TypeError, "one algorithm"),
            ([(fw, "a"), (arl.TokenBucket("5/hour", backend=backend), "b")], TypeError, "one"),
            (
                [(sw, "a"), (arl.SlidingWindow("5/hour", buckets=4, backend=backend), "b")],
                ValueError,
                "buckets=",
            ),
            ([(fw, "a"), (arl.FixedWindow("5/hour", backend=other), "b")], ValueError, "backend="),
            ([(fw, "a"), (fw, "a")], ValueError, "twice"),
            ([(fw, "a"), (arl.FixedWindow("5/hour", backend=backend), "a")], ValueError, "twice"),
            ([], ValueError, "at least one"),
            ((fw, "a"), TypeError, "pair"),
            ([(fw, "a", 1)], TypeError, "pair"),
            ([("a", fw)], TypeError, "pair"),
            ({"a": fw}, TypeError, "list"),
            ([(fw, "")], ValueError, "key"),
            ([(fw, 3)], TypeError, "key"),
            (
                [(arl.FixedWindow("5/hour", backend=backend, hash_tag=lambda k: ""), "a")],
                ValueError,
                "hash_tag",
            ),
            (
                [(arl.FixedWindow("5/hour", backend=backend, hash_tag=not_a_tag), "a")],
                TypeError,
                "tag",
            ),
        ]
        for pairs, error, words in cases:
            with pytest.raises(error, match=words):
                await arl.hit_all(pairs)
        costs: list[Any] = [0, 6, 1.0, True]
        for cost in costs:
            with pytest.raises((ValueError, TypeError)):
                await arl.hit_all(
                    [(fw, "a"), (arl.FixedWindow("9/hour", backend=backend), "b")], cost
                )
        with pytest.raises(TypeError, match="partial"):
            await arl.hit_all([(fw, "a")], partial=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="hash_tag"):
            arl.FixedWindow("5/hour", hash_tag="tenant")  # type: ignore[arg-type]
        assert calls == []


async def test_a_cached_denial_of_any_key_denies_at_once(backend: arl.Backend, tenant: str) -> None:
    """deny_cache: the refusing key's denial is remembered by its limiter; the next
    decision naming that key is denied from the cache, naming it, with no call."""
    per_user = make("fixed", backend, "5/hour")
    per_ip = make("fixed", backend, "1/hour", deny_cache=100)
    ip = f"{tenant}/ip"
    pairs = [(per_user, f"{tenant}/u1"), (per_ip, ip)]
    assert (await arl.hit_all(pairs)).allowed
    for _ in range(200):
        cached = await arl.hit_all(pairs)
        assert not cached.allowed
        if cached.source == "cache":
            break
        await asyncio.sleep(0.01)  # the key's subscription is being confirmed
    assert cached.source == "cache"
    assert cached.binding == arl.Binding(1, ip, arl.Rate(1, 3600.0))
    alone = await per_ip.hit(ip)  # the same denial, for the key alone
    assert (alone.allowed, alone.source) == (False, "cache")
    assert await used(per_user, f"{tenant}/u1", 5) == 1


async def test_shadow_all_or_none(backend: arl.Backend, tenant: str) -> None:
    """All in shadow mode: admitted, saying it would have been denied, counting nothing
    the limits refused; shadow and not mixed: ValueError."""
    per_user = make("fixed", backend, "1/hour", shadow=True)
    per_tenant = make("fixed", backend, "5/hour", shadow=True)
    pairs = [(per_user, f"{tenant}/u1"), (per_tenant, tenant)]
    first, second = await arl.hit_all(pairs), await arl.hit_all(pairs)
    assert (first.allowed, first.shadow_denied) == (True, False)
    assert (second.allowed, second.shadow, second.shadow_denied) == (True, True, True)
    assert await used(per_tenant, tenant, 5) == 1
    with pytest.raises(ValueError, match="shadow"):
        await arl.hit_all([(per_user, f"{tenant}/u1"), (make("fixed", backend, "5/hour"), tenant)])


@pytest.mark.parametrize(
    ("policies", "allowed"),
    [(("allow", "allow"), True), (("allow", "deny"), False), (("allow", arl.Fallback(0.5)), False)],
)
async def test_the_strictest_failure_policy_is_served(
    own_redis: RedisServer, tenant: str, policies: tuple[Any, Any], allowed: bool
) -> None:
    """Backend down: "allow" only if every limiter allows; "deny" (a Fallback counts as
    one) wins over "allow"; "raise" wins over all."""
    async with arl.Backend.from_url(own_redis.url, timeout=2.0) as backend:
        a = arl.FixedWindow("5/hour", backend=backend, on_unavailable=policies[0])
        b = arl.FixedWindow("5/hour", backend=backend, on_unavailable=policies[1], name="b")
        c = arl.FixedWindow("5/hour", backend=backend, name="c")
        await a.peek("warm")
        await asyncio.to_thread(own_redis.stop)
        try:
            d = await arl.hit_all([(a, f"{tenant}/u1"), (b, tenant)])
            assert (d.allowed, d.source) == (allowed, "policy")
            with pytest.raises(arl.BackendUnavailable):
                await arl.hit_all([(a, f"{tenant}/u1"), (c, tenant)])
        finally:
            await asyncio.to_thread(own_redis.start)


async def test_a_recorder_hears_one_decision_under_the_joined_names(tenant: str) -> None:
    """With a recorder: each multi-key decision is reported once, under the limiters' names
    joined by "+", a cached denial too (not as the refusing limiter's own)."""
    heard: list[tuple[str | None, str, str]] = []

    class Decisions(arl.Recorder):
        def decision(
            self, limiter: str | None, algorithm: str, result: str, seconds: float, decision: Any
        ) -> None:
            heard.append((limiter, algorithm, result))

    async with arl.Backend.from_url("memory://") as backend:
        per_user = arl.FixedWindow("1/minute", backend=backend, name="user", deny_cache=10)
        per_tenant = arl.FixedWindow("5/minute", backend=backend)
        pairs = [(per_user, f"{tenant}/u1"), (per_tenant, tenant)]
        arl.set_recorder(Decisions())
        try:
            for _ in range(3):
                await arl.hit_all(pairs)
            for _ in range(200):
                if (await arl.hit_all(pairs)).source == "cache":
                    break
                await asyncio.sleep(0.01)  # the key's subscription is being confirmed
        finally:
            arl.set_recorder(None)
    assert heard[:3] == [
        ("user+fw", "fixed_window", "allowed"),
        ("user+fw", "fixed_window", "denied"),
        ("user+fw", "fixed_window", "denied"),
    ]
    assert heard[-1] == ("user+fw", "fixed_window", "denied_cached")
    assert {h[0] for h in heard} == {"user+fw"}


async def test_a_tagged_limiter_tells_other_processes_under_its_tag(
    backend: arl.Backend, backend_url: str, tenant: str
) -> None:
    """hash_tag= moves a key's channel with its keys: a reset in one process reaches the
    deny cache of another (on a cluster, the channel's shard is the tag's); a block and
    the admin's read of it use the tagged block key."""
    if backend_url == "memory://":
        pytest.skip("memory:// is one process's store")
    key = f"{tenant}/u1"
    options: dict[str, Any] = {"name": "tagged-tell", "blockable": True}
    here = make("fixed", backend, "2/hour", **options)
    async with arl.Backend.from_url(backend_url) as other:
        there = make("fixed", other, "2/hour", deny_cache=10, **options)
        for _ in range(2):
            assert (await there.hit(key)).allowed
        for _ in range(200):
            if (await there.hit(key)).source == "cache":
                break
            await asyncio.sleep(0.01)  # the key's subscription is being confirmed
        else:
            pytest.fail("no denial ever came from the cache")
        await here.reset(key)
        for _ in range(200):
            if (await there.hit(key)).allowed:
                break
            await asyncio.sleep(0.01)  # the message is on its way
        else:
            pytest.fail("the reset never reached the other process's cache")
    assert await here.block(key, 3600) > 3000
    left, _ = await _admin.blocked_for(here, key)
    assert left > 3000
    decision = await arl.hit_all([(here, key)])
    assert decision.binding == arl.Binding(0, key, None)


def test_reprs_show_the_tag_function_and_the_admission() -> None:
    backend = arl.Backend.from_url("memory://")
    assert "hash_tag=tenant_of" in repr(make("sliding", backend, "1/hour"))
    assert "hash_tag" not in repr(arl.FixedWindow("1/hour", backend=backend))
    admission = arl.admit_all([(arl.FixedWindow("1/hour", backend=backend), "k")])
    assert repr(admission) == "<AllAdmission 'k' cost=1 decision=None>"


async def test_a_limiter_with_a_calendar_quota_is_refused_before_any_io(
    backend: arl.Backend, key: str
) -> None:
    """A quota's bounds follow the clock; a multi-key decision's arguments are fixed."""
    quota = arl.FixedWindow(arl.Quota(5, "day"), backend=backend)
    plain = arl.FixedWindow("5/minute", backend=backend)
    with pytest.raises(TypeError, match="Quota"):
        await arl.hit_all([(plain, key), (quota, key)])
