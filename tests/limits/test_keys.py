"""What the rate limiters leave in Redis: every key under the backend's prefix, with a TTL
no longer than the state it holds can matter; every key of one decision in one hash slot,
the slot taken from the user's key; user keys with braces, ``%``, spaces or non-ASCII kept
apart; and small keys (MEMORY USAGE of 100 B for a FixedWindow key, 200 B for a
SlidingWindow key with 10 buckets)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

import aioratelimit as arl
from aioratelimit import _keys

#: (limiter factory, longest TTL in ms any of its keys may carry)
LIMITERS: dict[str, tuple[Callable[[arl.Backend], Any], int]] = {
    "fixed": (lambda b: arl.FixedWindow("5/minute", "3/10s", backend=b), 60_000),
    "sliding": (lambda b: arl.SlidingWindow("5/minute", "3/10s", buckets=4, backend=b), 75_000),
    "token": (lambda b: arl.TokenBucket("5/minute", burst=8, backend=b), 96_000),
}

#: User keys that a key layout can get wrong: braces (the hash tag's delimiters), the
#: escape character itself, a key equal to another's escaped form, spaces, non-ASCII.
AWKWARD_KEYS = [
    "a", "a{b}", "a%7Bb%7D", "a%257Bb%257D", "{a}", "{", "}", "}{", "{}", "%", "%%",
    "a b", " ", "ключ 🔑", "x:y", "a{b", "a}b", "{{a}}",
]  # fmt: skip


@pytest.fixture
async def fresh(redis_url: str) -> AsyncIterator[arl.Backend]:
    """A backend on the shared server whose prefix no other test uses."""
    async with arl.Backend.from_url(redis_url, prefix=f"keys-{uuid.uuid4().hex[:10]}") as b:
        yield b


def written(client: redis.Redis, backend: arl.Backend) -> list[bytes]:
    """Every key under the backend's prefix."""
    return sorted(client.scan_iter(match=f"{backend.prefix}:*", count=1000))


@pytest.mark.parametrize("kind", sorted(LIMITERS))
async def test_every_key_has_a_bounded_ttl(
    fresh: arl.Backend, sync_redis: redis.Redis, kind: str
) -> None:
    """Each key a limiter writes lives under the prefix and expires within its window."""
    make, longest_ms = LIMITERS[kind]
    limiter = make(fresh)
    for user in ("u1", "u2", "u3"):
        for cost in (1, 2, 3):  # the third is denied by 3/10s (or drains the bucket)
            await limiter.hit(user, cost)
    keys = written(sync_redis, fresh)
    assert len(keys) == 3 * len(limiter.rates)
    for k in keys:
        ttl = sync_redis.pttl(k)
        assert 0 < ttl <= longest_ms + 1, (k, ttl)


@pytest.mark.parametrize("kind", sorted(LIMITERS))
async def test_peek_and_denied_hits_write_nothing_and_reset_removes_all(
    fresh: arl.Backend, sync_redis: redis.Redis, kind: str
) -> None:
    """Peeks and denied hits leave Redis byte for byte as it was; reset removes every key."""
    limiter = LIMITERS[kind][0](fresh)
    await limiter.peek("u", 1)
    assert written(sync_redis, fresh) == []
    while (await limiter.hit("u", 3)).allowed:
        pass
    keys = written(sync_redis, fresh)
    assert len(keys) == len(limiter.rates)
    before = [(sync_redis.dump(k), sync_redis.pexpiretime(k.decode())) for k in keys]
    assert not (await limiter.hit("u", 3)).allowed
    await limiter.peek("u", 1)
    assert [(sync_redis.dump(k), sync_redis.pexpiretime(k.decode())) for k in keys] == before
    await limiter.reset("u")
    assert written(sync_redis, fresh) == []


@pytest.mark.parametrize("kind", sorted(LIMITERS))
async def test_keys_of_one_decision_share_the_user_keys_slot(
    fresh: arl.Backend, sync_redis: redis.Redis, kind: str
) -> None:
    """All keys of one call hash to one slot, the slot of the user's key itself."""
    limiter = LIMITERS[kind][0](fresh)
    for user in ("alice", "bob", "ключ 🔑", "tenant:42"):
        await limiter.hit(user)
        keys = [k for k in written(sync_redis, fresh) if b"{" + user.encode() + b"}" in k]
        assert len(keys) == len(limiter.rates)
        assert {key_slot(k) for k in keys} == {key_slot(user.encode())}, user


async def test_different_user_keys_spread_over_slots(
    fresh: arl.Backend, sync_redis: redis.Redis
) -> None:
    """64 user keys land in (nearly) 64 different slots: the tag is never a constant."""
    limiter = arl.SlidingWindow("5/minute", "50/hour", backend=fresh)
    await asyncio.gather(*(limiter.hit(f"user-{i}") for i in range(64)))
    await asyncio.gather(*(limiter.hit(f"{{brace-{i}}}") for i in range(64)))
    keys = written(sync_redis, fresh)
    plain = {key_slot(k) for k in keys if b"user-" in k}
    braced = {key_slot(k) for k in keys if b"brace-" in k}
    assert len(plain) >= 60
    assert len(braced) >= 60


async def test_awkward_user_keys_have_separate_counters(
    fresh: arl.Backend, sync_redis: redis.Redis
) -> None:
    """Keys with braces, %, spaces or non-ASCII each get their own counter and one tag."""
    limiter = arl.FixedWindow("1/hour", "2/day", backend=fresh)
    first = [await limiter.hit(k) for k in AWKWARD_KEYS]
    assert all(d.allowed for d in first)
    second = [await limiter.hit(k) for k in AWKWARD_KEYS]
    assert not any(d.allowed for d in second)
    keys = written(sync_redis, fresh)
    assert len(keys) == 2 * len(AWKWARD_KEYS)
    by_tag: dict[bytes, set[int]] = {}
    for k in keys:
        # Exactly one tag: the first '{' opens it, the next '}' closes it, no others.
        assert k.count(b"{") == 1, k
        assert k.count(b"}") == 1, k
        tag = k[k.index(b"{") + 1 : k.index(b"}")]
        by_tag.setdefault(tag, set()).add(key_slot(k))
    assert len(by_tag) == len(AWKWARD_KEYS)
    assert all(len(slots) == 1 for slots in by_tag.values())
    await limiter.reset("a{b}")
    assert (await limiter.hit("a{b}")).allowed
    assert not (await limiter.hit("a%7Bb%7D")).allowed


async def test_fixed_window_key_is_at_most_100_bytes(
    redis_url: str, sync_redis: redis.Redis, key: str
) -> None:
    """MEMORY USAGE of one FixedWindow key (default prefix, a typical user key) <= 100 B."""
    async with arl.Backend.from_url(redis_url) as backend:
        limiter = arl.FixedWindow("100/minute", backend=backend)
        for _ in range(3):
            await limiter.hit(key)
        (k,) = sync_redis.keys(f"arl:fw:{{{key}}}*")
        usage = sync_redis.memory_usage(k, samples=0)
        await limiter.reset(key)
    assert usage is not None
    assert usage <= 100, usage


async def test_sliding_window_key_with_10_buckets_is_at_most_200_bytes(
    redis_url: str, sync_redis: redis.Redis, key: str
) -> None:
    """MEMORY USAGE of one SlidingWindow key with 10 full buckets is at most 200 B."""
    async with arl.Backend.from_url(redis_url) as backend:
        limiter = arl.SlidingWindow("10000/500ms", buckets=10, backend=backend)
        deadline = time.monotonic() + 5
        fields = 0
        while fields < 1 + 10 and time.monotonic() < deadline:  # about one pass per bucket
            await asyncio.gather(*(limiter.hit(key, 11) for _ in range(20)))
            (k,) = sync_redis.keys(f"arl:sw:{{{key}}}*")
            fields = sync_redis.hlen(k)
            await asyncio.sleep(0.04)
        usage = sync_redis.memory_usage(k, samples=0)
        await limiter.reset(key)
    assert fields >= 1 + 8  # the newest-bucket field and at least 8 buckets
    assert usage is not None
    assert usage <= 200, usage


# -- hash_tag= ------------------------------------------------------------------------------

#: Every suffix a limiter's keys and channels end with: rates (with buckets or a burst),
#: the block and the deny caches' channel.
SUFFIXES = [
    _keys.rate_suffix(5, 60_000_000),
    _keys.rate_suffix(3, 1_500, "/4"),
    _keys.rate_suffix(2, 1_000_000, "/8"),
    ":block",
    ":inv",
]
#: user keys and tags: the awkward ones, and short ones over the layout's own characters
#: (so that two draws often differ in one character only)
PARTS = st.one_of(
    st.sampled_from(AWKWARD_KEYS), st.text(alphabet="a{}%:/7B", min_size=1, max_size=4)
)


def test_tagged_keys_are_all_distinct_from_each_other_and_untagged_ones() -> None:
    """Every (tag, key, suffix) over the awkward parts gives its own key, and none of them
    is an untagged key of any awkward key and suffix."""
    head = _keys.head("arl", "fw", None)
    tagged = [
        _keys.by_tag(head, tag, key, suffix)
        for tag in AWKWARD_KEYS
        for key in AWKWARD_KEYS
        for suffix in SUFFIXES
    ]
    untagged = [_keys.tagged(head, key, suffix) for key in AWKWARD_KEYS for suffix in SUFFIXES]
    assert len(set(tagged)) == len(tagged)
    assert len(set(untagged)) == len(untagged)
    assert not set(tagged) & set(untagged)


@given(
    tag=PARTS, key=PARTS, suffix=st.sampled_from(SUFFIXES),
    other_tag=st.one_of(st.none(), PARTS), other_key=PARTS,
    other_suffix=st.sampled_from(SUFFIXES),
)  # fmt: skip
def test_a_tagged_key_equals_no_other_key(
    tag: str, key: str, suffix: str, other_tag: str | None, other_key: str, other_suffix: str
) -> None:
    """A key under a caller's tag (``hash_tag=``) never equals another tagged key (another
    tag, key or suffix) nor any untagged key of the same limiter; its slot is the tag's."""
    head = _keys.head("arl", "fw", "per-ip")
    one = _keys.by_tag(head, tag, key, suffix)
    if other_tag is None:
        other = _keys.tagged(head, other_key, other_suffix)
    else:
        other = _keys.by_tag(head, other_tag, other_key, other_suffix)
    same = (tag, key, suffix) == (other_tag, other_key, other_suffix)
    assert (one == other) == same
    assert _keys.hash_tag(one) == _keys.escape(tag)
    assert key_slot(one.encode()) == key_slot(f"{{{_keys.escape(tag)}}}".encode())


async def test_without_hash_tag_the_keys_are_as_they_were() -> None:
    """A limiter made without ``hash_tag=`` keeps its keys' names exactly: its user key is
    its tag; with it, the tag is the function's and the key follows in braces."""
    backend = arl.Backend.from_url("memory://")
    plain = arl.FixedWindow("5/minute", backend=backend, name="n", blockable=True)
    assert plain._keys(backend, "u{1}") == [
        "arl:fw:n:{u%7B1%7D}:5/60000",
        "arl:fw:n:{u%7B1%7D}:block",
    ]
    tagged = arl.FixedWindow(
        "5/minute", backend=backend, name="n", blockable=True, hash_tag=lambda k: k[:4]
    )
    assert tagged._keys(backend, "acme/u{1}") == [
        "arl:fw:n:{acme}{acme/u%7B1%7D}:5/60000",
        "arl:fw:n:{acme}{acme/u%7B1%7D}:block",
    ]


async def test_a_tagged_key_counts_the_same_alone_and_with_others(backend: arl.Backend) -> None:
    """The counter a key's hits use alone is the one a multi-key decision uses."""
    tag = f"t-{uuid.uuid4().hex[:8]}"
    per_user = arl.SlidingWindow("3/hour", backend=backend, hash_tag=lambda k: tag)
    per_ip = arl.SlidingWindow("9/hour", backend=backend, hash_tag=lambda k: tag, name="ip")
    await per_user.hit("u1", 2)
    assert (await arl.hit_all([(per_ip, "ip1"), (per_user, "u1")])).allowed
    assert not (await per_user.peek("u1")).allowed
    assert (await per_ip.peek("ip1", 8)).allowed
    await per_user.reset("u1")
    assert (await arl.hit_all([(per_ip, "ip1"), (per_user, "u1")], 3)).allowed
