"""Redis Cluster and Sentinel specifics, on real deployments (tests/support/cluster_fixtures.py).

The conformance suites already run every primitive on both (the ``backend`` fixture); this
file pins down what only a multi-node deployment has: URL parsing, wrapping a client the
application built, bounded concurrency against redis-py's fail-fast per-node pools, NOSCRIPT
answered on the node that owns the keys, MOVED/ASK during a slot migration, sharded
pub/sub wake-ups that follow their slot, and keys spread evenly over the masters.
"""

from __future__ import annotations

import asyncio
import collections
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from support.cluster_fixtures import RedisClusterDeployment, sync_client
from support.servers import free_port

import aioratelimit as arl
from aioratelimit._scripts import FIXED_WINDOW, script
from aioratelimit._stores.cluster import ClusterStore
from aioratelimit._stores.cluster_pubsub import ShardedPubSub
from aioratelimit._stores.urls import parse_hosts

#: A test-only script that wakes waiters the way the lock and idempotency scripts do:
#: with the backend's publish command, on a channel that carries the keys' hash tag.
_PUBLISH_SOURCE = """\
-- KEYS[1] a key with the channel's hash tag; ARGV[1] publish command; ARGV[2] channel
redis.call('SET', KEYS[1], '1', 'PX', 60000)
return redis.call(ARGV[1], ARGV[2], 'wake')
"""
PUBLISH = script("test_publish", _PUBLISH_SOURCE)


def _addresses(url: str) -> list[tuple[str, int]]:
    return parse_hosts(url.partition("://")[2].partition("/")[0], 0)[0]


def raw_cluster(url: str, **options: Any) -> RedisCluster:
    """A plain redis-py asyncio cluster client on the nodes of a redis+cluster:// URL."""
    nodes = [ClusterNode(host, port) for host, port in _addresses(url)]
    return RedisCluster(startup_nodes=nodes, **options)


async def publish(backend: arl.Backend, tag: str, channel: str) -> None:
    await backend._run(PUBLISH, [f"arl:test:{{{tag}}}"], [backend._publish_command, channel])


def user_key_in_slot(slot: int) -> str:
    """A fresh user key whose hash tag falls in ``slot``."""
    while True:
        candidate = f"k-{uuid.uuid4().hex[:10]}"
        if key_slot(candidate.encode()) == slot:
            return candidate


@pytest.fixture
async def cluster_backend(cluster_url: str) -> AsyncIterator[arl.Backend]:
    """A backend on the shared cluster."""
    backend = arl.Backend.from_url(cluster_url)
    try:
        yield backend
    finally:
        await backend.aclose()


# -- URLs and clients ----------------------------------------------------------------------


def test_cluster_url_lists_startup_nodes() -> None:
    """A redis+cluster:// URL becomes a RedisCluster with every listed host as startup node."""
    backend = arl.Backend.from_url("redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2,[::1]:7002")
    store = backend._store
    assert isinstance(store, ClusterStore)
    client = store.cluster
    assert isinstance(client, RedisCluster)
    names = {node.name for node in client.startup_nodes}
    assert names == {"10.0.0.1:7000", "10.0.0.2:6379", "::1:7002"}
    assert client.get_connection_kwargs()["password"] == "p@ss"
    assert backend._publish_command == "SPUBLISH"


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",
        "redis+cluster://h:1/0",
        "redis+cluster://h:1?x=1",
        "redis+cluster://h:99999",
        "redis+cluster://h:port",
        "redis+sentinel://h:26379",
        "redis+sentinel://h:26379/",
        "redis+sentinel://h:26379/a/b",
    ],
)
def test_malformed_multi_node_urls_raise_value_error(url: str) -> None:
    """A cluster URL without hosts or with a path, or a sentinel URL without a service, is
    rejected before any I/O."""
    with pytest.raises(ValueError, match=r"URL|host|port"):
        arl.Backend.from_url(url)


async def test_sentinel_url_builds_a_master_client(sentinel_url: str) -> None:
    """A redis+sentinel:// URL reaches the master its sentinels name, and publishes with
    plain PUBLISH."""
    backend = arl.Backend.from_url(sentinel_url)
    try:
        limiter = arl.FixedWindow("2/minute", backend=backend)
        key = uuid.uuid4().hex
        assert [(await limiter.hit(key)).allowed for _ in range(3)] == [True, True, False]
        assert backend._publish_command == "PUBLISH"
    finally:
        await backend.aclose()


async def test_backend_wraps_an_application_cluster_client(cluster_url: str) -> None:
    """Backend(RedisCluster) works, and aclose() leaves the application's client open."""
    client = raw_cluster(cluster_url)
    try:
        backend = arl.Backend(client)
        assert isinstance(backend._store, ClusterStore)
        limiter = arl.FixedWindow("3/minute", backend=backend)
        key = uuid.uuid4().hex
        assert [(await limiter.hit(key)).remaining for _ in range(3)] == [2, 1, 0]
        await backend.aclose()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_backend_wraps_an_application_sentinel_master_client(sentinel_url: str) -> None:
    """Backend(Sentinel(...).master_for(service)) works and leaves the client open."""
    from redis.asyncio.sentinel import Sentinel

    service = sentinel_url.rsplit("/", 1)[1]
    sentinel = Sentinel(_addresses(sentinel_url))
    client = sentinel.master_for(service)
    try:
        backend = arl.Backend(client)
        limiter = arl.TokenBucket("2/minute", backend=backend)
        key = uuid.uuid4().hex
        assert [(await limiter.hit(key)).allowed for _ in range(3)] == [True, True, False]
        await backend.aclose()
        assert await client.ping()
    finally:
        await client.aclose()
        await sentinel.aclose()


# -- bounded concurrency and NOSCRIPT ------------------------------------------------------


async def test_raw_redis_cluster_fails_fast_past_its_pool(cluster_url: str) -> None:
    """The problem we fix: 256 concurrent EVALSHA on redis-py's RedisCluster with 4
    connections per node raise MaxConnectionsError instead of waiting."""
    client = raw_cluster(cluster_url, max_connections=4)
    try:
        await client.initialize()
        await client.eval(FIXED_WINDOW.source, 1, "arl:probe:{x}", 1, 1, 10, 60_000_000)

        async def one(i: int) -> str:
            try:
                await client.evalsha(FIXED_WINDOW.sha, 1, f"arl:raw:{{{i}}}", 1, 1, 10, 60_000_000)
            except redis.exceptions.NoScriptError:
                return "noscript"
            except redis.exceptions.MaxConnectionsError:
                return "max"
            return "ok"

        outcomes = collections.Counter(await asyncio.gather(*(one(i) for i in range(256))))
    finally:
        await client.aclose()
    assert outcomes["max"] > 0, outcomes


@pytest.mark.parametrize("wrapped", [False, True], ids=["from_url", "Backend(client)"])
async def test_calls_past_the_pool_size_queue_instead_of_failing(
    cluster_url: str, wrapped: bool
) -> None:
    """With 4 connections per node, 300 concurrent hits all succeed: callers queue."""
    client = raw_cluster(cluster_url, max_connections=4) if wrapped else None
    backend = (
        arl.Backend(client) if client is not None else
        arl.Backend.from_url(cluster_url, max_connections=4)
    )  # fmt: skip
    try:
        limiter = arl.FixedWindow("1000/minute", backend=backend)
        keys = [uuid.uuid4().hex for _ in range(300)]
        decisions = await asyncio.gather(*(limiter.hit(k) for k in keys))
        assert all(d.allowed for d in decisions)
    finally:
        await backend.aclose()
        if client is not None:
            await client.aclose()


async def test_concurrent_first_calls_after_script_flush_all_succeed(cluster_url: str) -> None:
    """redis/redis-py#3935: 1024 concurrent first calls on a fresh client, with no script
    cached on any node, all succeed (one discovery, NOSCRIPT answered by EVAL)."""
    with sync_client(cluster_url) as admin:
        admin.execute_command("SCRIPT FLUSH", target_nodes=redis.RedisCluster.PRIMARIES)
    client = raw_cluster(cluster_url)  # not initialized: the first calls race for it
    backend = arl.Backend(client)
    try:
        limiter = arl.SlidingWindow("5/minute", backend=backend)
        keys = [uuid.uuid4().hex[:8] for _ in range(1024)]
        decisions = await asyncio.gather(*(limiter.hit(k) for k in keys))
        assert all(d.allowed for d in decisions)
    finally:
        await backend.aclose()
        await client.aclose()


async def test_noscript_loads_the_script_on_the_node_owning_the_keys(
    cluster_backend: arl.Backend, cluster_url: str
) -> None:
    """After SCRIPT FLUSH everywhere, one hit caches its script on its key's master only."""
    with sync_client(cluster_url) as admin:
        admin.execute_command("SCRIPT FLUSH", target_nodes=redis.RedisCluster.PRIMARIES)
        key = uuid.uuid4().hex
        assert (await arl.FixedWindow("2/minute", backend=cluster_backend).hit(key)).allowed
        owner = admin.get_node_from_key(key)
        cached = {
            node.name: admin.execute_command("SCRIPT EXISTS", FIXED_WINDOW.sha, target_nodes=node)
            for node in admin.get_primaries()
        }
    assert {name for name, flags in cached.items() if flags[0]} == {owner.name}


async def test_any_cluster_failure_is_backend_unavailable() -> None:
    """No reachable node (RedisClusterException in redis-py) surfaces as BackendUnavailable,
    the original error chained."""
    backend = arl.Backend.from_url(
        f"redis+cluster://127.0.0.1:{free_port()}", timeout=1.0, connect_timeout=0.5
    )
    try:
        with pytest.raises(arl.BackendUnavailable) as caught:
            await arl.FixedWindow("1/second", backend=backend).hit("k")
        assert caught.value.__cause__ is not None
    finally:
        await backend.aclose()


# -- sharded pub/sub -----------------------------------------------------------------------


async def test_sharded_wake_up_reaches_waiters_on_every_master(
    cluster_backend: arl.Backend,
) -> None:
    """Waiters on 30 channels spread over the three masters are each woken by a script's
    SPUBLISH, through one subscriber connection per master."""
    tags = [uuid.uuid4().hex[:10] for _ in range(30)]
    channels = {tag: f"arl:test:{{{tag}}}:wake" for tag in tags}
    notifier = cluster_backend._notifier
    subs = [notifier.subscribe(channels[tag]) for tag in tags]
    for sub in subs:
        await sub.__aenter__()
    try:
        pubsub = notifier._pubsub
        assert isinstance(pubsub, ShardedPubSub)
        assert len(pubsub._nodes) == 3
        for tag in tags:
            await publish(cluster_backend, tag, channels[tag])
        woken = await asyncio.gather(*(sub.wait(10.0) for sub in subs))
        assert all(woken)
    finally:
        for sub in subs:
            await sub.__aexit__(None, None, None)


async def test_plain_publish_wakes_waiters_through_sentinel(sentinel_url: str) -> None:
    """On a Sentinel master the subscriber follows the master, and PUBLISH wakes it."""
    backend = arl.Backend.from_url(sentinel_url)
    try:
        tag = uuid.uuid4().hex
        channel = f"arl:test:{{{tag}}}:wake"
        async with backend._notifier.subscribe(channel) as sub:
            await publish(backend, tag, channel)
            assert await sub.wait(10.0)
    finally:
        await backend.aclose()


# -- slot migration: ASK while it runs, MOVED after ---------------------------------------


def _node_id(port: int) -> str:
    with redis.Redis(port=port) as client:
        return str(client.execute_command("CLUSTER", "MYID").decode())


def _migrate_slot(cluster: RedisClusterDeployment, slot: int, source: int, target: int) -> None:
    """Move every key of ``slot`` from ``source`` to ``target`` and assign it there."""
    target_id = _node_id(target)
    with redis.Redis(port=source) as src:
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
    for port in cluster.master_ports():
        with redis.Redis(port=port) as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


async def test_slot_migration_ask_then_moved(own_cluster: RedisClusterDeployment) -> None:
    """While a slot migrates, new keys go to the importing node (ASK) and old keys stay
    served; once it has moved, calls follow it (MOVED) with the counts intact, and a
    waiter subscribed on the old owner is woken on the new one."""
    backend = arl.Backend.from_url(own_cluster.url)
    try:
        key = uuid.uuid4().hex
        slot = key_slot(key.encode())
        source = own_cluster.master_for_slot(slot)
        target = next(p for p in own_cluster.master_ports() if p != source)
        limiter = arl.FixedWindow("10/hour", backend=backend)
        assert [(await limiter.hit(key)).remaining for _ in range(3)] == [9, 8, 7]
        channel = f"arl:test:{{{key}}}:wake"
        async with backend._notifier.subscribe(channel) as sub:
            with redis.Redis(port=target) as t, redis.Redis(port=source) as s:
                t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
                s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))
            fresh = [user_key_in_slot(slot) for _ in range(20)]
            during = await asyncio.gather(
                *(limiter.hit(k) for k in fresh), *(limiter.hit(key) for _ in range(2))
            )
            assert all(d.allowed for d in during)
            _migrate_slot(own_cluster, slot, source, target)
            after = await asyncio.gather(*(limiter.hit(k) for k in fresh))
            assert {d.remaining for d in after} == {8}
            assert (await limiter.hit(key)).remaining == 4
            # The server dropped the subscription on the old owner; the notifier
            # subscribes again on the new one. Publish until the waiter hears it.
            for _ in range(100):
                await publish(backend, key, channel)
                if await sub.wait(0.2):
                    break
            else:
                pytest.fail("the waiter was never woken after the slot moved")
    finally:
        await backend.aclose()


# -- no hot slot ---------------------------------------------------------------------------


async def test_ten_thousand_keys_spread_evenly_over_the_masters(cluster_url: str) -> None:
    """10,000 distinct user keys land on all three masters, each within +-20 % of a third
    (counted on the servers after real hits, not computed)."""
    prefix = f"spread{uuid.uuid4().hex[:6]}"
    backend = arl.Backend.from_url(cluster_url, prefix=prefix)
    try:
        limiter = arl.FixedWindow("5/minute", backend=backend)
        sem = asyncio.Semaphore(64)

        async def hit(i: int) -> None:
            async with sem:
                await limiter.hit(f"user-{i}")

        await asyncio.gather(*(hit(i) for i in range(10_000)))
        counts: dict[str, int] = {}
        with sync_client(cluster_url) as admin:
            for node in admin.get_primaries():
                client = admin.get_redis_connection(node)
                counts[node.name] = sum(
                    1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000)
                )
    finally:
        await backend.aclose()
    assert sum(counts.values()) == 10_000
    assert len(counts) == 3
    share = 10_000 / 3
    assert all(0.8 * share <= n <= 1.2 * share for n in counts.values()), counts


def test_the_cluster_runs_the_server_the_lane_names(cluster_url: str) -> None:
    """The shared cluster's nodes are the server the lane asks for: Valkey in the valkey
    lane (``AIORATELIMIT_TEST_SERVER=valkey``), Redis elsewhere, so a lane that claims a
    server cannot quietly run another."""
    host, port = cluster_url.partition("://")[2].split(",")[0].rsplit(":", 1)
    node = redis.Redis(host=host, port=int(port), protocol=2)
    try:
        hello = node.execute_command("HELLO")
    finally:
        node.close()
    fields = dict(zip(hello[::2], hello[1::2], strict=True))
    wanted = b"valkey" if os.environ.get("AIORATELIMIT_TEST_SERVER") == "valkey" else b"redis"
    assert fields[b"server"] == wanted, fields
