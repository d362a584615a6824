"""Batched script calls on every backend: a crowd's decisions exactly as serial calls make
them (one hot key, costs, partial hits, several rates), fewer script calls than decisions on
a server, each caller its own error, NOSCRIPT answered by the batch's EVAL, a server that
refuses batches served one call per decision, a caller cancelled before its batch is
written left out of it, and ``batch=False`` turning it all off."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from support.pace import until
from support.servers import RedisServer

import aioratelimit as arl
from aioratelimit import _scripts
from aioratelimit._stores import cluster as cluster_store
from aioratelimit._stores.batch import BATCH_MAX

Make = Callable[[arl.Backend], Any]

#: Limiters with 10 as their tightest limit, the hits of a crowd deciding them all.
LIMITERS: dict[str, Make] = {
    "fixed": lambda b: arl.FixedWindow("10/minute", backend=b),
    "sliding": lambda b: arl.SlidingWindow("10/minute", backend=b),
    "bucket": lambda b: arl.TokenBucket("10/minute", backend=b),
    "two-rates": lambda b: arl.FixedWindow("10/minute;25/hour", backend=b),
}


@pytest.mark.parametrize("kind", LIMITERS)
async def test_a_crowd_on_one_key_is_decided_as_serial_hits(
    backend: arl.Backend, key: str, kind: str
) -> None:
    """40 concurrent hits on one key: 10 admitted, and their ``remaining`` are 9 down to 0,
    each once, as 40 hits one after another would answer; the denied ones say 0 left."""
    limiter = LIMITERS[kind](backend)
    decisions = await asyncio.gather(*(limiter.hit(key) for _ in range(40)))
    admitted = [d for d in decisions if d.allowed]
    assert sorted(d.remaining for d in admitted) == list(range(10))
    assert all(d.remaining == 0 and d.retry_after > 0 for d in decisions if not d.allowed)
    assert (await limiter.peek(key)).remaining == 0


async def test_costs_and_partial_hits_in_one_crowd_add_up(backend: arl.Backend, key: str) -> None:
    """Hits of cost 3 and partial hits of cost 4 at once on a limit of 20: what is granted
    adds up to the limit exactly, and every admitted hit's ``remaining`` is a distinct
    count left after it (the serial order the batch ran)."""
    limiter = arl.FixedWindow("20/minute", backend=backend)
    calls = [limiter.hit(key, 3) for _ in range(5)] + [
        limiter.hit(key, 4, partial=True) for _ in range(5)
    ]
    decisions = await asyncio.gather(*calls)
    granted = sum(d.granted for d in decisions)
    assert granted == 20
    lefts = sorted(d.remaining for d in decisions if d.allowed)
    assert len(set(lefts)) == len(lefts)
    assert lefts[0] == 0


async def test_distinct_keys_in_one_crowd_each_count_once(backend: arl.Backend, key: str) -> None:
    """Two hits on each of 50 keys (on a Cluster, keys of many slots and every master):
    every key counted twice, no more, no less."""
    limiter = arl.FixedWindow("5/minute", backend=backend)
    keys = [f"{key}-{i}" for i in range(50)]
    first = await asyncio.gather(*(limiter.hit(k) for k in keys * 2))
    assert all(d.allowed for d in first)
    peeks = await asyncio.gather(*(limiter.peek(k) for k in keys))
    assert [p.remaining for p in peeks] == [2] * 50  # (a peek: what one more would leave)


async def test_shadow_mode_the_deny_cache_and_waiting_decide_a_crowd_as_before(
    backend: arl.Backend, key: str
) -> None:
    """A crowd on a shadow limiter is all let through, the ones past the limit marked
    ``shadow_denied``; a crowd on a denied key with a deny cache is refused from it; a
    crowd that waits is admitted ``limit`` at most per window, the rest when a window lets
    them (a 200 ms window)."""
    shadow = arl.FixedWindow("10/minute", shadow=True, backend=backend)
    crowd = await asyncio.gather(*(shadow.hit(key) for _ in range(25)))
    assert all(d.allowed for d in crowd)
    assert sum(d.shadow_denied for d in crowd) == 15

    cached = arl.FixedWindow("5/minute", deny_cache=100, backend=backend)
    first = await asyncio.gather(*(cached.hit(f"{key}-c") for _ in range(8)))
    assert sum(d.allowed for d in first) == 5

    async def cached_crowd() -> bool:  # (once the cache trusts a denial: its subscription)
        again = await asyncio.gather(*(cached.hit(f"{key}-c") for _ in range(8)))
        assert not any(d.allowed for d in again)
        return all(d.source == "cache" for d in again)

    await until(cached_crowd, what="a crowd refused from the deny cache")

    waiting = arl.FixedWindow("4/200ms", backend=backend)
    admitted = await asyncio.gather(
        *(waiting.acquire(f"{key}-w", wait=True, timeout=10) for _ in range(8))
    )
    assert all(d.allowed for d in admitted)
    lefts = [d.remaining for d in admitted]
    assert set(lefts) == {0, 1, 2, 3}  # the first window taken whole, the rest later
    assert lefts.count(0) <= 2
    assert lefts.count(3) >= 2


# -- on a server: how many calls, errors, NOSCRIPT, refusals, cancellation ------------------


def evalsha_calls(client: redis.Redis) -> int:
    """The EVALSHA and EVAL calls the server has run (INFO commandstats)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


@pytest.fixture
def server(own_redis: RedisServer) -> Iterator[redis.Redis]:
    with own_redis.client() as client:
        yield client


async def crowd(backend: arl.Backend, key: str, n: int = 64) -> list[arl.Decision]:
    """``n`` hits at once on 16 keys (the connection open first: all in one iteration)."""
    limiter = arl.FixedWindow("1000/minute", backend=backend)
    await limiter.peek(key)
    return await asyncio.gather(*(limiter.hit(f"{key}-{i % 16}") for i in range(n)))


async def warm(backend: arl.Backend, key: str) -> None:
    """Connected, and the scripts loaded on the server (no NOSCRIPT in what follows)."""
    await crowd(backend, f"{key}-warm", 3)


@pytest.mark.parametrize("batch", [True, False])
async def test_a_crowd_goes_in_few_calls_unless_turned_off(
    own_redis: RedisServer, server: redis.Redis, key: str, batch: bool
) -> None:
    """200 hits issued together: the first is written at once, alone, and the others in
    batches of at most ``BATCH_MAX``; with ``batch=False``, one call each."""
    async with arl.Backend.from_url(own_redis.url, batch=batch) as backend:
        await warm(backend, key)
        before = evalsha_calls(server)
        decisions = await crowd(backend, key, 200)
        calls = evalsha_calls(server) - before - 1  # (the peek)
    assert all(d.allowed for d in decisions)
    assert BATCH_MAX == 32  # (the bound docs/performance.md states)
    assert calls == (1 + 7 if batch else 200)  # 199 = 6 x 32 + 7


async def test_an_error_in_one_decision_fails_its_caller_only(
    own_redis: RedisServer, server: redis.Redis, key: str
) -> None:
    """One key of a batch holds a hash (WRONGTYPE inside its script): its caller gets
    ``BackendError``; the others in the same call are decided and counted."""
    async with arl.Backend.from_url(own_redis.url) as backend:
        limiter = arl.FixedWindow("10/minute", backend=backend)
        await limiter.hit(f"{key}-bad")
        (counter,) = [k for k in server.scan_iter(match=f"*{key}-bad*")]
        server.delete(counter)
        server.hset(counter, "field", "1")
        await warm(backend, key)
        before = evalsha_calls(server)
        results = await asyncio.gather(
            *(limiter.hit(k) for k in [f"{key}-a", f"{key}-b", f"{key}-bad", f"{key}-c"]),
            return_exceptions=True,
        )
        assert evalsha_calls(server) - before == 2  # the first alone, three in one batch
        assert isinstance(results[2], arl.BackendError)
        assert "WRONGTYPE" in str(results[2])
        assert [r.remaining for r in results if isinstance(r, arl.Decision)] == [9, 9, 9]


async def test_a_flushed_batch_script_is_loaded_by_its_eval(
    own_redis: RedisServer, server: redis.Redis, key: str
) -> None:
    """After SCRIPT FLUSH, the next batch answers NOSCRIPT as a whole (nothing ran): it is
    sent once more as EVAL, and every hit counts once."""
    async with arl.Backend.from_url(own_redis.url) as backend:
        await crowd(backend, key, 16)
        server.script_flush()
        evals = server.info("commandstats").get("cmdstat_eval", {}).get("calls", 0)
        decisions = await crowd(backend, key, 16)
    assert sorted(d.remaining for d in decisions) == [998] * 16
    # Two EVALs: the peek's script, then the batch's (15 hits; the first went alone, and
    # found its script loaded by the peek's EVAL).
    assert server.info("commandstats")["cmdstat_eval"]["calls"] - evals == 2


async def test_a_caller_cancelled_before_its_batch_is_written_is_left_out(
    own_redis: RedisServer, key: str
) -> None:
    """Three hits issued together, the second cancelled before the iteration's end (when
    its batch is written): two counted, not three."""
    async with arl.Backend.from_url(own_redis.url) as backend:
        limiter = arl.FixedWindow("10/minute", backend=backend)
        await warm(backend, key)
        tasks = [asyncio.ensure_future(limiter.hit(key)) for _ in range(3)]
        await asyncio.sleep(0)  # each task ran to its reply's future
        tasks[1].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[1], asyncio.CancelledError)
        assert (await limiter.peek(key)).remaining == 10 - 2 - 1  # (a peek: one more)


async def test_a_cluster_refusing_batches_is_served_call_by_call(
    cluster_url: str, key: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch whose keys span slots without saying so (the script flag a Cluster needs, as
    a server or proxy that refuses such scripts would answer) fails whole with CROSSSLOT:
    each decision is then sent alone and succeeds, and that node's batching is turned off,
    with a warning."""
    monkeypatch.setattr(cluster_store, "BATCH_CLUSTER", _scripts.BATCH)
    caplog.set_level(logging.WARNING, logger="aioratelimit")
    async with arl.Backend.from_url(cluster_url) as backend:
        limiter = arl.FixedWindow("5/minute", backend=backend)
        keys = [f"{key}-{i}" for i in range(60)]
        await limiter.peek(keys[0])
        decisions = await asyncio.gather(*(limiter.hit(k) for k in keys))
        assert [d.remaining for d in decisions] == [4] * 60
        refusals = caplog.text.count("refuses batched script calls")
        assert 1 <= refusals <= 3  # once per master that got a batch
        again = await asyncio.gather(*(limiter.hit(k) for k in keys))
        assert [d.remaining for d in again] == [3] * 60
    assert caplog.text.count("refuses batched script calls") == refusals  # (no batch since)


async def test_the_option_is_checked() -> None:
    with pytest.raises(TypeError, match="batch must be True or False"):
        arl.Backend.from_url("redis://localhost", batch=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("script", _scripts.BATCHED, ids=lambda s: s.name)
def test_a_batched_script_keeps_the_contract(script: _scripts.Script) -> None:
    """What ``batch.lua`` relies on (docs/performance.md): no write to ``KEYS`` or ``ARGV``
    (a group shares them), and the clock read only as ``redis.call('TIME')``, which the
    batch replaces by its one reading."""
    code = "\n".join(line.split("--", 1)[0] for line in script.source.splitlines())
    assert not re.search(r"\b(KEYS|ARGV)\[[^]]*\]\s*=[^=]", code)
    assert not re.search(r"table\.(insert|remove)\(\s*(KEYS|ARGV)", code)
    assert len(re.findall(r"""['"]TIME['"]""", code)) == code.count("redis.call('TIME')")
    # batch.lua hands the first three (LIMITERS) their numeric arguments as numbers.
    assert [s.name for s in _scripts.BATCHED[:3]] == [
        "fixed_window",
        "sliding_window",
        "token_bucket",
    ]
    batch = "\n".join(line.split("--", 1)[0] for line in _scripts.BATCH.source.splitlines())
    assert batch.count("redis.call('TIME')") == 1  # batch_head's
