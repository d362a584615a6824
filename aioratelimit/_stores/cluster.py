"""Redis Cluster: the store that runs scripts on the master owning their keys, and the
subscriber that listens on it.

Every script's keys share one hash tag (``_keys``), so each call goes to exactly one master.
``ClusterStore`` keeps redis-py's ``RedisCluster`` for the topology (slot map, discovery)
and for the calls it must reroute, and adds what the library promises on every backend:

- one round trip on the usual path: EVALSHA straight to the master the slot map names, on
  one multiplexed connection per master (``wire.Link``), batched per master, never resent;
- a bounded number of calls in flight (``max_in_flight``; for a client passed in, its pool
  size), queued rather than failed;
- one explicit ``initialize()`` before the first call (concurrent first calls on a fresh
  client raced each other in redis-py, redis/redis-py#3935);
- NOSCRIPT answered by EVAL on the node that reported it, which caches the script there;
- ASK (a slot migrating) answered with ASKING and the script in one write to the importing
  node; MOVED, TRYAGAIN or a connection refused before anything was sent go through
  ``RedisCluster`` itself, which repairs its slot map; a timeout, CLUSTERDOWN or READONLY
  is not retried (the script may have run), and the map is refreshed in the background;
- every failure as ``BackendUnavailable``: the cluster client also raises exceptions outside
  ``RedisError`` (``RedisClusterException`` when no node answers, and internal errors under
  races), so here any exception of a call is translated, with its cause chained.

Wake-ups use sharded pub/sub (Redis >= 7.0): scripts ``SPUBLISH`` on a channel that carries
the hash tag of their keys, so a message stays inside the shard that owns it, and
``cluster_pubsub.ShardedPubSub`` holds one dedicated connection per master that owns a
channel someone waits on.

Event loops: as on a standalone server, the store serves one running loop at a time, and
the node connections opened on a loop are closed when that loop shuts down; the next loop
discovers the cluster afresh (a call from another loop while the one served so far still
runs is refused: ``loops``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.crc import key_slot

from .._aio import Gate, Keeper
from .._errors import AioRateLimitError
from .._scripts import BATCH_CLUSTER, Arg, OnCall, Reply, Script
from .base import DEFAULT_CONNECT_TIMEOUT, observed, server_refusal, translate
from .batch import Batcher
from .cluster_pubsub import ShardedPubSub
from .confirm import ConfirmPools, Replicas
from .endpoint import Endpoint, endpoint, tls_options
from .loops import check_free
from .notify import Notifier
from .resp import pack, pack_command
from .urls import Address, parse_hosts, tls_query
from .wire import Link, ReplyError

log = logging.getLogger("aioratelimit")

_running_loop = asyncio.get_running_loop


#: How long a node whose subscriber connection failed is avoided when subscribing anew.
SUSPECT_FOR = 5.0


def cluster_store(
    url: str,
    *,
    max_connections: int,
    timeout: float,
    connect_timeout: float,
    max_in_flight: int,
    on_call: OnCall | None = None,
    batch: bool = True,
    **options: Any,
) -> ClusterStore:
    """The store for a ``redis+cluster://host:port[,host:port...]`` URL (it owns its client).

    TLS (``rediss+cluster://``, or any TLS option: in the query or as a keyword) is every
    connection's: the topology's (discovery, rerouting), each node's, the subscriber's.
    """
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    parts = urlsplit(url)
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError(
            "a redis+cluster:// URL is hosts and TLS options only:"
            " redis+cluster://host:port,host:port or rediss+cluster://host:port,...?ssl_ca_certs=..."
        )
    options = {**tls_query(parts.query), **options}
    hosts, username, password = parse_hosts(parts.netloc, 6379)
    tls = parts.scheme == "rediss+cluster" or bool(tls_options(options))
    nodes = endpoint(None, {"username": username, "password": password, **options}, tls=tls)
    if tls:
        # redis-py's RedisCluster takes TLS options only with ssl=True (it ignores them
        # otherwise, and its topology connection would send AUTH in clear text), and not
        # every one of them: refuse what it would not honour.
        taken = inspect.signature(RedisCluster.__init__).parameters
        dropped = sorted(name for name in tls_options(options) if name not in taken)
        if dropped:
            raise TypeError(f"TLS option(s) {dropped} are not supported on a Redis Cluster")
        options["ssl"] = True
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
    return ClusterStore(
        client,
        owned=True,
        max_calls=max_in_flight,
        timeout=timeout,
        connect_timeout=connect_timeout,
        nodes=nodes,
        on_call=on_call,
        batch=batch,
    )


class ClusterStore:
    """Runs scripts by EVALSHA on a ``redis.asyncio.RedisCluster``, bounded and translated."""

    __slots__ = (
        "_adopting",
        "_batch",
        "_batchers",
        "_cluster",
        "_confirms",
        "_connect_timeout",
        "_gate",
        "_hints",
        "_keeper",
        "_links",
        "_loop",
        "_nodes",
        "_notifier",
        "_on_call",
        "_owned",
        "_ready",
        "_ready_lock",
        "_refresh",
        "_suspects",
        "_timeout",
        "confirm_refusal",
    )

    #: Scripts publish wake-ups with this command: shard-local on a cluster.
    publish_command = "SPUBLISH"

    def __init__(
        self,
        client: Any,
        *,
        owned: bool,
        max_calls: int,
        timeout: float,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        nodes: Endpoint | None = None,
        on_call: OnCall | None = None,
        batch: bool = True,
    ) -> None:
        self._cluster: Any = client  # a redis.asyncio.RedisCluster
        self._owned = owned
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        # The settings of a connection to any node (credentials, TLS); None: a client
        # passed in, whose own routing runs every call.
        self._nodes = nodes
        self._links: dict[Address, Link] = {}
        self._batch = batch  # a Batcher per master (``_stores.batch``; ``BATCH_CLUSTER``)
        self._batchers: dict[Address, Batcher] = {}
        self._confirms = ConfirmPools(nodes, timeout=timeout, connect_timeout=connect_timeout)
        #: why ``replicas=`` is refused here: a client passed in routes every call itself
        self.confirm_refusal = None if nodes else "replicas= on a Redis Cluster needs from_url"
        self._on_call = on_call
        self._gate = Gate(max_calls)
        self._notifier: Notifier | None = None
        # The loop the node connections, the gate and the lock serve (see _adopt).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._adopting = threading.Lock()
        self._keeper: Keeper | None = None
        self._ready = False
        self._ready_lock: asyncio.Lock | None = None
        self._refresh: asyncio.Task[None] | None = None
        # For the subscriber: the master a MOVED named for a slot, and nodes that just failed.
        self._hints: dict[int, Address] = {}
        self._suspects: dict[Address, float] = {}

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        if self._on_call is None:
            return await self._call(script, keys, args)
        return await observed(
            self._on_call, script, self._call(script, keys, args), lambda: self._server(keys)
        )

    async def run_confirmed(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], replicas: Replicas
    ) -> tuple[Reply, Any]:
        """The script and WAIT in one write to the master owning ``keys``, on a connection
        of its own (``confirm``): WAIT then counts that master's replicas."""
        if self._loop is not _running_loop():
            self._adopt()
        try:
            if not self._ready:
                await self.ready()
            node = self._cluster.get_node_from_key(keys[0])
            where = (node.host, int(node.port))
            return await self._confirms.run(where, script, keys, args, replicas, self._rediscover)
        except AioRateLimitError:
            raise
        except Exception as exc:
            raise translate(exc, script) from exc

    def _server(self, keys: Sequence[str]) -> str:
        """The master the slot map names for ``keys`` (what ``on_call`` reports)."""
        if not self._ready:
            return "cluster"
        node = self._cluster.get_node_from_key(keys[0])
        return f"{node.host}:{node.port}"

    async def _call(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
        if self._loop is not _running_loop():
            self._adopt()
        gate = self._gate
        if gate.free:
            gate.free -= 1
        else:
            await gate.wait(self._timeout)
        try:
            if not self._ready:
                await self.ready()
            if self._nodes is None:
                return await self._routed(script, keys, args)
            node = self._cluster.get_node_from_key(keys[0])
            where = (node.host, int(node.port))
            link = self._link(*where)
            try:
                wire = link.open or await link.wire()
            except (OSError, TimeoutError):
                # Nothing was sent: redis-py's routing finds the node's successor.
                self._rediscover()
                return await self._routed(script, keys, args)
            batcher = self._batchers.get(where)
            if batcher is None:
                batcher = self._batchers[where] = Batcher(BATCH_CLUSTER, enabled=self._batch)
            try:
                reply = await batcher.send(wire, script, keys, args)
            except (OSError, TimeoutError):
                # Sent, and no reply: the script may have run, so no retry. The slot map
                # is refreshed in the background, so calls find a promoted master.
                self._rediscover()
                raise
            if type(reply) is ReplyError:
                return await self._answered(link, script, keys, args, reply)
            return reply
        except AioRateLimitError:
            raise  # translated already (a refusal found by ``ready``)
        except Exception as exc:
            # Also RedisClusterException and redis-py internals: none may escape untranslated.
            raise translate(exc, script) from exc
        finally:
            gate.leave()

    async def _answered(
        self, link: Link, script: Script, keys: Sequence[str], args: Sequence[Arg], error: Any
    ) -> Reply:
        """An error reply, one kind at a time. NOSCRIPT: EVAL on the same node. MOVED and
        TRYAGAIN (the node did not run it): redis-py's routing, which repairs its slot map
        and retries. ASK (a slot migrating): ASKING and the script on the importing node.
        CLUSTERDOWN and READONLY (a failover): no retry, the map refreshed in the
        background. Anything else is the script's own error."""
        message = str(error)
        kind = message.split(" ", 1)[0]
        if kind == "NOSCRIPT":
            wire = link.open or await link.wire()
            reply = await wire.send(pack(script.eval_head, keys, args))
            if type(reply) is not ReplyError:
                return reply
            error, kind = reply, str(reply).split(" ", 1)[0]
        if kind in ("MOVED", "TRYAGAIN"):
            return await self._routed(script, keys, args)
        if kind == "ASK":
            host, _, port = message.split(" ")[2].rpartition(":")
            return await self._asking(host, int(port), script, keys, args)
        if kind in ("CLUSTERDOWN", "READONLY"):
            if kind == "READONLY":
                link.drop(error)
            self._rediscover()
        raise error

    def _link(self, host: str, port: int) -> Link:
        link = self._links.get((host, port))
        if link is None:
            assert self._nodes is not None
            link = self._links[host, port] = Link(
                self._nodes.at(host, port),
                timeout=self._timeout,
                connect_timeout=self._connect_timeout,
            )
        return link

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

        async with asyncio.timeout(self._timeout):
            return await call()

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
        self, host: str, port: int, script: Script, keys: Sequence[str], args: Sequence[Arg]
    ) -> Reply:
        """The slot is migrating and the keys are already on the importing node: ASKING and
        the script there, back to back in one write (ASKING holds for that connection's
        next command only)."""
        wire = await self._link(host, port).wire()
        asking = pack_command("ASKING")
        for head in (script.evalsha_head, script.eval_head):
            reply = await wire.send(pack(head, keys, args), preface=asking)
            if type(reply) is not ReplyError or not str(reply).startswith("NOSCRIPT"):
                break
        if type(reply) is ReplyError:
            if str(reply).startswith(("ASK", "MOVED")):  # the migration moved on meanwhile
                return await self._routed(script, keys, args)
            raise reply
        return reply

    def _adopt(self) -> None:
        """Serve the running loop from now on: a fresh gate, lock and discovery, and a
        keeper that closes the node connections when this loop shuts down; unless the
        loop served so far still runs (``loops.check_free``)."""
        with self._adopting:  # two threads' loops may come at once
            if self._loop is _running_loop():
                return
            check_free(self._loop)
            old, self._loop = self._keeper, _running_loop()
            if old is not None:
                old.close_soon()  # its loop has stopped (closed already, mostly)
            self._gate = Gate(self._gate.size)
            self._links = {}
            self._batchers = {}
            self._confirms.forget()  # (its connections belong to the loop that ended)
            self._ready = False
            self._ready_lock = None
            self._refresh = None
            # A client the application passed in is the application's to close.
            self._keeper = Keeper(self._disconnect) if self._owned else None

    async def _disconnect(self) -> None:
        """Close every node connection (they belong to the loop that is ending)."""
        if self._keeper is not None and self._keeper.task is asyncio.current_task():
            self._loop = None  # the next call, on whichever loop, starts afresh
        links, self._links = self._links, {}
        for link in links.values():
            link.close()
        self._confirms.clear()
        await asyncio.sleep(0)  # the transports close their sockets on the next loop turn
        client = self._cluster
        with contextlib.suppress(Exception):
            await client.aclose()
        # RedisCluster.aclose() does nothing while the client is marked for rediscovery
        # (after a connection error), yet its nodes may hold open connections.
        manager = client.nodes_manager
        await manager.aclose("nodes_cache")
        await manager.aclose("startup_nodes")

    async def ready(self) -> None:
        """Discover the cluster once, before any command (never concurrently)."""
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            if not self._ready:
                try:
                    await self._cluster.initialize()
                except Exception as exc:
                    # A refusal under the "no node answered" (an ACL user that may not
                    # run CLUSTER SLOTS, a wrong password) is a configuration error: say
                    # so, not "down".
                    refusal = server_refusal(exc)
                    if refusal is not None:
                        raise translate(refusal) from exc
                    raise
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
            bound = self._connect_timeout + self._timeout
            self._notifier = Notifier(lambda: ShardedPubSub(self), bound=bound)
        return self._notifier

    async def aclose(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(BaseException):
                await self._refresh
        if self._notifier is not None:
            await self._notifier.aclose()
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await keeper.aclose()  # it closes the node connections
        elif self._owned:
            await self._disconnect()
