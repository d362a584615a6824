"""Redis Cluster: the store that runs scripts on the master owning their keys, and the
subscriber that listens on it.

Every script's keys share one hash tag (``_keys``), so each call goes to exactly one master.
``ClusterStore`` keeps redis-py's ``RedisCluster`` for the topology (slot map, per-node
connection pools, rediscovery) and adds what the library promises on every backend:

- one round trip on the usual path: EVALSHA straight to the node the slot map names (redis-py's
  own routing resolves a command policy and the slot on every call: about 13 % slower);
- a bounded number of calls in flight, queued rather than failed: redis-py's per-node pool
  raises ``MaxConnectionsError`` at once when it is exhausted; the gate inherited from
  ``RedisStore`` lets at most ``max_connections`` calls in, so no node's pool ever runs out;
- one explicit ``initialize()`` before the first call (concurrent first calls on a fresh
  client raced each other in redis-py, redis/redis-py#3935);
- NOSCRIPT answered by EVAL on the node that reported it, which caches the script there;
- ASK (a slot migrating) answered with ASKING and the script on one connection of the
  importing node; MOVED, a refused connection or TRYAGAIN through ``RedisCluster`` itself,
  which repairs its slot map; a timeout or CLUSTERDOWN not retried (the script may have run),
  the map refreshed in the background;
- every failure as ``BackendUnavailable``: the cluster client also raises exceptions outside
  ``RedisError`` (``RedisClusterException`` when no node answers, and internal errors under
  races), so here any exception of the client call is translated, with its cause chained.

Wake-ups use sharded pub/sub (Redis >= 7.0, which the scripts need anyway): scripts
``SPUBLISH`` on a channel that carries the hash tag of their keys (``backend.publish_command``),
so a message stays inside the shard that owns it, and ``_ShardedPubSub`` holds one dedicated
connection (outside the pool) per master that owns a channel someone waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from redis import exceptions as redis_errors
from redis.crc import key_slot

from ._backend import RedisStore, _unavailable
from ._connections import close_without_loop, exchange
from ._memory import Arg, Reply
from ._notify import Notifier
from ._scripts import Script

log = logging.getLogger("aioratelimit")

Address = tuple[str, int]

#: How long a node whose subscriber connection failed is avoided when subscribing anew.
SUSPECT_FOR = 5.0


def parse_hosts(netloc: str, default_port: int) -> tuple[list[Address], str | None, str | None]:
    """``[user[:password]@]host[:port][,host[:port]...]`` to (hosts, username, password)."""
    username = password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, sep, pw = auth.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    hosts: list[Address] = []
    for part in netloc.split(","):
        part = part.strip()
        if not part:
            continue
        host, port = part, default_port
        if part.startswith("["):  # [ipv6]:port
            host, _, rest = part[1:].partition("]")
            if rest.startswith(":"):
                port = _port(rest[1:], part)
        elif part.count(":") == 1:
            host, raw = part.split(":")
            port = _port(raw, part)
        hosts.append((host, port))
    if not hosts:
        raise ValueError("the URL names no host")
    return hosts, username, password


def _port(raw: str, part: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"bad port in {part!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port in {part!r}")
    return port


def cluster_store(
    url: str, *, max_connections: int, timeout: float, connect_timeout: float, **options: Any
) -> ClusterStore:
    """The store for a ``redis+cluster://host:port[,host:port...]`` URL (it owns its client)."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    parts = urlsplit(url)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("a redis+cluster:// URL is only hosts: redis+cluster://host:port,...")
    hosts, username, password = parse_hosts(parts.netloc, 6379)
    # On MOVED, patch the one slot: a full rediscovery would close connections that other
    # calls are using (and redis-py would retry their scripts: a hit counted twice).
    options.setdefault("reinitialize_steps", 0)
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in hosts],
        username=username,
        password=password,
        max_connections=max_connections,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        **options,
    )
    return ClusterStore(client, owned=True, max_calls=max_connections, gate_timeout=timeout)


class ClusterStore(RedisStore):
    """Runs scripts by EVALSHA on a ``redis.asyncio.RedisCluster``, bounded and translated."""

    __slots__ = ("_cluster", "_hints", "_ready", "_ready_lock", "_refresh", "_suspects")

    #: Scripts publish wake-ups with this command: shard-local on a cluster.
    publish_command = "SPUBLISH"

    def __init__(self, client: Any, *, owned: bool, max_calls: int, gate_timeout: float) -> None:
        super().__init__(client, owned=owned, max_calls=max_calls, gate_timeout=gate_timeout)
        self._cluster: Any = client  # the RedisCluster API beyond the _ScriptClient slice
        self._ready = False
        self._ready_lock: asyncio.Lock | None = None
        self._refresh: asyncio.Task[None] | None = None
        # For the subscriber: the master a MOVED named for a slot, and nodes that just failed.
        self._hints: dict[int, Address] = {}
        self._suspects: dict[Address, float] = {}

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        gate = self._gate
        assert gate is not None
        if gate.free:
            gate.free -= 1
        else:
            await gate.wait(self._gate_timeout)
        try:
            if not self._ready:
                await self.ready()
            try:
                node = self._cluster.get_node_from_key(keys[0])
                return await _on_node(node, script, keys, args)
            except (redis_errors.TimeoutError, redis_errors.ClusterDownError):
                # The node is slow or frozen, or the cluster is failing over. No retry here:
                # the script may have run (a retry could count a hit twice). The slot map
                # is refreshed in the background, so calls find the promoted master.
                self._rediscover()
                raise
            except redis_errors.AskError as exc:
                if isinstance(exc, redis_errors.MovedError):
                    return await self._routed(script, keys, args)
                return await self._asking(exc, script, keys, args)
            except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError) as exc:
                if isinstance(exc, redis_errors.ResponseError) and not isinstance(
                    exc, redis_errors.TryAgainError
                ):
                    raise  # the script itself failed: the same call would fail again
                # MOVED, a connection refused or reset, TRYAGAIN, a slot not in the map:
                # redis-py's own routing repairs its slot map and retries, within `timeout`.
                return await self._routed(script, keys, args)
        except Exception as exc:
            # Also RedisClusterException and redis-py internals: none may escape untranslated.
            raise _unavailable(exc) from exc
        finally:
            gate.leave()

    async def _routed(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        """The call through ``RedisCluster`` itself: slower, but it follows MOVED, rediscovers
        the topology after a connection error and retries; bounded by ``timeout``."""
        client = self._cluster

        async def call() -> Reply:
            try:
                return await client.evalsha(script.sha, len(keys), *keys, *args)
            except redis_errors.NoScriptError:
                # EVAL with the same keys goes to the same master, which caches the script.
                return await client.eval(script.source, len(keys), *keys, *args)

        # Not asyncio.wait_for: before Python 3.12 it may swallow the caller's cancellation.
        task = asyncio.ensure_future(call())
        try:
            done, _ = await asyncio.wait((task,), timeout=self._gate_timeout)
        except BaseException:
            task.cancel()
            raise
        if not done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise asyncio.TimeoutError(f"no answer within {self._gate_timeout} s")
        return task.result()

    def _rediscover(self) -> None:
        """Refresh the slot map from the cluster in the background, one refresh at a time."""
        task = self._refresh
        if task is None or task.done():
            self._refresh = asyncio.get_running_loop().create_task(self._rediscovery())

    async def _rediscovery(self) -> None:
        try:
            await self._cluster.nodes_manager.initialize()
        except Exception as exc:  # the next failing call tries again
            log.debug("aioratelimit: cluster rediscovery failed: %r", exc)

    async def _asking(
        self, ask: redis_errors.AskError, script: Script, keys: Sequence[str], args: Sequence[Arg]
    ) -> Reply:
        """The slot is migrating and the keys are already on the importing node: send ASKING
        and the script there on ONE connection (ASKING holds for that connection's next
        command only; redis-py sends the two on whichever connections its pool hands out)."""
        target = self._cluster.get_node(host=ask.host, port=int(ask.port))
        if target is None:
            return await self._routed(script, keys, args)
        reply = await _asking_on(target, "EVALSHA", script.sha, keys, args)
        if isinstance(reply, redis_errors.NoScriptError):
            reply = await _asking_on(target, "EVAL", script.source, keys, args)
        if isinstance(reply, redis_errors.AskError):  # the migration moved on meanwhile
            return await self._routed(script, keys, args)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def ready(self) -> None:
        """Discover the cluster once, before any command (never concurrently)."""
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            if not self._ready:
                await self._cluster.initialize()
                self._ready = True

    # -- what the subscriber needs -----------------------------------------------------------

    async def owner(self, channel: str) -> Address:
        """The master to SSUBSCRIBE ``channel`` on: the last MOVED for its slot, else the map."""
        if not self._ready:
            await self.ready()
        hint = self._hints.get(key_slot(channel.encode()))
        if hint is not None:
            return hint
        node = self._cluster.get_node_from_key(channel)
        return (node.host, int(node.port))

    def candidates(self, first: Address) -> list[Address]:
        """``first``, then every other known node; nodes that just failed go last."""
        now = time.monotonic()
        known = [first] + [
            (n.host, int(n.port))
            for n in self._cluster.get_nodes()
            if (n.host, int(n.port)) != first
        ]
        fresh = [a for a in known if self._suspects.get(a, 0.0) < now]
        stale = [a for a in known if a not in fresh]
        return fresh + stale

    @property
    def cluster(self) -> Any:
        return self._cluster

    def moved(self, slot: int, address: Address) -> None:
        self._hints[slot] = address

    def suspect(self, address: Address) -> None:
        self._suspects[address] = time.monotonic() + SUSPECT_FOR

    @property
    def notifier(self) -> Notifier:
        """One subscriber connection per master that owns a channel someone waits on."""
        if self._notifier is None:
            self._notifier = Notifier(lambda: _ShardedPubSub(self))
        return self._notifier

    async def aclose(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(BaseException):
                await self._refresh
        if self._notifier is not None:
            await self._notifier.aclose()
        if self._owned:
            client = self._cluster
            await client.aclose()
            # RedisCluster.aclose() does nothing while the client is marked for rediscovery
            # (after a connection error), yet its nodes may hold open connections.
            manager = client.nodes_manager
            await manager.aclose("nodes_cache")
            await manager.aclose("startup_nodes")


class _ShardedPubSub:
    """The Notifier's subscriber on a cluster: SSUBSCRIBE each channel on the master that owns
    its slot, over one dedicated connection per master, read by one task per connection.

    Any failure (a node gone, a MOVED, a slot migrated away under a subscription) surfaces
    from ``get_message``; the Notifier then builds a new subscriber and subscribes every
    channel again, which follows the MOVED hints and avoids the nodes that just failed.
    """

    def __init__(self, store: ClusterStore) -> None:
        self._store = store
        self._nodes: dict[Address, Any] = {}  # redis.asyncio PubSub per master
        self._readers: dict[Address, asyncio.Task[None]] = {}
        self._where: dict[str, Address] = {}
        self._leaving: set[str] = set()
        self._inbox: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue()
        self._closed = False

    @property
    def subscribed(self) -> bool:
        return bool(self._where)

    async def subscribe(self, channel: str) -> None:
        error: BaseException | None = None
        for address in self._store.candidates(await self._store.owner(channel)):
            try:
                pubsub = self._node(address)
                await pubsub.ssubscribe(channel)
                if self._nodes.get(address) is not pubsub:
                    # Dropped (or this subscriber closed) while it connected: a socket that
                    # opened after the drop would leak, and nobody reads it.
                    await _close_pubsub(pubsub)
                    raise redis_errors.ConnectionError("the subscriber was closed meanwhile")
                if address not in self._readers:
                    reader = asyncio.get_running_loop().create_task(self._read(address, pubsub))
                    self._readers[address] = reader
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
                # Try another node: it will answer MOVED to the current owner.
                self._store.suspect(address)
                await self._drop(address)
                error = exc
                continue
            self._where[channel] = address
            self._leaving.discard(channel)
            return
        raise redis_errors.ConnectionError(f"no cluster node took SSUBSCRIBE: {error!r}")

    async def unsubscribe(self, channel: str) -> None:
        address = self._where.pop(channel, None)
        pubsub = self._nodes.get(address) if address is not None else None
        if pubsub is not None:
            self._leaving.add(channel)
            await pubsub.sunsubscribe(channel)

    async def get_message(
        self, *, ignore_subscribe_messages: bool, timeout: float
    ) -> dict[str, Any] | None:
        if self._inbox.empty():
            getter = asyncio.ensure_future(self._inbox.get())
            try:
                await asyncio.wait((getter,), timeout=timeout)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.cancelled() or not getter.done():
                return None
            item = getter.result()
        else:
            item = self._inbox.get_nowait()
        if isinstance(item, BaseException):
            raise item
        kind = item.get("type")
        if kind in ("sunsubscribe", b"sunsubscribe"):
            channel = _text(item.get("channel"))
            if channel in self._leaving:
                self._leaving.discard(channel)
            elif channel in self._where:
                # Not asked for: the slot moved to another master under the subscription.
                raise redis_errors.ConnectionError(f"the slot of {channel!r} moved")
            return None
        if ignore_subscribe_messages and kind in ("ssubscribe", b"ssubscribe"):
            return None
        return item

    def _node(self, address: Address) -> Any:
        if self._closed:
            raise redis_errors.ConnectionError("the subscriber is closed")
        pubsub = self._nodes.get(address)
        if pubsub is None:
            pubsub = _dedicated_pubsub(self._store.cluster, address)
            self._nodes[address] = pubsub
        return pubsub

    async def _read(self, address: Address, pubsub: Any) -> None:
        """Forward one node's messages (or the error that ends them) to the inbox."""
        try:
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=False, timeout=None)
                if msg is not None:
                    self._inbox.put_nowait(msg)
        except asyncio.CancelledError:
            raise
        except redis_errors.MovedError as exc:
            self._store.moved(exc.slot_id, (exc.host, int(exc.port)))
            self._inbox.put_nowait(exc)
        except Exception as exc:
            self._store.suspect(address)
            self._inbox.put_nowait(exc)

    async def _drop(self, address: Address) -> None:
        reader = self._readers.pop(address, None)
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        pubsub = self._nodes.pop(address, None)
        if pubsub is not None:
            await _close_pubsub(pubsub)

    def abandon(self) -> None:
        """Close every node's connection of an event loop that has ended, without it."""
        self._closed = True
        for pubsub in self._nodes.values():
            conn = getattr(pubsub, "connection", None)
            if conn is not None:
                close_without_loop(conn)
        self._nodes.clear()
        self._readers.clear()
        self._where.clear()

    async def aclose(self) -> None:
        self._closed = True
        for address in list(self._nodes):
            await self._drop(address)
        self._where.clear()


async def _on_node(node: Any, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
    """EVALSHA on one connection of the node the slot map names (NOSCRIPT: EVAL on it),
    written pre-packed (``_connections.exchange``) rather than by ``node.execute_command``.
    The store's gate keeps the calls in flight within the node's connection limit."""
    conn = node.acquire_connection()
    try:
        return await exchange(conn, script, keys, args)
    finally:
        node.release(conn)


async def _asking_on(
    node: Any, command: str, body: str, keys: Sequence[str], args: Sequence[Arg]
) -> Any:
    """``ASKING`` then one script command, pipelined on one connection of ``node``; the
    script's reply, or the exception it answered with."""
    from redis.asyncio.cluster import PipelineCommand

    commands = [
        PipelineCommand(0, "ASKING"),
        PipelineCommand(1, command, body, len(keys), *keys, *args),
    ]
    await node.execute_pipeline(commands)
    if isinstance(commands[0].result, BaseException):
        return commands[0].result
    return commands[1].result


async def _close_pubsub(pubsub: Any) -> None:
    """Close a dedicated PubSub and the one-connection pool under it."""
    with contextlib.suppress(Exception):
        await pubsub.aclose()
    with contextlib.suppress(Exception):
        await pubsub.connection_pool.disconnect()


def _dedicated_pubsub(cluster: Any, address: Address) -> Any:
    """A PubSub on its own one-connection pool to one node, with the cluster's credentials."""
    import redis.asyncio as aredis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs = {
        k: v
        for k, v in cluster.get_connection_kwargs().items()
        if k not in ("max_connections", "response_callbacks", "retry")
    }
    kwargs.update(host=address[0], port=address[1])
    # The subscriber idles between messages: no read timeout. No silent reconnect either:
    # a failure must reach the Notifier, which re-subscribes on the current owner.
    kwargs["socket_timeout"] = None
    kwargs["retry"] = Retry(NoBackoff(), 0)
    pool = aredis.ConnectionPool(max_connections=1, **kwargs)
    return aredis.Redis.from_pool(pool).pubsub()


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
