"""Idempotency keys on every backend: one execution per key, replayed results, owner-fenced
transitions, leases that free the key after a crash, and no key stuck after a cancellation."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import random
import sys
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from support import loops
from support.pace import asleep, pace, until

import aioratelimit as arl
from aioratelimit import _keys, _scripts
from aioratelimit._idempotency import store as _idempotency
from aioratelimit._idempotency.store import Claimed, IdempotencyStore, InProgress, Replay


def record_key(backend: arl.Backend, key: str, name: str | None = None) -> str:
    return _keys.idempotency(backend._head(_keys.IDEMPOTENCY_KIND, name), key)[0]


async def test_first_call_runs_and_later_calls_replay(backend: arl.Backend, key: str) -> None:
    """The body runs once per key; later calls get its stored (JSON round-tripped) result."""
    runs: list[int] = []

    @arl.idempotent(key=lambda order, amount: f"{key}:{order}", backend=backend)
    async def charge(order: int, amount: int) -> dict[str, Any]:
        runs.append(order)
        return {"order": order, "amount": amount, "parts": (1, 2)}

    first = await charge(1, 100)
    assert first == {"order": 1, "amount": 100, "parts": (1, 2)}
    assert await charge(1, 100) == {"order": 1, "amount": 100, "parts": [1, 2]}
    assert await charge(2, 100) == {"order": 2, "amount": 100, "parts": (1, 2)}
    assert runs == [1, 2]


async def test_100_concurrent_duplicates_run_the_body_once(backend: arl.Backend, key: str) -> None:
    """Of 100 concurrent calls with one key, one runs; the others raise IdempotencyInProgress."""
    runs = 0
    refused = asyncio.Event()  # set by the 99th refusal: the one run then ends
    refusals: list[arl.IdempotencyInProgress] = []

    @arl.idempotent(key=lambda: key, backend=backend)
    async def work() -> str:
        nonlocal runs
        runs += 1
        await asyncio.wait_for(refused.wait(), 10)
        return "done"

    async def call() -> str:
        try:
            return await work()
        except arl.IdempotencyInProgress as exc:
            refusals.append(exc)
            if len(refusals) == 99:
                refused.set()
            raise

    results = await asyncio.gather(*(call() for _ in range(100)), return_exceptions=True)
    assert runs == 1
    assert results.count("done") == 1
    busy = [r for r in results if isinstance(r, arl.IdempotencyInProgress)]
    assert len(busy) == 99
    assert all(0 < e.retry_after <= 30.0 and e.key == key for e in busy)
    assert await work() == "done"
    assert runs == 1


async def test_100_concurrent_waiters_all_get_the_first_result(
    backend: arl.Backend, key: str
) -> None:
    """With wait=True, 100 concurrent calls run the body once and all return its result."""
    runs = 0

    @arl.idempotent(key=lambda: key, wait=True, backend=backend)
    async def work() -> dict[str, int]:
        nonlocal runs
        runs += 1
        await asleep(backend, count=99)  # the others wait for this result
        return {"run": runs}

    results = await asyncio.gather(*(work() for _ in range(100)))
    assert runs == 1
    assert results == [{"run": 1}] * 100


async def test_wait_is_woken_by_the_completion(
    backend: arl.Backend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter returns the first result right after it completes, not after a timer."""
    monkeypatch.setattr(_idempotency, "FALLBACK_WAIT", 60.0)
    started = asyncio.Event()

    @arl.idempotent(key=lambda n: key, lease=60.0, wait=True, backend=backend)
    async def work(n: int) -> int:
        started.set()
        await asleep(backend)  # the second call waits for this one's result
        return n

    first = asyncio.create_task(work(1))
    await asyncio.wait_for(started.wait(), 10)
    # Without a wake-up the waiter would sleep for its 60 s fallback.
    assert await asyncio.wait_for(work(2), 15) == 1
    assert await first == 1


async def test_waiter_runs_itself_after_the_first_call_raises(
    backend: arl.Backend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the first call raises, a waiter is woken, claims the key and runs the body."""
    monkeypatch.setattr(_idempotency, "FALLBACK_WAIT", 60.0)
    started = asyncio.Event()
    calls: list[int] = []

    @arl.idempotent(key=lambda n: key, lease=60.0, wait=True, backend=backend)
    async def work(n: int) -> int:
        calls.append(n)
        started.set()
        if n == 1:
            await asleep(backend)  # the second call waits for this one's result
            raise RuntimeError("declined")
        return n

    first = asyncio.create_task(work(1))
    await asyncio.wait_for(started.wait(), 10)
    assert await asyncio.wait_for(work(2), 15) == 2
    with pytest.raises(RuntimeError, match="declined"):
        await first
    assert calls == [1, 2]
    assert await work(3) == 2


async def test_raising_function_stores_nothing_and_frees_the_key(
    backend: arl.Backend, key: str
) -> None:
    """A call that raises leaves no record: the next call with the key runs the body."""
    attempts = 0

    @arl.idempotent(key=lambda: key, backend=backend)
    async def flaky() -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("provider down")
        return attempts

    with pytest.raises(ConnectionError):
        await flaky()
    assert await backend._run(_scripts.DELETE, [record_key(backend, key)], []) == 0
    assert await flaky() == 2
    assert await flaky() == 2


async def test_fingerprint_mismatch_runs_nothing(backend: arl.Backend, key: str) -> None:
    """The same key with another fingerprint raises IdempotencyKeyMismatch and runs nothing,
    whether the first call completed or still runs."""
    runs: list[int] = []
    running, release = asyncio.Event(), asyncio.Event()

    @arl.idempotent(
        key=lambda k, amount: k, fingerprint=lambda k, amount: str(amount), backend=backend
    )
    async def charge(k: str, amount: int) -> int:
        runs.append(amount)
        if k.endswith("slow"):
            running.set()
            await release.wait()
        return amount

    assert await charge(key, 100) == 100
    with pytest.raises(arl.IdempotencyKeyMismatch) as info:
        await charge(key, 200)
    assert info.value.key == key
    assert await charge(key, 100) == 100

    slow = asyncio.create_task(charge(f"{key}-slow", 5))
    await running.wait()  # it has claimed the key (a fixed pause could come before the claim)
    with pytest.raises(arl.IdempotencyKeyMismatch):
        await charge(f"{key}-slow", 6)
    with pytest.raises(arl.IdempotencyInProgress):
        await charge(f"{key}-slow", 5)
    release.set()
    assert await slow == 5
    assert runs == [100, 5]


async def test_stale_owner_can_neither_complete_nor_release(backend: arl.Backend, key: str) -> None:
    """After its lease passed and another claimed the key, the old owner changes nothing."""
    lease = pace(backend, network=0.5, memory=0.25)  # holds two claims (microseconds here)
    store = IdempotencyStore(backend, lease=lease)
    stale = await store.claim(key, "fp")
    assert isinstance(stale, Claimed)
    assert isinstance(await store.claim(key, "fp"), InProgress)
    await asyncio.sleep(lease + pace(backend, network=0.2, memory=0.05))  # past the lease
    fresh = await store.claim(key, "fp")
    assert isinstance(fresh, Claimed)
    assert await store.renew(stale) is False
    assert await store.complete(stale, b"stale result") is False
    assert await store.release(stale) is False
    assert isinstance(await store.claim(key, "fp"), InProgress)  # still the new owner's
    assert await store.renew(fresh) is True
    assert await store.complete(fresh, b"fresh result") is True
    assert await store.release(fresh) is False
    assert await store.claim(key, "fp") == Replay(key, b"fresh result")


async def test_stale_decorated_call_does_not_overwrite_the_new_owner(
    backend: arl.Backend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A call whose record was taken over still returns its value, but stores nothing."""
    other = IdempotencyStore(backend, lease=30.0)
    taken: list[Any] = []

    @arl.idempotent(key=lambda: key, backend=backend)
    async def work() -> str:
        # The lease "passes" (the record vanishes) and another caller claims the key.
        await backend._run(_scripts.DELETE, [record_key(backend, key)], [])
        taken.append(await other.claim(key))
        return "late"

    with caplog.at_level(logging.WARNING, logger="aioratelimit"):
        assert await work() == "late"
    assert "was not stored" in caplog.text
    new_owner = taken[0]
    assert isinstance(new_owner, Claimed)
    assert isinstance(await other.claim(key), InProgress)
    assert await other.complete(new_owner, b'"new"')
    assert await work() == "new"


async def test_lease_is_renewed_while_the_call_runs(backend: arl.Backend, key: str) -> None:
    """A call running for several leases keeps its key: duplicates stay InProgress."""
    store = IdempotencyStore(backend)
    # Renewed every third of the lease, lost if a renewal comes two thirds of it late:
    # 267 ms on memory:// (a call takes microseconds), 400 ms on a network.
    lease = pace(backend, network=0.6, memory=0.4)
    running, probed = asyncio.Event(), asyncio.Event()

    @arl.idempotent(key=lambda: key, lease=lease, backend=backend)
    async def long() -> int:
        running.set()
        # Until the probes are done (over two leases): a fixed length of work could end
        # before a probe that a loaded machine delays, which would then find a replay.
        await probed.wait()
        return 7

    task = asyncio.create_task(long())
    await running.wait()  # it has claimed the key
    for _ in range(2):
        await asyncio.sleep(lease + 0.05)  # each probe comes after a whole lease
        assert isinstance(await store.claim(key), InProgress)
    probed.set()
    assert await task == 7
    assert await store.claim(key) == Replay(key, b"7")


async def test_pluggable_serializer(backend: arl.Backend, key: str) -> None:
    """Any object with dumps/loads stores results, e.g. the pickle module."""

    @arl.idempotent(key=lambda: key, serializer=pickle, backend=backend)
    async def make() -> tuple[int, frozenset[str]]:
        return (1, frozenset({"a"}))

    assert await make() == (1, frozenset({"a"}))
    again = await make()
    assert again == (1, frozenset({"a"}))
    assert isinstance(again, tuple)


async def test_name_separates_functions_sharing_a_key(backend: arl.Backend, key: str) -> None:
    """Two decorated functions with different names do not replay each other's results."""

    @arl.idempotent(key=lambda: key, name="a", backend=backend)
    async def a() -> str:
        return "a"

    @arl.idempotent(key=lambda: key, name="b", backend=backend)
    async def b() -> str:
        return "b"

    assert (await a(), await b(), await a(), await b()) == ("a", "b", "a", "b")


async def test_wait_with_timeout_returns_in_progress(backend: arl.Backend, key: str) -> None:
    """store.wait gives up with InProgress once its timeout passes."""
    store = IdempotencyStore(backend, lease=30.0)
    held = await store.claim(key)
    assert isinstance(held, Claimed)
    outcome = await asyncio.wait_for(store.wait(key, timeout=0.2), 10)
    assert isinstance(outcome, InProgress)
    assert await store.release(held)
    assert isinstance(await store.wait(key, timeout=0.2), Claimed)


async def test_cancellation_at_random_points_never_leaves_a_key_stuck(
    backend: arl.Backend, key: str
) -> None:
    """Calls cancelled anywhere (claim, body, complete) leave each key free or completed
    within its lease."""
    rng = random.Random(4)
    lease = 0.6

    @arl.idempotent(key=lambda k: k, lease=lease, backend=backend)
    async def body(k: str) -> str:
        await asyncio.sleep(rng.uniform(0, 0.01))
        return k

    keys = [f"{key}-{i}" for i in range(40)]
    loop = asyncio.get_running_loop()
    tasks = [asyncio.create_task(body(k)) for k in keys]
    for task in tasks:
        loop.call_later(rng.uniform(0, 0.015), task.cancel)
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert any(isinstance(o, asyncio.CancelledError) for o in outcomes)
    start = loop.time()
    store = IdempotencyStore(backend, lease=lease)
    for k, outcome in zip(keys, outcomes, strict=True):
        while isinstance(claim := await store.claim(k), InProgress):
            assert loop.time() - start < lease + 3.0, f"{k} still in progress"
            await asyncio.sleep(0.05)
        if isinstance(claim, Replay):
            assert claim.payload == f'"{k}"'.encode()
        else:
            assert outcome != k  # a call that returned must have stored its result
            assert await store.release(claim)


async def test_bad_arguments_raise_before_io(backend: arl.Backend, key: str) -> None:
    """Bad options or keys raise ValueError/TypeError before any claim."""
    bad: dict[str, Any]
    for bad in ({"ttl": 0}, {"lease": -1.0}, {"ttl": float("nan")}, {"max_result_bytes": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            arl.idempotent(key=lambda: key, **bad)
    with pytest.raises(TypeError, match="key"):
        arl.idempotent(key=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key"):
        arl.idempotent(key="")
    with pytest.raises(TypeError, match="serializer"):
        arl.idempotent(key="k", serializer=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="async"):
        arl.idempotent(key="k")(lambda: 1)  # type: ignore[arg-type, return-value]

    @arl.idempotent(key=lambda k: k, fingerprint=lambda k: 42, backend=backend)  # type: ignore[arg-type, return-value]
    async def f(k: object) -> None:
        raise AssertionError("must not run")

    with pytest.raises(TypeError, match="fingerprint"):
        await f(key)
    with pytest.raises(TypeError, match="key"):
        await f(42)
    with pytest.raises(ValueError, match="key"):
        await f("")


async def test_every_record_has_a_ttl(redis_url: str, sync_redis: redis.Redis) -> None:
    """In progress a record expires with its lease; completed, after ttl; released, it is gone."""
    prefix = f"idem-{uuid.uuid4().hex[:8]}"
    async with arl.Backend.from_url(redis_url, prefix=prefix) as backend:
        store = IdempotencyStore(backend, ttl=60.0, lease=5.0)
        running = await store.claim("a")
        done = await store.claim("b")
        dropped = await store.claim("c")
        assert isinstance(running, Claimed)
        assert isinstance(done, Claimed)
        assert isinstance(dropped, Claimed)
        assert 0 < sync_redis.pttl(record_key(backend, "a")) <= 5001  # PXAT rounds up
        assert await store.complete(done, b"1")
        assert 5001 < sync_redis.pttl(record_key(backend, "b")) <= 60_001
        assert await store.release(dropped)
        keys = list(sync_redis.scan_iter(match=f"{prefix}:*"))
        assert sorted(keys) == sorted(record_key(backend, k).encode() for k in "ab")
        assert all(sync_redis.pttl(k) > 0 for k in keys)
        await store.release(running)


CHILD = """
import asyncio, sys
import aioratelimit as arl

async def main(url, prefix, key):
    async with arl.Backend.from_url(url, prefix=prefix) as backend:
        @arl.idempotent(key=lambda: key, lease=2.0, backend=backend)
        async def slow():
            print("claimed", flush=True)
            await asyncio.sleep(60)
        await slow()

asyncio.run(main(*sys.argv[1:]))
"""


async def test_sigkilled_process_frees_its_key_after_the_lease(redis_url: str, key: str) -> None:
    """A process killed mid-call (SIGKILL) keeps its key in progress until its lease passes."""
    prefix = f"idem-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, redis_url, prefix, key, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.strip() == b"claimed"
    # Past the child's first renewal (every lease / 3): its record's deadline has moved (a
    # fixed pause could end before the renewal in a loaded child).
    record = _keys.idempotency(_keys.head(prefix, _keys.IDEMPOTENCY_KIND, None), key)[0]
    loop = asyncio.get_running_loop()
    raw = aredis.Redis.from_url(redis_url)
    try:
        claimed = await raw.hget(record, "d")

        async def renewed() -> bool:
            return await raw.hget(record, "d") != claimed

        await until(renewed, what="the child renewing its lease")
    finally:
        await raw.aclose()
    proc.kill()
    await proc.communicate()
    killed = loop.time()
    async with arl.Backend.from_url(redis_url, prefix=prefix) as backend:
        store = IdempotencyStore(backend, lease=2.0)
        first = await store.claim(key)
        assert isinstance(first, InProgress)
        assert first.retry_after <= 2.0
        while isinstance(outcome := await store.claim(key), InProgress):
            assert loop.time() - killed < 2.0 + 5.0
            await asyncio.sleep(0.05)
        assert isinstance(outcome, Claimed)
        assert await store.release(outcome)


def _duplicate_worker(
    url: str, prefix: str, key: str, counter: str, barrier: Any, out: Any
) -> None:
    """One process of the cross-process test: 25 concurrent calls with one key."""

    async def work() -> list[Any]:
        raw = aredis.Redis.from_url(url)
        async with arl.Backend.from_url(url, prefix=prefix) as backend:

            @arl.idempotent(key=lambda: key, lease=5.0, wait=True, backend=backend)
            async def body() -> dict[str, int]:
                runs = await raw.incr(counter)
                await asyncio.sleep(0.3)
                return {"runs": runs, "pid": os.getpid()}

            # Warm-up: connections open and scripts cached before the common start.
            store = IdempotencyStore(backend)
            warm = await store.claim(f"{key}-warm-{os.getpid()}")
            assert isinstance(warm, Claimed)
            await store.release(warm)
            await asyncio.to_thread(barrier.wait, 60)
            try:
                return list(await asyncio.gather(*(body() for _ in range(25))))
            finally:
                await raw.aclose()

    out.put(loops.run(work()))


@pytest.mark.slow
def test_four_processes_run_the_body_once(
    redis_url: str, sync_redis: redis.Redis, key: str
) -> None:
    """100 duplicate calls from 4 processes (spawned) run the body once; all get its result."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    out = ctx.Queue()
    prefix = f"idem-{uuid.uuid4().hex[:8]}"
    counter = f"{prefix}:runs"
    procs = [
        ctx.Process(target=_duplicate_worker, args=(redis_url, prefix, key, counter, barrier, out))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        results = [r for _ in procs for r in out.get(timeout=120)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        out.close()
        out.join_thread()
    assert all(p.exitcode == 0 for p in procs)
    assert int(sync_redis.get(counter) or 0) == 1
    assert len(results) == 100
    assert all(r == results[0] for r in results)
    assert results[0]["runs"] == 1
    sync_redis.delete(
        counter, _keys.idempotency(_keys.head(prefix, _keys.IDEMPOTENCY_KIND, None), key)[0]
    )


async def test_claim_cancelled_after_the_script_ran_frees_the_key(key: str) -> None:
    """A claim cancelled while its reply is in flight releases what it may hold at once."""
    async with arl.Backend.from_url("memory://") as backend:
        inner = backend._run
        ran = asyncio.Event()

        async def slow_reply(script: Any, keys: Any, args: Any) -> Any:
            reply = await inner(script, keys, args)
            if script is _scripts.IDEM_CLAIM and not ran.is_set():
                ran.set()
                await asyncio.sleep(60)  # the reply is "lost" here
            return reply

        backend._run = slow_reply
        store = IdempotencyStore(backend, lease=60.0)
        task = asyncio.create_task(store.claim(key))
        await asyncio.wait_for(ran.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        outcome = await store.claim(key)
        assert isinstance(outcome, Claimed)


async def test_result_is_returned_when_it_cannot_be_stored(
    key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """If storing the result fails, the caller still gets it and the key is released."""
    async with arl.Backend.from_url("memory://") as backend:
        inner = backend._run

        async def no_complete(script: Any, keys: Any, args: Any) -> Any:
            if script is _scripts.IDEM_COMPLETE:
                raise arl.BackendUnavailable("Redis did not answer in time")
            return await inner(script, keys, args)

        backend._run = no_complete
        runs = 0

        @arl.idempotent(key=lambda: key, backend=backend)
        async def work() -> int:
            nonlocal runs
            runs += 1
            return runs

        with caplog.at_level(logging.WARNING, logger="aioratelimit"):
            assert await work() == 1
        assert "was not stored" in caplog.text
        assert await work() == 2  # released: the next call runs again
