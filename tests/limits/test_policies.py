"""Policies (``policies=Policies(...)``): a limiter's rates from data, on every backend.

A key's counts survive a change by the policy's rule (keep, proportional, reset), window
changes included; a change made here takes effect at once, one made over another backend
(another process) when its message arrives; the key's stamp refuses a call older than it;
a failing or slow store or lookup leaves the last known policy, said on the Decision; a
bad policy is refused before anything is stored; concurrent hits across a change never
admit past the limit the decision obeyed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from support.pace import until

import aioratelimit as arl
from aioratelimit import _keys, _scripts

Make = Callable[..., arl.Limiter]

ALGORITHMS: dict[str, Make] = {
    "fixed": lambda rate, **kw: arl.FixedWindow(rate, **kw),
    "sliding": lambda rate, **kw: arl.SlidingWindow(rate, **kw),
    "token": lambda rate, **kw: arl.TokenBucket(rate, **kw),
}


@pytest.fixture(params=sorted(ALGORITHMS))
def make(request: pytest.FixtureRequest) -> Make:
    return ALGORITHMS[request.param]


def named(key: str) -> str:
    """A limiter name no other test uses: its store is its own."""
    return f"api-{key}"


async def spend(limiter: arl.Limiter, key: str, n: int) -> None:
    for _ in range(n):
        assert (await limiter.hit(key)).allowed


async def admitted(limiter: arl.Limiter, key: str, tries: int) -> int:
    return sum([(await limiter.hit(key)).allowed for _ in range(tries)])


async def test_an_upgrade_mid_window_keeps_the_count(
    backend: arl.Backend, make: Make, key: str
) -> None:
    """free (4/hour) -> pro (10/hour), rule keep: the 3 hits counted stay counted, so 7
    more are admitted; the decisions name the policy."""
    policies = arl.Policies()
    limiter = make("4/hour", backend=backend, name=named(key), policies=policies)
    await spend(limiter, key, 3)
    assert (await limiter.peek(key)).policy == "default"
    await policies.set("pro", "10/hour")
    await policies.assign(key, "pro")
    d = await limiter.hit(key)
    assert (d.allowed, d.limit, d.remaining, d.policy) == (True, 10, 6, "pro")
    assert await admitted(limiter, key, 8) == 6


async def test_proportional_scales_the_count(backend: arl.Backend, make: Make, key: str) -> None:
    """4 of 8 used, then 16/hour proportional: 8 of 16 used (a peek: 7 left after it)."""
    policies = arl.Policies()
    limiter = make("8/hour", backend=backend, name=named(key), policies=policies)
    await spend(limiter, key, 4)
    await policies.assign(key, arl.Policy("16/hour", rule="proportional"))
    d = await limiter.peek(key)
    assert (d.limit, d.remaining, d.policy) == (16, 7, "key")


async def test_reset_starts_from_zero(backend: arl.Backend, make: Make, key: str) -> None:
    policies = arl.Policies()
    limiter = make("3/hour", backend=backend, name=named(key), policies=policies)
    await spend(limiter, key, 3)
    assert not (await limiter.hit(key)).allowed
    await policies.set("support", arl.Policy("5/hour", rule="reset"))
    await policies.assign(key, "support")
    assert await admitted(limiter, key, 7) == 5


async def test_a_shorter_window_keeps_the_count_for_at_most_its_length(
    backend: arl.Backend, key: str
) -> None:
    """A fixed window cut from an hour to a minute: the count stays, and the window ends
    within the new minute."""
    policies = arl.Policies()
    limiter = arl.FixedWindow("5/hour", backend=backend, name=named(key), policies=policies)
    await spend(limiter, key, 2)
    await policies.assign(key, arl.Policy("5/minute"))
    d = await limiter.peek(key)
    assert (d.remaining, d.policy) == (2, "key")
    assert d.reset_after <= 60


async def test_removing_an_override_gives_the_default_back(
    backend: arl.Backend, make: Make, key: str
) -> None:
    policies = arl.Policies()
    limiter = make("2/hour", backend=backend, name=named(key), policies=policies)
    await policies.assign(key, arl.Policy("50/hour"))
    assert (await limiter.peek(key)).limit == 50
    assert await policies.unassign(key)
    assert not await policies.unassign(key)
    d = await limiter.peek(key)
    assert (d.limit, d.policy) == (2, "default")


async def test_the_store_api(backend: arl.Backend, key: str) -> None:
    policies = arl.Policies()
    arl.FixedWindow("2/hour", backend=backend, name=named(key), policies=policies)
    v1 = await policies.set("pro", "10/minute", "100/hour", rule="proportional")
    v2 = await policies.set("free", "1/minute")
    assert v2 > v1 > 0
    assert await policies.get("pro") == arl.Policy("10/minute", "100/hour", rule="proportional")
    assert sorted(await policies.list()) == ["free", "pro"]
    assert await policies.delete("free")
    assert not await policies.delete("free")
    assert await policies.get("free") is None
    await policies.assign(key, "pro")
    assert await policies.store.override(key) == "pro"
    assert await policies.effective(key) == ("pro", await policies.get("pro"), False)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("pro", "10/minute", {"rule": "sometimes"}), ValueError),
        (("pro", "ten/minute", {}), ValueError),
        (("pro", "0/minute", {}), ValueError),
        (("pro", "-1/minute", {}), ValueError),
        (("pro", 10, {}), TypeError),
        (("default", "10/minute", {}), ValueError),
        (("", "10/minute", {}), ValueError),
    ],
)
async def test_a_bad_policy_is_refused_before_anything_is_stored(
    backend: arl.Backend, key: str, args: tuple[object, ...], error: type[Exception]
) -> None:
    policies = arl.Policies()
    arl.FixedWindow("2/hour", backend=backend, name=named(key), policies=policies)
    name, rate, kw = args
    with pytest.raises(error):
        await policies.set(name, rate, **kw)  # type: ignore[arg-type]
    assert await policies.list() == {}


async def test_an_unknown_name_or_a_rate_the_limiter_cannot_take_is_refused(
    backend: arl.Backend, key: str
) -> None:
    policies = arl.Policies()
    limiter = arl.TokenBucket("2/hour", backend=backend, name=named(key), policies=policies)
    with pytest.raises(ValueError, match="unknown policy"):
        await policies.assign(key, "gold")
    with pytest.raises(ValueError, match="one rate"):
        await policies.set("two", "1/second", "10/minute")
    assert await policies.store.override(key) is None
    assert await policies.list() == {}
    assert (await limiter.peek(key)).policy == "default"


def test_policies_need_a_named_limiter_and_serve_one() -> None:
    policies = arl.Policies()
    with pytest.raises(TypeError, match="name="):
        arl.FixedWindow("1/second", policies=policies)
    with pytest.raises(TypeError):
        arl.FixedWindow("1/second", name="x", policies="pro")  # type: ignore[arg-type]
    arl.FixedWindow("1/second", name="a", policies=policies)
    with pytest.raises(ValueError, match="another limiter"):
        arl.FixedWindow("1/second", name="b", policies=policies)
    with pytest.raises(TypeError):
        arl.Policies(lookup="tier")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown rule"):
        arl.Policy("1/second", rule="proportionally")


async def test_the_lookup_names_a_keys_policy(backend: arl.Backend, key: str) -> None:
    """A sync and an async lookup: a name the store knows, a Policy, or None."""
    tiers: dict[str, str | arl.Policy] = {key: "pro", f"{key}-own": arl.Policy("7/hour")}

    async def lookup(k: str) -> str | arl.Policy | None:
        return tiers.get(k)

    def sync_lookup(k: str) -> str | arl.Policy | None:
        return tiers.get(k)

    for fn in (lookup, sync_lookup):
        policies = arl.Policies(fn)
        limiter = arl.FixedWindow("2/hour", backend=backend, name=named(key), policies=policies)
        await policies.set("pro", "9/hour")
        assert ((await limiter.peek(key)).limit, (await limiter.peek(key)).policy) == (9, "pro")
        assert (await limiter.peek(f"{key}-own")).limit == 7
        assert (await limiter.peek(f"{key}-none")).policy == "default"


async def test_a_failing_or_slow_lookup_keeps_the_last_known_policy(
    backend: arl.Backend, key: str
) -> None:
    """The lookup raises, then hangs past the timeout: the decision goes on with the last
    policy known for the key (the code's rates for a key never resolved), marked stale."""
    state = {"mode": "ok"}
    hang = asyncio.Event()

    async def lookup(k: str) -> str:
        if state["mode"] == "raise":
            raise ConnectionError("billing database down")
        if state["mode"] == "hang":
            await hang.wait()
        return "pro"

    policies = arl.Policies(lookup, ttl=0.001, timeout=0.05)
    limiter = arl.FixedWindow("2/hour", backend=backend, name=named(key), policies=policies)
    await policies.set("pro", "9/hour")
    d = await limiter.hit(key)
    assert (d.limit, d.policy, d.policy_stale) == (9, "pro", False)
    for mode in ("raise", "hang"):
        state["mode"] = mode
        await until(lambda: policies._cached(key) is None)  # its ttl has run out
        d = await limiter.hit(key)
        assert (d.allowed, d.limit, d.policy, d.policy_stale) == (True, 9, "pro", True)
        d = await limiter.hit(f"{key}-{mode}")
        assert (d.limit, d.policy, d.policy_stale) == (2, "default", True)
    hang.set()


async def test_a_change_drops_the_cached_denials(backend: arl.Backend, key: str) -> None:
    policies = arl.Policies()
    limiter = arl.FixedWindow(
        "1/hour", backend=backend, name=named(key), policies=policies, deny_cache=10
    )
    await spend(limiter, key, 1)
    assert not (await limiter.hit(key)).allowed
    await policies.assign(key, arl.Policy("3/hour"))
    d = await limiter.hit(key)
    assert (d.allowed, d.source, d.policy) == (True, "redis", "key")


async def test_a_call_older_than_the_stamp_is_refused(backend: arl.Backend, key: str) -> None:
    """The script itself: a view older than the key's stamp changes nothing and says the
    stamp's version; the limiter then reads the store and decides under the newest."""
    policies = arl.Policies()
    limiter = arl.FixedWindow("5/hour", backend=backend, name=named(key), policies=policies)
    v = await policies.assign(key, arl.Policy("10/hour"))
    await spend(limiter, key, 2)
    head = backend._head("fw", named(key))
    keys = [_keys.tagged(head, key, s) for s in _keys.policy_suffixes(1)]
    old = (f"{v - 1}|5,3600000000", "fw|keep", 1, 1, 5, 3_600_000_000)
    assert await backend._run(_scripts.FIXED_WINDOW_POLICY, keys, old) == [-1, v]
    d = await limiter.peek(key)
    assert (d.limit, d.remaining) == (10, 7)


async def test_a_change_over_another_backend_arrives_here(
    backend: arl.Backend, backend_url: str, key: str
) -> None:
    """Two processes' worth: a change made over another backend reaches this limiter's
    cached view through the store's channel (long before its ttl); the delay is printed."""
    policies = arl.Policies(ttl=3600)
    limiter = arl.FixedWindow("2/hour", backend=backend, name=named(key), policies=policies)
    await limiter.peek(f"{key}-first")  # starts the listener
    await until(lambda: policies._confirmed)
    assert (await limiter.peek(key)).limit == 2  # resolved once confirmed: kept an hour
    other = backend if backend_url == "memory://" else arl.Backend.from_url(backend_url)
    try:
        remote = arl.Policies()
        arl.FixedWindow("2/hour", backend=other, name=named(key), policies=remote)
        start = time.perf_counter()
        await remote.assign(key, arl.Policy("20/hour"))
        await until(lambda: policies._cached(key) is None)
        delay = time.perf_counter() - start
        print(f"\npropagation over {backend.url.split(':')[0]}: {delay * 1000:.2f} ms")
        assert (await limiter.peek(key)).limit == 20
    finally:
        if other is not backend:
            await other.aclose()


async def test_concurrent_hits_across_a_change_never_admit_past_the_limit(
    backend: arl.Backend, backend_url: str, key: str
) -> None:
    """Two processes' limiters flood one key while the limit goes from 10 to 30 (keep):
    no more than 30 are admitted in all, and every admission obeyed a limit it was under."""
    other = backend if backend_url == "memory://" else arl.Backend.from_url(backend_url)
    try:
        here, there = arl.Policies(), arl.Policies()
        a = arl.FixedWindow("10/hour", backend=backend, name=named(key), policies=here)
        b = arl.FixedWindow("10/hour", backend=other, name=named(key), policies=there)
        decisions: list[arl.Decision] = []

        async def flood(limiter: arl.Limiter) -> None:
            for _ in range(25):
                decisions.append(await limiter.hit(key))

        tasks = [asyncio.create_task(flood(lim)) for lim in (a, b) * 8]
        await asyncio.sleep(0)
        await here.assign(key, arl.Policy("30/hour"))
        await asyncio.gather(*tasks)
        allowed = [d for d in decisions if d.allowed]
        assert len(allowed) <= 30
        assert all(d.remaining < d.limit for d in allowed)
        assert {d.limit for d in allowed} <= {10, 30}
        # once every process has the change, the key is at the new limit exactly
        assert await admitted(a, key, 40) + len(allowed) == 30
    finally:
        if other is not backend:
            await other.aclose()


async def test_a_reset_clears_the_stamp_and_every_position(
    backend: arl.Backend, make: Make, key: str
) -> None:
    policies = arl.Policies()
    limiter = make("3/hour", backend=backend, name=named(key), policies=policies)
    await spend(limiter, key, 3)
    await limiter.reset(key)
    assert await admitted(limiter, key, 4) == 3


async def test_a_refund_goes_to_the_keys_current_rates(
    backend: arl.Backend, make: Make, key: str
) -> None:
    policies = arl.Policies()
    limiter = make("3/hour", backend=backend, name=named(key), policies=policies)
    await policies.assign(key, arl.Policy("4/hour"))
    await spend(limiter, key, 4)
    assert await limiter.refund(key) == 1
    assert await admitted(limiter, key, 2) == 1


async def test_a_waiter_books_under_the_keys_policy(backend: arl.Backend, key: str) -> None:
    """A TokenBucket waiter (``acquire(wait=True)``) books its slot under the key's policy."""
    policies = arl.Policies()
    limiter = arl.TokenBucket("1/hour", backend=backend, name=named(key), policies=policies)
    await policies.assign(key, arl.Policy("20/second"))
    await spend(limiter, key, 20)
    d = await limiter.acquire(key, wait=True, timeout=30)
    assert (d.allowed, d.limit, d.policy) == (True, 20, "key")
    assert "policies=<Policies" in repr(limiter)


async def test_a_policy_named_before_it_exists_applies_once_set(
    backend: arl.Backend, key: str
) -> None:
    """The lookup names a policy the store does not have yet: the key gets the code's
    rates, until the policy is set (here or in another process)."""
    policies = arl.Policies(lambda k: "gold", ttl=3600)
    limiter = arl.FixedWindow("2/hour", backend=backend, name=named(key), policies=policies)
    assert (await limiter.peek(key)).policy == "default"
    await policies.set("gold", "50/hour")
    d = await limiter.peek(key)
    assert (d.limit, d.policy) == (50, "gold")


async def test_what_a_policy_limiter_does_not_take_is_refused_before_any_io() -> None:
    """A settlement, a multi-key decision, a hash tag and a calendar quota name the code's
    rates and keys: refused with a limiter made with ``policies=``."""
    async with arl.Backend.from_url("memory://") as backend:
        policies = arl.Policies()
        limiter = arl.FixedWindow("5/minute", name="refused", backend=backend, policies=policies)
        with pytest.raises(TypeError, match="policies"):
            limiter.reserve("k")
        with pytest.raises(TypeError, match="policies"):
            await arl.hit_all([(limiter, "k")])
        with pytest.raises(ValueError, match="hash_tag"):
            arl.FixedWindow("5/minute", name="t", policies=arl.Policies(), hash_tag=str.upper)
        with pytest.raises(TypeError, match="quotas"):
            arl.FixedWindow(arl.Quota(5, "day"), name="q", policies=arl.Policies())
