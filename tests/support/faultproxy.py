"""A fault-injecting TCP proxy on loopback, between the library and a real redis-server.

The proxy runs its own event loop in a background thread, so it forwards, stalls or cuts
whatever the test's loop (and the library on it) is doing. The test steers it with plain
method calls that return once the proxy has applied them::

    with FaultProxy(server.port) as proxy:
        backend = arl.Backend.from_url(proxy.url)
        proxy.stall()                      # a blackhole, for old and new connections
        proxy.passthrough()                # forward again (and clear every fault)
        proxy.reset()                      # RST every connection now
        proxy.reset_after(replies=3, into=5)  # RST 5 bytes into the 3rd reply from now
        proxy.chaos(random.Random(1))      # such cuts again and again, at random points
        proxy.drop_reply(commands={"EVALSHA"})  # swallow the next reply to an EVALSHA
        proxy.stall_subscribers()          # half-open: the connections that subscribed only
        proxy.refuse()                     # new connections end before reaching the server
        proxy.stats()                      # counters: connections, replies, commands, ...

Faults are counted in server replies, which the proxy finds with ``hiredis.Reader`` (fed up
to each line end, so a reply's end is known to the byte). It forwards only whole replies
(a partial one waits for its end), so a reply is dropped whole and a cut falls exactly
where it was asked for. Client commands are parsed too: counted by name, and paired in
order with the replies of their connection (a connection that subscribed is not paired:
its messages answer no command).

A stall pauses reading on both sides of every connection; what the client sent meanwhile
is delivered when the proxy passes again, as TCP does once a partition heals. A reset sets
SO_LINGER to 0 and aborts both sides, so each peer gets an RST, not a FIN. Closing the
proxy closes every socket it opened and joins its thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar

import hiredis
import redis

T = TypeVar("T")

#: What the hiredis readers answer while a reply (or command) is not whole yet.
_MORE = object()
#: Commands after which a connection's server messages no longer answer commands one to one.
_SUBSCRIBING = frozenset({"SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "MONITOR"})
#: SO_LINGER on, 0 s: close() sends an RST and discards unsent data.
_LINGER_0 = struct.pack("ii", 1, 0)


class Server(Protocol):
    """What the fault tests use of the ``own_redis`` fixture's private server, typed by
    shape so that they import no server helper module (those are moving)."""

    port: int

    @property
    def url(self) -> str: ...

    def restart(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Stats:
    """A consistent snapshot of the proxy's counters (all since it started)."""

    #: client connections accepted
    accepted: int
    #: client connections open now (one its client closed during a stall counts until
    #: the proxy reads it again)
    open: int
    #: whole server replies seen (forwarded or dropped)
    replies: int
    #: server replies swallowed by ``drop_reply``
    dropped: int
    #: connections the proxy reset (``reset``, ``reset_after``, ``chaos``)
    resets: int
    #: client commands seen, by upper-case name (``"EVALSHA"``); a command counts once it
    #: reached the proxy whole, whether or not the server got it
    commands: dict[str, int]
    #: bytes forwarded client -> server and server -> client
    bytes_up: int
    bytes_down: int


class _Cut:
    """An armed cut: ``into`` bytes into the ``replies``-th whole reply from now (on any
    connection), or after ``nbytes`` more bytes forwarded to clients, reset the connection
    that carries it."""

    __slots__ = ("into", "nbytes", "replies")

    def __init__(self, replies: int | None, nbytes: int | None, into: int) -> None:
        self.replies = replies
        self.nbytes = nbytes
        self.into = into


class _Side(asyncio.Protocol):
    """One socket of a pipe: hands what it reads to the pipe, and its end."""

    def __init__(self, pipe: _Pipe, upstream: bool) -> None:
        self.pipe = pipe
        self.upstream = upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self.upstream:
            self.pipe.upstream_made(transport)
        else:
            self.pipe.client_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.upstream:
            self.pipe.proxy._down(self.pipe, data)
        else:
            self.pipe.proxy._up(self.pipe, data)

    def eof_received(self) -> bool:
        self.pipe.close()  # flushes what is queued for the other side, then FIN
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipe.close()


class _Pipe:
    """One client connection and its connection to the server."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.connecting: asyncio.Task[Any] | None = None
        #: client bytes not yet written upstream (before it connected, or while stalled)
        self.held_up: list[bytes] = []
        #: server bytes not yet forwarded: the start of a reply that is not whole yet
        self.held_down = bytearray()
        self.commands = hiredis.Reader(notEnoughData=_MORE)
        self.replies = hiredis.Reader(notEnoughData=_MORE)
        #: names of the commands sent and not yet answered, oldest first
        self.unanswered: collections.deque[str] = collections.deque()
        self.subscribed = False
        self.unparsable = False
        self.closed = False

    def client_made(self, transport: asyncio.Transport) -> None:
        self.client = transport
        self.proxy._accepted(self)
        if self.proxy._stalled:
            transport.pause_reading()
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        if self.proxy._refusing:
            self.close()  # as if nothing listened upstream
            return
        try:
            await loop.create_connection(
                lambda: _Side(self, upstream=True),
                self.proxy.upstream_host,
                self.proxy.upstream_port,
            )
        except OSError:
            self.close()  # nothing listens upstream: the client sees its connection end

    def upstream_made(self, transport: asyncio.Transport) -> None:
        if self.closed:
            transport.abort()
            return
        self.upstream = transport
        if self.proxy._stalled:
            transport.pause_reading()
        else:
            self.flush_up()

    def flush_up(self) -> None:
        if self.upstream is not None and self.held_up:
            data = b"".join(self.held_up)
            self.held_up.clear()
            self.proxy._count_up(len(data))
            self.upstream.write(data)

    def parse_commands(self, data: bytes) -> list[str]:
        """The names of the whole commands that ``data`` completes."""
        if self.unparsable:
            return []
        names = []
        try:
            self.commands.feed(data)
            while (command := self.commands.gets()) is not _MORE:
                if isinstance(command, list) and command and isinstance(command[0], bytes):
                    names.append(command[0].decode("ascii", "replace").upper())
        except hiredis.ProtocolError:
            self.unparsable = True  # not RESP (an inline command): forwarded, not counted
        return names

    def reply_ends(self, data: bytes) -> list[tuple[int, str | None]]:
        """Where each whole reply that ``data`` completes ends (offset in ``data``), with
        the command it answers (None: a message, or unknown)."""
        if self.unparsable:
            return [(len(data), None)] if data else []
        ends: list[tuple[int, str | None]] = []
        pos, size = 0, len(data)
        try:
            while pos < size:
                newline = data.find(b"\n", pos)
                stop = size if newline < 0 else newline + 1
                self.replies.feed(data, pos, stop - pos)
                pos = stop
                # Every reply ends with CRLF: fed up to each line end, the reader completes
                # a reply exactly where it ends.
                while (reply := self.replies.gets()) is not _MORE:
                    ends.append((stop, self.answered(reply)))
        except hiredis.ProtocolError:
            self.unparsable = True
            return [*ends, (size, None)]
        return ends

    def answered(self, reply: object) -> str | None:
        if self.subscribed or isinstance(reply, hiredis.PushNotification):
            return None
        return self.unanswered.popleft() if self.unanswered else None

    def pause(self) -> None:
        for transport in (self.client, self.upstream):
            if transport is not None and not transport.is_closing():
                transport.pause_reading()

    def resume(self) -> None:
        for transport in (self.client, self.upstream):
            if transport is not None and not transport.is_closing():
                transport.resume_reading()
        self.flush_up()

    def close(self, reset: bool = False) -> None:
        """Close both sides: gracefully (queued bytes go out, then FIN) or with an RST."""
        if self.closed:
            return
        self.closed = True
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        for transport in (self.client, self.upstream):
            if transport is None:
                continue
            if reset:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):  # already gone
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
                transport.abort()
            else:
                transport.close()
        self.proxy._closed(self, reset)


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to a Redis server, with faults on demand.

    Start it with ``start()`` or ``with``; ``close()`` ends every connection and the
    thread. Every control method applies its change on the proxy's loop before returning.
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._pipes: set[_Pipe] = set()
        # What the proxy loop reads and writes (control calls run there too).
        self._stalled = False
        self._refusing = False
        self._cut: _Cut | None = None
        self._chaos: tuple[random.Random, tuple[int, int], tuple[int, int]] | None = None
        self._drops = 0
        self._drop_commands: frozenset[str] | None = None
        # Counters: written on the proxy loop under the lock, read from any thread.
        self._lock = threading.Lock()
        self._counts = collections.Counter[str]()
        self._commands = collections.Counter[str]()

    # -- lifetime -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultProxy:
        loop = asyncio.new_event_loop()
        self._loop = loop
        started: concurrent.futures.Future[int] = concurrent.futures.Future()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                server = loop.run_until_complete(
                    loop.create_server(lambda: _Side(_Pipe(self), upstream=False), "127.0.0.1", 0)
                )
            except BaseException as exc:
                started.set_exception(exc)
                loop.close()
                return
            self._server = server
            started.set_result(int(server.sockets[0].getsockname()[1]))
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"faultproxy->{self.upstream_port}")
        self._thread.start()
        self.port = started.result(10)
        return self

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.close(reset=True)
        pending = asyncio.all_tasks() - {asyncio.current_task()}  # connects under way
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        for _ in range(3):  # aborted transports close their sockets on the next iterations
            await asyncio.sleep(0)

    def close(self) -> None:
        """Reset every connection, stop listening and join the thread (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        thread.join(10)
        assert not thread.is_alive(), "the proxy thread did not stop"

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- control (from the test's thread) -------------------------------------------------

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the proxy loop and return its result once it ran."""
        assert self._loop is not None, "the proxy was never started"
        assert self._thread is not None, "the proxy is closed"
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        return done.result(10)

    def passthrough(self) -> None:
        """Forward both ways again, and clear every armed fault (stall, cut, chaos, drop)."""

        def apply() -> None:
            self._cut = self._chaos = None
            self._drops = 0
            self._refusing = False
            self._stalled = False
            for pipe in list(self._pipes):
                pipe.resume()

        self._call(apply)

    def stall_subscribers(self) -> int:
        """A half-open subscriber: forward nothing either way on the connections that
        subscribed (open now) until ``passthrough``; the others, and new ones, pass.
        Returns how many were stalled."""

        def apply() -> int:
            pipes = [pipe for pipe in self._pipes if pipe.subscribed]
            for pipe in pipes:
                pipe.pause()
            return len(pipes)

        return self._call(apply)

    def refuse(self) -> None:
        """New connections are accepted and then closed before anything reaches the server
        (what the client wrote on them is lost), until ``passthrough``."""

        def apply() -> None:
            self._refusing = True

        self._call(apply)

    def stall(self) -> None:
        """A blackhole: keep every connection open (and accept new ones) but forward
        nothing either way until ``passthrough``."""

        def apply() -> None:
            self._stalled = True
            for pipe in self._pipes:
                pipe.pause()

        self._call(apply)

    def reset(self) -> int:
        """RST every connection now (both sides); returns how many were reset."""

        def apply() -> int:
            pipes = list(self._pipes)
            for pipe in pipes:
                pipe.close(reset=True)
            return len(pipes)

        return self._call(apply)

    def reset_after(
        self, *, replies: int | None = None, into: int = 0, nbytes: int | None = None
    ) -> None:
        """Arm one cut (then pass on): the connection that carries the ``replies``-th
        whole server reply from now gets the replies before it and the first ``into``
        bytes of that one, then an RST (``into=0``: cut just before it; ``into`` at least
        its size: just after it). Replies that came in the same read after it are lost
        with it: on a pipelined connection, a batch cut mid-way. With ``nbytes`` instead:
        an RST after that many more bytes forwarded to any client."""
        if (replies is None) == (nbytes is None):
            raise ValueError("reset_after takes replies= or nbytes=")
        if (replies is not None and replies < 1) or (nbytes is not None and nbytes < 0):
            raise ValueError("replies must be >= 1 and nbytes >= 0")
        cut = _Cut(replies, nbytes, into)

        def apply() -> None:
            self._cut = cut

        self._call(apply)

    def chaos(
        self,
        rng: random.Random,
        *,
        replies: tuple[int, int] = (1, 20),
        into: tuple[int, int] = (0, 64),
    ) -> None:
        """``reset_after`` again and again: after every cut the next is armed with
        ``replies`` and ``into`` drawn (inclusive ranges) from ``rng``, which the proxy's
        thread alone uses from now on. ``passthrough`` stops it."""

        def apply() -> None:
            self._chaos = (rng, replies, into)
            self._cut = self._next_cut()

        self._call(apply)

    def drop_reply(self, count: int = 1, *, commands: Collection[str] | None = None) -> None:
        """Swallow the next ``count`` whole server replies (only those answering one of
        ``commands``, upper-case names, if given); the connections stay open."""
        names = None if commands is None else frozenset(c.upper() for c in commands)

        def apply() -> None:
            self._drops = count
            self._drop_commands = names

        self._call(apply)

    def stats(self) -> Stats:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> Stats:
        c = self._counts
        return Stats(
            accepted=c["accepted"],
            open=c["open"],
            replies=c["replies"],
            dropped=c["dropped"],
            resets=c["resets"],
            commands=dict(self._commands),
            bytes_up=c["bytes_up"],
            bytes_down=c["bytes_down"],
        )

    # -- the proxy loop -------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._lock:
            self._counts.update(deltas)

    def _count_up(self, n: int) -> None:
        self._count(bytes_up=n)

    def _accepted(self, pipe: _Pipe) -> None:
        self._pipes.add(pipe)
        self._count(accepted=1, open=1)

    def _closed(self, pipe: _Pipe, reset: bool) -> None:
        self._pipes.discard(pipe)
        self._count(open=-1, resets=int(reset))

    def _next_cut(self) -> _Cut | None:
        if self._chaos is None:
            return None
        rng, replies, into = self._chaos
        return _Cut(rng.randint(*replies), None, rng.randint(*into))

    def _up(self, pipe: _Pipe, data: bytes) -> None:
        if pipe.closed:
            return
        names = pipe.parse_commands(data)
        if names:
            with self._lock:
                self._commands.update(names)
            for name in names:
                if name in _SUBSCRIBING:
                    pipe.subscribed = True
                pipe.unanswered.append(name)
        pipe.held_up.append(data)
        if not self._stalled:
            pipe.flush_up()

    def _down(self, pipe: _Pipe, data: bytes) -> None:
        if pipe.closed or pipe.client is None:
            return
        held = pipe.held_down
        base = len(held)
        held += data
        out = bytearray()
        start = 0  # where the reply being looked at starts, in ``held``
        replies = dropped = 0
        cut_at: int | None = None
        for end_in_data, command in pipe.reply_ends(data):
            end = base + end_in_data
            replies += 1
            cut = self._cut
            if cut is not None and cut.replies is not None:
                cut.replies -= 1
                if cut.replies == 0:
                    out += held[start : min(end, start + cut.into)]
                    cut_at = len(out)
                    break
            drop_names = self._drop_commands
            if self._drops and (drop_names is None or command in drop_names):
                self._drops -= 1
                dropped += 1
            else:
                out += held[start:end]
            start = end
        if cut_at is not None:
            held.clear()  # the connection ends here
        else:
            del held[:start]
        cut = self._cut
        if cut_at is None and cut is not None and cut.nbytes is not None:
            if len(out) >= cut.nbytes:
                cut_at = cut.nbytes
            else:
                cut.nbytes -= len(out)
        forwarded = len(out) if cut_at is None else cut_at
        self._count(replies=replies, dropped=dropped, bytes_down=forwarded)
        if forwarded:
            pipe.client.write(bytes(out[:forwarded]))
        if cut_at is not None:
            self._cut = self._next_cut()
            pipe.close(reset=True)


# -- what the fault tests share ------------------------------------------------------------


def admin(server: Server) -> redis.Redis:
    """A plain client straight to the server (never through the proxy)."""
    return redis.Redis(port=server.port, socket_timeout=10)


async def timed(aw: Awaitable[Any], hang: float) -> tuple[Any, float]:
    """``aw``'s result, or the exception it raised, and how long it took (a hang ends in
    TimeoutError after ``hang`` seconds)."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(hang):
            outcome = await aw
    except Exception as exc:
        outcome = exc
    return outcome, time.monotonic() - started


async def once_healthy(acquire: Callable[[], Awaitable[T]], within: float) -> T:
    """``acquire()`` right after ``passthrough``, tried again on ``BackendUnavailable`` for
    up to ``within`` seconds: a connection opened while faults were armed may still be cut
    by one decided before the switch (the library rightly never resends that call), and
    only the call on it fails. A fault that lasts fails the test."""
    from aioratelimit import BackendUnavailable

    deadline = time.monotonic() + within
    while True:
        try:
            return await acquire()
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
