"""Writes confirmed by replicas: ``WAIT`` (or ``WAITAOF``) written right behind the script.

A primitive made with ``replicas=N`` runs its writing script through
``Backend._run_confirmed``: the script and ``WAIT N ms`` go out in ONE write on ONE
connection, so no round trip of ours comes between them, and ``WAIT`` (which counts the
replicas that have every write of *its connection* so far) covers that script. With
``aof=True`` it is ``WAITAOF 1 N ms`` (Redis >= 7.2, Valkey >= 8): the master's own
append-only file fsynced, and N replicas' too.

What each guarantees, and what not: ``WAIT`` says N replicas *received* the write (in
memory); a failover that promotes one of them keeps it, one that promotes another
replica (or that the sentinels run before it arrived) may not. ``WAITAOF`` says it is
on disk, which a restart of that server keeps. Neither is consensus: a write that was not
confirmed may still be on a replica, and one that was may be lost if a replica that did
not acknowledge is promoted. See docs/locks.md.

``WAIT`` blocks its connection until the replicas answer or the timeout passes, so
confirmed writes never go over the shared multiplexed wire: each endpoint has a small,
bounded pool of connections of its own (``ConfirmPool``), one write at a time each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._args import check_int, check_seconds, to_ms
from .._errors import BackendError, BackendUnavailable, NotReplicated
from .._scripts import Arg, Reply, Script
from .endpoint import Endpoint
from .resp import pack, pack_command
from .wire import ReplyError, Wire, connect

#: The connections of one endpoint's pool for confirmed writes (each carries one write
#: and its WAIT at a time). A write past them waits for one, within the backend's timeout.
POOL_SIZE = 8
#: ``replicas_timeout`` by default (seconds): Redisson's lock waits one second too.
DEFAULT_REPLICAS_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class Replicas:
    """What a confirmed write waits for: ``count`` replicas (``WAIT``), and with ``aof``
    the master's own AOF and ``count`` replicas' (``WAITAOF 1 count``), within
    ``timeout`` seconds."""

    count: int
    timeout: float
    aof: bool

    def args(self) -> tuple[Arg, ...]:
        """``WAIT count ms`` or ``WAITAOF 1 count ms``."""
        ms = to_ms(self.timeout)
        return ("WAITAOF", 1, self.count, ms) if self.aof else ("WAIT", self.count, ms)

    def check(self, reply: Any, what: str) -> NotReplicated | None:
        """None when ``reply`` (WAIT's or WAITAOF's) confirms the write, else the error
        to raise (an error reply too: the script ran, its confirmation failed)."""
        if isinstance(reply, (ReplyError, BaseException)):
            message = str(reply)
            return NotReplicated(
                f"{what}: the write ran but could not be confirmed: Redis answered"
                f" {message!r}{_fix(message)}",
                wanted=self.count,
            )
        if self.aof:
            local, acknowledged = (int(n) for n in reply)
            if local >= 1 and acknowledged >= self.count:
                return None
            return NotReplicated(
                f"{what}: the write was fsynced by {'the master' if local else 'no server'}"
                f" and by {acknowledged} of {self.count} replicas within {self.timeout} s",
                wanted=self.count,
                acknowledged=acknowledged,
                fsynced=local >= 1,
            )
        acknowledged = int(reply)
        if acknowledged >= self.count:
            return None
        return NotReplicated(
            f"{what}: the write was acknowledged by {acknowledged} of {self.count} replicas"
            f" within {self.timeout} s",
            wanted=self.count,
            acknowledged=acknowledged,
        )


def _fix(message: str) -> str:
    lowered = message.lower()
    if "unknown command" in lowered and "waitaof" in lowered:
        return " (fix: WAITAOF needs Redis 7.2+ or Valkey 8+; drop aof=True to wait with WAIT)"
    if "appendonly" in lowered:
        return " (fix: aof=True needs `appendonly yes` on the master; or drop aof=True)"
    return ""


def shown(replicas: Replicas | None) -> str:
    """What a primitive's ``repr`` adds for its option: `` replicas=1`` (and ``aof``)."""
    if replicas is None:
        return ""
    return f" replicas={replicas.count}{' aof' if replicas.aof else ''}"


def replicas_option(replicas: object, replicas_timeout: object, aof: object) -> Replicas | None:
    """The confirmation a primitive's ``replicas=``, ``replicas_timeout=`` and ``aof=``
    ask for (None: none, the default), checked before any I/O."""
    count = check_int(replicas, "replicas", minimum=0)
    timeout = check_seconds(replicas_timeout, "replicas_timeout")
    if not isinstance(aof, bool):
        raise TypeError(f"aof must be True or False, not {type(aof).__name__}")
    if count == 0 and not aof:
        return None
    return Replicas(count, timeout, aof)


def refuse(replicas: Replicas, refusal: str | None, timeout: float) -> None:
    """``ValueError`` when a backend cannot confirm writes as asked: its store cannot
    (``refusal`` says why: memory://), or ``WAIT`` would not end within the backend's
    ``timeout`` (which bounds every reply)."""
    if refusal is not None:
        raise ValueError(refusal)
    if replicas.timeout >= timeout:
        raise ValueError(
            f"replicas_timeout ({replicas.timeout} s) must be below the backend's timeout"
            f" ({timeout} s), which bounds the reply WAIT is part of"
        )


class ConfirmPool:
    """A few connections to one endpoint for confirmed writes, one write at a time each."""

    __slots__ = ("_connect_timeout", "_idle", "_slots", "_timeout", "_where", "waitaof")

    def __init__(
        self,
        where: Callable[[], Awaitable[Endpoint]],
        *,
        timeout: float,
        connect_timeout: float,
        size: int = POOL_SIZE,
    ) -> None:
        self._where = where  # asked at every connect: the Sentinel master moves
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Wire] = []
        #: whether the server knows WAITAOF (asked once, before the first write using it)
        self.waitaof: bool | None = None

    async def run(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], replicas: Replicas
    ) -> tuple[Reply, Any]:
        """The script's reply and WAIT's (or WAITAOF's), sent in one write. Raises what the
        wire raises (``OSError``, ``TimeoutError``, a ``ReplyError`` of the script)."""
        try:
            async with asyncio.timeout(self._timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise BackendUnavailable(
                f"no connection for a confirmed write came free within {self._timeout} s"
            ) from None
        wire: Wire | None = None
        try:
            wire = self._take() or await self._connect()
            if replicas.aof and self.waitaof is None:
                # Asked before the first write that needs it, so a server without it
                # refuses with nothing written (once per pool; a new master, asked anew).
                (probe,) = wire.send_together([pack_command("COMMAND", "INFO", "WAITAOF")])
                known = await probe
                self.waitaof = isinstance(known, list) and bool(known) and known[0] is not None
            if replicas.aof and not self.waitaof:
                raise BackendError(
                    "aof=True needs WAITAOF, which this server lacks (fix: Redis 7.2 or"
                    " newer, or Valkey 8; or drop aof=True to wait with WAIT)"
                )
            wait = pack_command(*replicas.args())
            reply, waited = await _both(wire, pack(script.evalsha_head, keys, args), wait)
            if type(reply) is ReplyError and str(reply).startswith("NOSCRIPT"):
                reply, waited = await _both(wire, pack(script.eval_head, keys, args), wait)
            if type(reply) is ReplyError and str(reply).startswith("READONLY"):
                self.clear()  # demoted: the next write connects to the new master
                wire.close()
                wire = None
            return reply, waited
        except BaseException:
            if wire is not None:
                wire.abort(ConnectionError("a confirmed write failed or was cancelled"))
                wire = None
            raise
        finally:
            if wire is not None and wire.error is None:
                self._idle.append(wire)
            self._slots.release()

    def _take(self) -> Wire | None:
        while self._idle:
            wire = self._idle.pop()
            if wire.error is None:
                return wire
        return None

    async def _connect(self) -> Wire:
        async with asyncio.timeout(self._connect_timeout):
            where = await self._where()
        return await connect(where, timeout=self._timeout, connect_timeout=self._connect_timeout)

    def clear(self) -> None:
        """Close the idle connections (the server is no longer the master, or the pool
        closes); a connection in use closes when its write is over."""
        idle, self._idle = self._idle, []
        for wire in idle:
            wire.close()
        self.waitaof = None

    def __repr__(self) -> str:
        return f"<ConfirmPool idle={len(self._idle)} free={self._slots._value}>"


#: Error replies of a cluster node that tell of a topology the slot map does not show.
_TOPOLOGY = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "READONLY")


class ConfirmPools:
    """One ``ConfirmPool`` per Redis Cluster master, by address (``nodes``: the settings
    of a connection to any node)."""

    __slots__ = ("_connect_timeout", "_nodes", "_pools", "_timeout")

    def __init__(self, nodes: Endpoint | None, *, timeout: float, connect_timeout: float) -> None:
        self._nodes = nodes
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._pools: dict[tuple[str, int], ConfirmPool] = {}

    async def run(
        self,
        address: tuple[str, int],
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        replicas: Replicas,
        moved: Callable[[], None],
    ) -> tuple[Reply, Any]:
        """``ConfirmPool.run`` on the master at ``address``; after a MOVED (the node ran
        nothing: the slot map was stale) once more on the master it names. An error reply
        is raised; one that tells of a changed topology calls ``moved()`` first (the slot
        map is refreshed; a script that may have run is never sent again)."""
        for hop in range(2):
            reply, waited = await self._pool(address).run(script, keys, args, replicas)
            if type(reply) is not ReplyError:
                return reply, waited
            if str(reply).startswith(_TOPOLOGY):
                moved()
            if hop or not str(reply).startswith("MOVED "):
                break
            host, _, port = str(reply).split(" ")[2].rpartition(":")
            address = (host, int(port))
        raise reply

    def _pool(self, address: tuple[str, int]) -> ConfirmPool:
        pool = self._pools.get(address)
        if pool is None:
            assert self._nodes is not None  # (``confirm_refusal`` refused it otherwise)
            where = self._nodes.at(*address)

            async def endpoint() -> Endpoint:
                return where

            pool = self._pools[address] = ConfirmPool(
                endpoint, timeout=self._timeout, connect_timeout=self._connect_timeout
            )
        return pool

    def forget(self) -> None:
        """Drop the pools without closing them (their loop has ended)."""
        self._pools = {}

    def clear(self) -> None:
        """Close every pool's idle connections."""
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.clear()


async def _both(wire: Wire, script: bytes, wait: bytes) -> tuple[Any, Any]:
    """Write the script and its WAIT as one write (closed by one tag: a lost reply cannot
    shift them) and await both replies."""
    ran, waited = wire.send_together([script, wait])
    waited.add_done_callback(_retrieved)  # (its failure is ``ran``'s, raised first)
    return await ran, await waited


def _retrieved(reply: asyncio.Future[Any]) -> None:
    if not reply.cancelled():
        reply.exception()
