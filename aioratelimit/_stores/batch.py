"""Batching: the decisions one event-loop iteration sends to one server, in one script call.

Every decision is one script (``lua/``). Sent one EVALSHA each, a crowd of callers costs
the server a command's overhead per decision (parsing, the script's lookup and Lua call
set-up, ``TIME``), more than the few reads and writes the decision needs. A ``Batcher``
joins the decisions issued for its connection during one iteration of the event loop
into ``lua/batch.lua`` calls of at most ``BATCH_MAX`` decisions, which run them one after
another at one instant of the server's clock, and hands each caller its own element of
the reply.

What a caller may rely on, as with a call of its own:

- **Exact.** A batch runs its decisions in order inside one script call: each gets the
  reply it would get from the same calls made serially at that instant, however many are
  on one key (a hot key's crowd is decided one by one, never approximated).
- **A lone caller never waits.** A decision is written at once, alone, when nothing is in
  flight on its connection (a sequential caller's every call, a crowd's first); only those
  issued while others are in flight wait for the iteration's end, which they would have
  done on the wire anyway. The lone path schedules nothing on the loop.
- **Its own reply or its own error.** An error inside one decision ends that decision
  only (``batch.lua``). An error for the whole call (NOSCRIPT, a redirection, a busy
  server, a refusal) means no decision ran: NOSCRIPT is answered by EVAL of the batch;
  anything else by sending every decision of the batch alone, as if it had never been
  batched, so each caller meets exactly the error (or the redirection) its own call
  meets. If those calls succeed where the batch did not, the server (or a proxy in front
  of it) refuses what a batch does, and this connection is served unbatched from then on.
- **Never sent twice.** A batch whose reply is lost fails each of its callers with the
  connection's error, as their own calls would.
- **A cancelled caller costs nothing.** A decision cancelled before its batch is written
  is left out of it.

``BATCH_MAX`` bounds one call's work on the server: 32 decisions of the heaviest batched
script take about 0.25 ms of one core (a sliding window with several rates; a fixed
window's decision is about 2 µs in a batch), well under the millisecond one call may
block the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from .._scripts import BATCH_IDS, Arg, Reply, Script
from .resp import pack, pack_batch
from .wire import ReplyError, Wire

log = logging.getLogger("aioratelimit")

#: The most decisions in one batch call (see the module: about 0.25 ms of the server's
#: time at worst). A full batch is written at once, as the wire writes a full chunk: the
#: server runs it while the callers of the same iteration build the next. At 64 a crowd of
#: 64 went as one call written at the iteration's end, the server idle while the client
#: built it and the client idle while the server ran it: 0.8x the decisions/s of one call
#: per decision; at 32, 1.05-1.2x, with a quarter less server CPU (measured side by side,
#: docs/performance.md).
BATCH_MAX = 32

#: Error replies for a whole batch that say where its keys are (a Cluster migrating or
#: failing over), not that batching is refused: the decisions go alone, batching stays.
_REDIRECTIONS = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "READONLY")

_Decision = tuple[Script, Sequence[str], Sequence[Arg], "asyncio.Future[Reply]"]
#: The decisions of one script with the same arguments and as many keys: a group in
#: ``batch.lua``'s call, its arguments sent once.
_Group = tuple[Script, Sequence[Arg], list[tuple[Sequence[str], "asyncio.Future[Reply]"]]]


class Batcher:
    """The batching of one connection target (one server, or one Cluster node)."""

    __slots__ = ("_count", "_groups", "_head", "_loop", "_open", "_wire", "enabled")

    def __init__(self, script: Script, *, enabled: bool = True) -> None:
        #: False: every decision goes alone (turned off, or a refusal was detected)
        self.enabled = enabled
        self._head = script  # batch.lua as this target runs it (BATCH or BATCH_CLUSTER)
        self._loop = asyncio.get_running_loop()
        # Whether the iteration's end is scheduled to write the batch, the decisions
        # waiting for it by group, how many, and the wire they go on.
        self._open = False
        self._groups: dict[tuple[str, tuple[Arg, ...], int], _Group] = {}
        self._count = 0
        self._wire: Wire | None = None

    def send(
        self, wire: Wire, script: Script, keys: Sequence[str], args: Sequence[Arg]
    ) -> asyncio.Future[Reply]:
        """The future of ``script``'s reply: written at once when nothing is in flight on
        ``wire`` (a lone caller's call: no batch, no loop callback), else in the batch
        this iteration is building."""
        if not (self.enabled and script.name in BATCH_IDS) or (not self._count and wire.idle):
            return wire.send(pack(script.evalsha_head, keys, args))
        waiter: asyncio.Future[Reply] = self._loop.create_future()
        if self._count and wire is not self._wire:  # a new wire: the old one's batch first
            self._write()
        self._wire = wire
        shared = args if type(args) is tuple else tuple(args)
        group = self._groups.get((script.name, shared, len(keys)))
        if group is None:
            group = self._groups[script.name, shared, len(keys)] = (script, shared, [])
        group[2].append((keys, waiter))
        self._count += 1
        if not self._open:
            self._open = True
            self._loop.call_soon(self._flush)
        if self._count >= BATCH_MAX:
            self._write()
        return waiter

    def _flush(self) -> None:
        """The iteration's end: what it batched goes out."""
        self._open = False
        if self._count:
            self._write()

    def _write(self) -> None:
        # Cancelled callers are left out; the decisions in the order their replies come.
        batch: list[_Decision] = []
        groups: list[tuple[int, int, Sequence[Arg], list[Sequence[str]]]] = []
        for script, args, calls in self._groups.values():
            live = [(keys, waiter) for keys, waiter in calls if not waiter.done()]
            if live:
                groups.append((BATCH_IDS[script.name], len(live[0][0]), args, [k for k, _ in live]))
                batch += [(script, keys, args, waiter) for keys, waiter in live]
        self._groups = {}
        self._count = 0
        wire, self._wire = self._wire, None
        if not batch or wire is None:
            return
        if len(batch) == 1:  # a batch of one is a call of its own
            self._alone(wire, batch[0])
            return
        self._send(wire, batch, groups, retried=False)

    def _send(
        self,
        wire: Wire,
        batch: list[_Decision],
        groups: list[tuple[int, int, Sequence[Arg], list[Sequence[str]]]],
        *,
        retried: bool,
    ) -> None:
        """The batch call: by EVALSHA, or (``retried``, after NOSCRIPT) by EVAL."""
        head = self._head.eval_head if retried else self._head.evalsha_head
        try:
            reply = wire.send_now(pack_batch(head, groups))
        except ConnectionError as exc:
            _fail(batch, exc)
            return
        reply.add_done_callback(
            lambda done: self._answered(wire, batch, groups, done, retried=retried)
        )

    def _answered(
        self,
        wire: Wire,
        batch: list[_Decision],
        groups: list[tuple[int, int, Sequence[Arg], list[Sequence[str]]]],
        done: asyncio.Future[Reply],
        *,
        retried: bool,
    ) -> None:
        if done.cancelled():  # (the wire never cancels; kept for safety)
            _fail(batch, ConnectionError("a batch call was cancelled"))
            return
        error = done.exception()
        if error is not None:  # the connection broke or timed out: nothing is resent
            _fail(batch, error)
            return
        replies = done.result()
        if type(replies) is list and len(replies) == len(batch):
            for (_, _, _, waiter), answer in zip(batch, replies, strict=True):
                if not waiter.done():
                    waiter.set_result(answer)
            return
        if type(replies) is not ReplyError:  # not what batch.lua answers: trust none of it
            _fail(batch, ConnectionError(f"{wire.address} answered a batch out of shape"))
            return
        # An error for the whole call: no decision ran (see the module).
        if str(replies).startswith("NOSCRIPT") and not retried:
            self._send(wire, batch, groups, retried=True)
            return
        self._unbatched(wire, batch, replies)

    def _unbatched(self, wire: Wire, batch: list[_Decision], refusal: Any) -> None:
        """Every decision of a batch nothing ran of, sent alone; if one then succeeds (and
        the batch's error was no redirection), batching is refused here: turned off."""
        redirected = str(refusal).startswith(_REDIRECTIONS)

        def judged(done: asyncio.Future[Reply]) -> None:
            if redirected or not self.enabled or done.cancelled() or done.exception():
                return
            if type(done.result()) is not ReplyError:
                self.enabled = False
                log.warning(
                    "aioratelimit: %s refuses batched script calls (%s); its decisions go"
                    " one call each from now on",
                    wire.address,
                    refusal,
                )

        for decision in batch:
            reply = self._alone(wire, decision)
            if reply is not None:
                reply.add_done_callback(judged)

    def _alone(self, wire: Wire, decision: _Decision) -> asyncio.Future[Reply] | None:
        """One decision as its own call, its reply handed to its caller (None: the
        connection had closed, and the caller has its error)."""
        script, keys, args, waiter = decision
        try:
            reply = wire.send(pack(script.evalsha_head, keys, args))
        except ConnectionError as exc:
            if not waiter.done():
                waiter.set_exception(exc)
            return None
        _chain(reply, waiter)
        return reply


def _chain(reply: asyncio.Future[Reply], waiter: asyncio.Future[Reply]) -> None:
    def copy(done: asyncio.Future[Reply]) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.cancel()
        elif (error := done.exception()) is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(done.result())

    reply.add_done_callback(copy)


def _fail(batch: list[_Decision], error: BaseException) -> None:
    for _, _, _, waiter in batch:
        if not waiter.done():  # each its own copy: raised in many tasks at once
            waiter.set_exception(type(error)(*error.args))
