"""The wire: one multiplexed, auto-pipelined connection to one Redis server.

Every caller's script goes out on the same socket. A command is written at once, alone,
unless one went out alone since the last read or batch (a lone caller waits for nobody);
then it opens a batch that the rest of its event-loop iteration joins, written in chunks
of ``CHUNK`` (the last when the iteration ends), so 64 concurrent callers cost three
``send`` calls, not 64, and the server works on a chunk while the next is built. Replies
come back in order and are matched to their callers by a FIFO of writes (each with its
callers' futures, in order); hiredis parses them straight from the socket's data.

What a caller may rely on:

- **Never a resend.** A command is written once. If its reply is lost (the connection
  breaks, or no reply comes within ``timeout``), its caller gets an error, never a second
  copy of its script: a script may have run with only its reply lost.
- **Each caller its own reply or its own error.** An error reply (``hiredis.ReplyError``)
  is that caller's value; the others' replies are untouched. Every write ends with an
  ``ECHO`` of a tag unique to the connection, and the replies of a write are handed out
  only once its tag has come back where it should: a reply lost in between (a proxy that
  drops one, a server bug) shifts the tag, and then the connection is dropped and its
  calls fail rather than any caller getting another's reply. It costs one tiny command per
  write: one per call for a lone caller, one per batch for a crowd.
- **A cancelled caller costs nothing shared.** Its reply is read and dropped; the
  connection stays open for the others.
- **Bounded.** A reply that does not come within ``timeout`` of its command means the
  connection has stopped answering (a blackhole, a half-open socket, a frozen server):
  the connection is dropped and every call on it fails at once. One timer per connection
  watches the oldest pending reply only (replies come in order, so it is always the first
  to be overdue).

The connection set-up (TLS, AUTH with an ACL user, CLIENT SETNAME, SELECT, and the server
check: HELLO for the version, TIME for the clock) is ``Endpoint``'s handshake, sent as the
first commands in one write (no round trip of its own).
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, cast

import hiredis

from .endpoint import Endpoint
from .resp import pack_command

ReplyError = hiredis.ReplyError

#: The commands batched in one event-loop iteration are written in chunks of this many, not
#: all at its end: the server runs the first chunk's scripts while the callers of the same
#: iteration are still building the next ones, so client and server work side by side
#: instead of in turn. 1.4x the decisions/s at 64 concurrent callers and 1.7x at 256,
#: measured side by side (docs/performance.md); a crowd of 16 to 48 does as well.
CHUNK = 32


#: What the FIFO holds per write: the futures of its callers' replies, in order (the
#: preface's first), the deadline of its replies, and the tag its closing ECHO must answer.
#: One entry per write, not per command: a command costs an append to its write's list, and
#: one clock reading serves the whole write (2 % of the client CPU of a decision at 64
#: concurrent callers, 5 % at 256, measured side by side in one process).
_Write = tuple[list["asyncio.Future[Any]"], float, bytes]


class Wire(asyncio.Protocol):
    """One connection; ``send`` returns the future of its reply (see the module)."""

    def __init__(self, address: str, timeout: float) -> None:
        self.address = address
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._reader = hiredis.Reader()
        self._pending: collections.deque[_Write] = collections.deque()
        # Replies read for the oldest write, not handed out until its tag has come back.
        self._replies: list[Any] = []
        self._tag_head = b"arl-%s:" % secrets.token_hex(8).encode()
        self._tags = 0
        # The commands of this iteration not written yet (None: no batch open), and their
        # callers.
        self._batch: list[bytes] | None = None
        self._callers: list[asyncio.Future[Any]] = []
        # A command went out alone since the last read (or the last batch written): the
        # next one opens a batch. A read or a flush always comes in a later loop iteration
        # than the write before it, so this tells "the first of an iteration" as a flush
        # scheduled per lone write did, without scheduling one: a lone caller's call no
        # longer pays a loop callback (see ``send``).
        self._wrote = False
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        #: why the connection is closed (None while it is open)
        self.error: Exception | None = None
        #: the replies of the write whose closing ECHO was refused, in order (see
        #: ``connect``: a connection that failed AUTH refuses every later command)
        self.refused: list[Any] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (asyncio's, uvloop's or a TLS one: not all subclass Transport).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._wrote = False
        reader = self._reader
        reader.feed(data)
        pending = self._pending
        replies = self._replies
        while True:
            reply = reader.gets()
            if reply is False:
                return
            if not pending:  # a reply nobody asked for: the stream is out of step
                self.abort(ConnectionError(f"{self.address} sent an unexpected reply"))
                return
            callers, _, tag = pending[0]
            if len(replies) < len(callers):
                replies.append(reply)
                continue
            # The write's last reply: its tag, unless a reply was lost (or added), and
            # then none can be trusted (its callers still pending: they fail too).
            if reply != tag:
                if type(reply) is ReplyError:  # the tag refused (an ACL without ECHO)
                    self.refused = replies
                    self.abort(reply)
                else:
                    self.abort(ConnectionError(f"replies from {self.address} are out of step"))
                return
            pending.popleft()
            for caller, answer in zip(callers, replies, strict=True):
                if not caller.done():  # (a cancelled caller's reply is dropped)
                    caller.set_result(answer)
            replies = self._replies = []

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"connection to {self.address} lost: {exc or 'closed'}"))

    # -- calls ---------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Nothing in flight: no reply owed, nothing batched."""
        return not self._pending and not self._callers

    @property
    def pending(self) -> int:
        """Callers' replies not handed out yet (cancelled callers' included)."""
        return sum(len(callers) for callers, _, _ in self._pending) + len(self._callers)

    def send(self, data: bytes, *, preface: bytes | None = None) -> asyncio.Future[Any]:
        """Write one command (or join this iteration's batch) and return its reply's future.

        ``preface``: a command written right before it, with nothing in between (ASKING,
        which holds for the connection's next command only); its reply must be ``OK``.
        """
        if self.error is not None:
            raise ConnectionError(str(self.error))
        waiter = self._loop.create_future()
        batch = self._batch
        if batch is None and self._wrote:
            # A second command before any reply: the rest of this iteration joins it.
            batch = self._batch = []
            self._loop.call_soon(self._flush)
        callers = self._callers if batch is not None else []
        if preface is not None:
            ok = self._loop.create_future()
            ok.add_done_callback(_expect_ok)
            callers.append(ok)
            data = preface + data
        callers.append(waiter)
        if batch is None:
            # Written alone, at once: no flush scheduled (a loop callback per call before):
            # 1.9 µs less CPU per sequential decision on asyncio's loop, 0.3 on uvloop's.
            assert self._transport is not None
            self._transport.write(data + self._tag(callers))
            self._wrote = True
        else:
            batch.append(data)
            if len(batch) >= CHUNK:
                self._write_batch()
        return waiter

    def send_now(self, data: bytes) -> asyncio.Future[Any]:
        """``send``, written at once with what this iteration batched before it, not one
        loop iteration later (``_stores.batch``'s call, made at the iteration's end)."""
        waiter = self.send(data)
        if self._batch:
            self._write_batch()
        return waiter

    def send_together(self, commands: list[bytes]) -> list[asyncio.Future[Any]]:
        """Write ``commands`` in one write of their own, closed by one tag, and return
        their replies' futures in order (the handshake: if the tag is refused, the replies
        read before it are kept in ``refused``, all of them)."""
        if self.error is not None:
            raise ConnectionError(str(self.error))
        assert self._transport is not None
        assert self._batch is None  # a fresh wire: nothing batched before it
        callers = [self._loop.create_future() for _ in commands]
        self._transport.write(b"".join(commands) + self._tag(callers))
        return callers

    def _tag(self, callers: list[asyncio.Future[Any]]) -> bytes:
        """The ECHO that closes a write, its callers' replies and its tag queued as owed."""
        self._tags += 1
        tag = b"%b%d" % (self._tag_head, self._tags)
        deadline = self._loop.time() + self._timeout
        self._pending.append((callers, deadline, tag))
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._check)
        return b"*2\r\n$4\r\nECHO\r\n$%d\r\n%b\r\n" % (len(tag), tag)

    def _write_batch(self) -> None:
        """Write the commands batched so far now; the iteration goes on batching."""
        batch = self._batch
        assert batch is not None
        assert self._transport is not None
        batch.append(self._tag(self._callers))
        self._callers = []
        self._transport.write(b"".join(batch))
        batch.clear()

    def _flush(self) -> None:
        batch, self._batch = self._batch, None
        self._wrote = False
        if batch and self.error is None and self._transport is not None:
            batch.append(self._tag(self._callers))
            self._callers = []
            self._transport.write(b"".join(batch))

    def _check(self) -> None:
        """The timer: fail the connection if its oldest pending reply is overdue."""
        self._timer = None
        if not self._pending or self.error is not None:
            return
        deadline = self._pending[0][1]
        if deadline <= self._loop.time():
            self.abort(TimeoutError(f"{self.address} did not answer within {self._timeout} s"))
        else:
            self._timer = self._loop.call_at(deadline, self._check)

    def abort(self, error: Exception) -> None:
        """Drop the connection now: every pending call fails with ``error``."""
        self._fail(error)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        """Close now (pending calls fail: nobody will read their replies). An abort, not a
        TLS goodbye: that needs round trips a shutting-down loop would never run, and its
        socket would be left open."""
        self._fail(ConnectionError(f"connection to {self.address} closed"))
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, collections.deque()
        self._replies = []
        unwritten, self._callers = self._callers, []
        for waiter in [w for callers, _, _ in pending for w in callers] + unwritten:
            if not waiter.done():  # each its own copy: raised in many tasks at once
                waiter.set_exception(type(self.error)(*self.error.args))


async def connect(endpoint: Endpoint, *, timeout: float, connect_timeout: float) -> Wire:
    """A new wire to ``endpoint``, its handshake answered, within ``connect_timeout``.

    A refused handshake (a wrong password, an unknown ACL user, a bad database) raises its
    ``hiredis.ReplyError``; a server the scripts cannot run on (older than Redis 6.2, a
    6.2 cluster, a zero clock) ``BackendError``; a network failure ``OSError`` or
    ``TimeoutError``.
    """
    loop = asyncio.get_running_loop()
    wire = Wire(endpoint.address, timeout)
    async with asyncio.timeout(connect_timeout):
        if endpoint.path is not None:
            await loop.create_unix_connection(lambda: wire, endpoint.path, ssl=endpoint.tls)
        else:
            await loop.create_connection(
                lambda: wire, endpoint.host, endpoint.port, ssl=endpoint.tls
            )
        try:
            replies = wire.send_together([pack_command(*c) for c in endpoint.handshake()])
            endpoint.checked([await reply for reply in replies])
        except BaseException:
            wire.abort(ConnectionError(f"the handshake with {endpoint.address} failed"))
            for reply in replies:
                if reply.done() and not reply.cancelled():
                    reply.exception()  # retrieved: the first failure is what is raised
            refused = wire.refused
            if refused is not None and len(refused) == len(replies):
                # The ECHO closing the handshake was refused, and with it the whole write
                # failed: after a wrong password every command answers NOAUTH, so the
                # reason is the handshake's own first refusal (WRONGPASS), raised here.
                endpoint.checked(refused)
            raise
    return wire


def _expect_ok(reply: asyncio.Future[Any]) -> None:
    """A preface's reply, read for its side effect only (its failure is retrieved here;
    the command after it then fails on its own)."""
    if not reply.cancelled():
        reply.exception()


class Link:
    """The one wire to an endpoint on the running loop: opened by the first call that needs
    it (concurrent callers share that connect), and opened anew after it broke. A call in
    flight when it broke is never resent: it failed with the wire."""

    __slots__ = (
        "_closed",
        "_connect_timeout",
        "_connecting",
        "_resolve",
        "_timeout",
        "_wire",
        "endpoint",
    )

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout: float,
        connect_timeout: float,
        resolve: Callable[[], Awaitable[Endpoint]] | None = None,
    ) -> None:
        #: where the wire connects (after ``resolve``, where it connected last)
        self.endpoint = endpoint
        self._resolve = resolve  # asked before every connect: the Sentinel master
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._wire: Wire | None = None
        self._connecting: asyncio.Task[Wire] | None = None
        self._closed = False

    @property
    def open(self) -> Wire | None:
        """The wire if it is open (the hot path: no await)."""
        wire = self._wire
        return wire if wire is not None and wire.error is None else None

    async def wire(self) -> Wire:
        """The open wire, connecting first if there is none."""
        wire = self.open
        if wire is not None:
            return wire
        if self._closed:
            raise ConnectionError(f"the connection to {self.endpoint.address} is closed")
        task = self._connecting
        if task is None:
            task = self._connecting = asyncio.ensure_future(self._connect())
            task.add_done_callback(_retrieve)
        # Shielded: a caller that gives up does not cancel the others' connect.
        return await asyncio.shield(task)

    async def _connect(self) -> Wire:
        try:
            if self._resolve is not None:
                async with asyncio.timeout(self._connect_timeout):
                    self.endpoint = await self._resolve()
            wire = await connect(
                self.endpoint, timeout=self._timeout, connect_timeout=self._connect_timeout
            )
            if self._closed:  # closed while it connected: nobody would close this one
                wire.close()
                raise ConnectionError(f"the connection to {self.endpoint.address} is closed")
            self._wire = wire
            return wire
        finally:
            self._connecting = None

    def drop(self, error: Exception) -> None:
        """Drop the wire (its server is no longer the one to talk to); the next call
        connects anew. Calls still on it fail with ``error``."""
        wire, self._wire = self._wire, None
        if wire is not None:
            wire.abort(ConnectionError(str(error)))

    def close(self) -> None:
        """Close now (calls in flight fail)."""
        self._closed = True
        wire, self._wire = self._wire, None
        if wire is not None:
            wire.close()
        if self._connecting is not None:
            self._connecting.cancel()


def _retrieve(task: asyncio.Task[Wire]) -> None:
    """A connect nobody waited for to the end (all callers gave up): its failure is known."""
    if not task.cancelled():
        task.exception()
