"""The memory store's own bounds: the keys it holds follow the live ones (expired keys are
swept a bounded step at a time, read or not), and ``max_keys`` refuses a new key with a
``BackendError`` instead of evicting one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import aioratelimit as arl
from aioratelimit import _keys, _scripts
from aioratelimit._stores.memory.keyspace import SLOT_SHIFT, SWEEP_STEP, Keyspace
from aioratelimit._stores.memory.locks import PRUNE_MAX, Holders
from aioratelimit._stores.memory.store import MemoryStore
from aioratelimit.testing import ManualClock, memory_backend

Make = Callable[[arl.Backend], arl.Limiter]

LIMITERS: dict[str, Make] = {
    "FixedWindow": lambda b: arl.FixedWindow("1/10ms", "100/second", backend=b),
    "SlidingWindow": lambda b: arl.SlidingWindow("1/10ms", backend=b),
    "TokenBucket": lambda b: arl.TokenBucket("1/10ms", backend=b),
}
#: The longest a key can be held once it has expired: the rest of its slot, then one more.
SLOT_MS = 1 << SLOT_SHIFT


def keyspace(backend: arl.Backend) -> Keyspace:
    store = backend._store
    assert isinstance(store, MemoryStore)
    return store.keyspace


@pytest.mark.parametrize("make", LIMITERS.values(), ids=LIMITERS.keys())
async def test_keys_held_follow_the_live_keys_when_every_hit_is_a_new_key(make: Make) -> None:
    """3,000 hits 10 ms apart, each on a new key that expires 10 ms later and is never read
    again: the store never holds more than the keys of about two slots of the sweep."""
    clock = ManualClock()
    backend = memory_backend(clock=clock)
    limiter, ks = make(backend), keyspace(backend)
    most = 0
    for i in range(3_000):
        assert (await limiter.hit(f"k{i}")).allowed
        most = max(most, len(ks.data))
        clock.advance(0.01)
    # A key lives at most 1 s (100/second); it is swept once the slot of its expiry passed.
    keys_per_hit = 2 if isinstance(limiter, arl.FixedWindow) else 1
    assert most <= keys_per_hit * (1000 + 2 * SLOT_MS) // 10


async def test_a_sweep_step_examines_a_bounded_number_of_keys() -> None:
    """20,000 keys that expire at once are swept SWEEP_STEP at a time, one step per call,
    until only the live key is left: no call walks the whole keyspace."""
    clock = ManualClock()
    backend = memory_backend(clock=clock)
    limiter, ks = arl.FixedWindow("5/second", backend=backend), keyspace(backend)
    for i in range(20_000):
        await limiter.hit(f"k{i}")
    assert len(ks.data) == 20_000
    assert ks.examined == 0
    clock.advance(3)
    steps = []
    while len(ks.data) > 1:
        before = ks.examined
        await limiter.hit("live")
        steps.append(ks.examined - before)
        assert len(steps) <= 20_000 // SWEEP_STEP + 2
    assert max(steps) == SWEEP_STEP
    assert sum(steps) == 20_000
    assert list(ks.data) == [next(k for k in ks.data if "{live}" in k)]


async def test_the_sweep_never_drops_a_live_key() -> None:
    """Keys whose expiry moved later (a lock extended, a bucket refilled later) are filed
    again, not dropped; keys whose expiry moved earlier are swept at the earlier time."""
    clock = ManualClock()
    backend = memory_backend(clock=clock)
    ks = keyspace(backend)
    leases = [await arl.Lock(f"l{i}", ttl=1.0, backend=backend).acquire() for i in range(200)]
    clock.advance(0.9)
    for lease in leases[:100]:
        await lease.extend(ttl=30.0)
    for lease in leases[100:]:
        await lease.extend(ttl=0.05)
    clock.advance(3)
    for _ in range(10):
        await arl.Lock("other", backend=backend).locked()
    head = backend._head(_keys.LOCK_KIND)
    assert sorted(ks.data) == sorted(_keys.lock(head, f"l{i}")[0] for i in range(100))
    assert [await arl.Lock(f"l{i}", backend=backend).locked() for i in range(100)] == [True] * 100


async def test_max_keys_refuses_a_new_key_and_changes_nothing() -> None:
    """At ``max_keys``, a call that would create a key raises ``BackendError`` naming the
    cap and writes nothing; hits on held keys, peeks and releases still work, and once the
    held keys have expired and been swept a new key is taken again (nothing is evicted)."""
    clock = ManualClock()
    backend = memory_backend(clock=clock, max_keys=3)
    limiter, ks = arl.FixedWindow("2/second", backend=backend), keyspace(backend)
    lease = await arl.Lock("held", ttl=1.0, backend=backend).acquire()
    assert (await limiter.hit("a")).allowed
    assert (await limiter.hit("b")).allowed
    held = dict(ks.data)
    with pytest.raises(arl.BackendError, match=r"memory:// is full: it holds 3 keys \(max_keys=3"):
        await limiter.hit("c")
    with pytest.raises(arl.BackendError, match="max_keys=3"):
        await arl.Lock("other", backend=backend).acquire(timeout=0)
    with pytest.raises(arl.BackendError, match="max_keys=3"):
        await arl.issue_token(backend=backend)
    assert ks.data == held
    assert (await limiter.peek("c")).remaining == 1  # a peek creates nothing
    assert (await limiter.hit("a")).remaining == 0  # a held key is counted as ever
    assert not (await limiter.hit("a")).allowed  # and denied: nothing was forgotten
    await lease.release()  # a release of a held lock keeps its key (the tombstone)
    clock.advance(1 + 2 * SLOT_MS / 1000)
    assert (await limiter.hit("c")).allowed
    assert len(ks.data) == 1


async def test_max_keys_options() -> None:
    """``memory://?max_keys=N`` and ``memory_backend(max_keys=N)`` set the cap; anything
    else in the query, or a cap that is not a whole number >= 1, is refused."""
    async with arl.Backend.from_url("memory://?max_keys=2") as backend:
        assert backend._store.max_keys == 2  # type: ignore[attr-defined]
        assert "max_keys=2" in repr(backend._store)
        await arl.FixedWindow("1/second", backend=backend).hit("a")
        await arl.FixedWindow("1/second", backend=backend).hit("b")
        with pytest.raises(arl.BackendError, match="max_keys=2"):
            await arl.FixedWindow("1/second", backend=backend).hit("c")
    async with arl.Backend.from_url("memory://") as backend:
        assert backend._store.max_keys is None  # type: ignore[attr-defined]
    for url in ("memory://?max_keys=", "memory://?max_keys=-1", "memory://?max_keys=1e3"):
        with pytest.raises(ValueError, match="whole number"):
            arl.Backend.from_url(url)
    with pytest.raises(ValueError, match="unknown memory:// option 'maxkeys'"):
        arl.Backend.from_url("memory://?maxkeys=3")
    with pytest.raises(ValueError, match="max_keys must be >= 1"):
        memory_backend(max_keys=0)
    with pytest.raises(TypeError, match="max_keys must be an int"):
        memory_backend(max_keys=True)


async def test_a_semaphore_call_prunes_a_bounded_number_of_tombstones() -> None:
    """5,000 tombstones (releases within a ttl) that expire at once beside a live holder:
    each call removes at most PRUNE_MAX of them, popping no more of the tombstones' heap
    than it removes (no walk over the rest), and answers as if all were gone."""
    clock = ManualClock()
    backend = memory_backend(clock=clock)
    sem = arl.Semaphore("s", limit=2, ttl=60, backend=backend)
    keeper = await sem.acquire(timeout=0)
    holders_key, fences_key, channel = _keys.semaphore(backend._head(_keys.SEMAPHORE_KIND), "s")
    for i in range(5_000):
        args = (f"t{i:04d}", 5, channel, "PUBLISH")
        assert await backend._run(_scripts.SEMAPHORE_RELEASE, [holders_key, fences_key], args) == 0
    clock.advance(0.01)
    holders = keyspace(backend).data[holders_key]
    assert isinstance(holders, Holders)
    assert len(holders) == 5_001
    sizes = []
    for _ in range(3):
        lease = await sem.acquire(timeout=0)  # the keeper and this one: the limit
        sizes.append((len(holders), len(holders.tombs)))
        await lease.release()
        sizes.append((len(holders), len(holders.tombs)))
    assert sizes[:3] == [
        (5_001 - PRUNE_MAX + 1, 5_000 - PRUNE_MAX),
        (5_001 - 2 * PRUNE_MAX + 1, 5_000 - 2 * PRUNE_MAX + 1),
        (5_001 - 3 * PRUNE_MAX + 2, 5_000 - 3 * PRUNE_MAX + 1),
    ]
    await keeper.release()
