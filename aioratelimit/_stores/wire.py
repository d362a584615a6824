"""The wire path: the connections a store built by ``Backend.from_url`` runs its scripts on.

A call checks out one redis-py ``Connection``, writes one pre-packed EVALSHA, reads one
reply and checks the connection back in: nothing else. ``redis.asyncio.Redis.execute_command``
wraps every command in a pool lock, a retry loop, observability hooks and response callbacks,
which costs more client time than the whole round trip to a local server does; this path
keeps what the scripts need (redis-py's connection: connect, AUTH, SELECT, TLS, unix sockets,
the hiredis reply parser and its error classes) and drops the rest.

It reads two attributes of redis-py's connection, ``_reader`` and ``_writer`` (its asyncio
streams: the closed-while-idle check and the write), as redis-py itself does; the version
is pinned below 9 and tests/test_connections.py pins the behaviour. It never touches the
private state of an asyncio or uvloop transport: connections of an event loop are closed
on that loop, when it shuts down (``_aio.Keeper``) or when the store closes.

Two things redis-py's path does are deliberately not done here:

- No retry: a script whose reply was lost may have run (a counted hit, a taken lock), so a
  transport error becomes ``BackendUnavailable`` and the caller decides. A connection found
  closed *before* the send (the server restarted while it idled) is reconnected first, as
  redis-py's pool does on checkout.
- No limit of its own: the store's gate lets at most ``max_connections`` calls in, and a
  call holds exactly one connection, so there are never more connections than that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from .._scripts import Arg, Reply, Script


def _bulk(arg: Arg) -> bytes:
    """One argument as a RESP bulk string, encoded as redis-py's default encoder does."""
    if type(arg) is str:
        data = arg.encode()
    elif type(arg) is int:
        data = b"%d" % arg
    elif type(arg) is bytes:
        data = arg
    else:
        raise TypeError(f"a script argument must be str, int or bytes, not {type(arg).__name__}")
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack(head: bytes, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
    """``<command> <sha or source> <numkeys> keys... args...`` in RESP, ``head`` being the
    packed command and script (``Script.evalsha_head`` or ``Script.eval_head``)."""
    items = (*keys, *args)
    return b"".join((b"*%d\r\n" % (3 + len(items)), head, _bulk(len(keys)), *map(_bulk, items)))


async def exchange(conn: Any, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
    """One script call on one checked-out redis-py connection: EVALSHA, and on NOSCRIPT,
    EVAL on the same connection (same call). Used by ``Connections`` and, on a cluster, on
    the connections of the node that owns the keys."""
    try:
        # The connection's stream reader: None until connected. The server closed it while
        # it sat idle (a restart, a client timeout) if it is at EOF or failed: reconnect
        # before sending. (Leftover data cannot be there: an interrupted exchange closes it.)
        reader = conn._reader
        if reader is not None and (reader.at_eof() or reader.exception() is not None):
            await conn.disconnect(nowait=True)
            reader = None
        if reader is None:
            await conn.connect()
        # What send_packed_command does, without its checks and its drain when the socket
        # took the whole command at once (the common case for a small call).
        writer = conn._writer
        writer.write(pack(script.evalsha_head, keys, args))
        if writer.transport.get_write_buffer_size():
            # Bounded by the connection's socket timeout where it has one (a cluster node),
            # else by the store's deadline timer, like the read.
            async with asyncio.timeout(conn.socket_timeout or None):
                await writer.drain()
        try:
            return await conn.read_response()
        except NoScriptError:
            # After SCRIPT FLUSH, a restart or a failover: EVAL runs it and caches it.
            await conn.send_packed_command(pack(script.eval_head, keys, args), False)
            return await conn.read_response()
    except ResponseError:
        raise  # the server answered: the connection is in step and stays open
    except BaseException:
        # Cancelled or failed mid-exchange: a reply may still be on its way, so this
        # socket can never be trusted again (redis-py closes it too; make sure).
        await conn.disconnect(nowait=True)
        raise


class Connections:
    """Idle connections, newest first out (a warm socket is reused before a cold one)."""

    __slots__ = ("_closed", "_idle", "_make")

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make  # a new, unconnected redis.asyncio Connection
        self._idle: list[Any] = []
        self._closed = False

    def take(self) -> Any:
        """A connection for one call: the newest idle one, else a new (unconnected) one."""
        return self._idle.pop() if self._idle else self._make()

    def give(self, conn: Any) -> None:
        """Back after its call (closed if the pool was closed meanwhile). A connection the
        exchange closed goes back too: it reconnects on its next call."""
        if self._closed:
            _close_now(conn)
        else:
            self._idle.append(conn)

    async def aclose(self) -> None:
        """Close every idle connection; one in use is closed when its call ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect(nowait=True)


def _close_now(conn: Any) -> None:
    """``disconnect(nowait=True)`` without the await: close the stream on the running loop
    (which unregisters the socket and closes it) and forget it."""
    writer = conn._writer
    if writer is not None:
        conn._parser.on_disconnect()
        conn._writer = conn._reader = None
        writer.close()
