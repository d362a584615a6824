"""``Pause``: a named pause that every process honours, set from an upstream's
``Retry-After``.

A pause is a limiter's block (``Limiter.block``, ``lua/limiter_block.lua``) kept under a name
of its own (a host, an account, a route) rather than under one limiter's user key: set or
extended, never shortened, lifted explicitly or by expiry, in one script that also tells
every process on the pause's channel (the message is the µs it still runs, read off the
server's clock in the script). A limiter made with ``pause=`` denies every hit while its
pause runs, and its waiters (``acquire(wait=True)``) sleep until the end.

No round trip while a pause is known: each process keeps, per backend and name, the end of
the pause on its own monotonic clock, converted once from what the server said (the reply
to the script that set it here, or a read), as the deny cache converts a denial. A message
on the channel only says that something changed: the listener then reads the pause (one
read per change and process), so a message anyone else publishes there can make it read,
never believe a pause the server does not hold. A limiter's first decision under a name
starts the listener and waits for its first read (one round trip per name per process,
bounded by the backend's ``timeout``); after that a decision reads a dict and the clock.

Exact across processes as far as pub/sub is: the read is made after the subscription is
confirmed, so a pause set meanwhile is heard or read; a subscriber lost and built again
(``Notifier.epoch``) may have lost a message, so the listener reads again. A backend that
cannot be read leaves the pause unknown (not paused) and the listener tries again
(``RETRY``): a pause only adds denials, so missing one errs on the side of the upstream's
own 429s, never of a hit denied for nothing. At most ``MAX_NAMES`` names are listened to per
backend (least recently used first out; one that comes back is read again).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import OrderedDict

from .. import _keys, _scripts
from .._args import US, check_key, check_seconds, from_us, to_us
from .._backend import Backend, get_backend
from .._rates import Decision, new_decision
from .deny_cache import clock

log = logging.getLogger("aioratelimit")

#: Names one process listens to per backend; the least recently used leaves first.
MAX_NAMES = 10_000
#: Seconds between two reads of a pause whose backend failed to answer, and between two
#: checks that the subscriber still lives (a new one may have lost a message).
RETRY = 1.0


class Pause:
    """A pause shared by every process on the backend, under ``name``: while it runs, every
    limiter made with ``pause=`` this pause (or its name) denies at once, without a round
    trip, and its waiters sleep until the end.

    ``await pause.start(seconds)`` sets it or makes it longer (never shorter: a later, shorter
    ``Retry-After`` keeps the longer pause); ``await pause.lift()`` ends it; it also ends by
    itself. Every process hears both at once through the backend's pub/sub subscriber.
    """

    __slots__ = ("_backend", "name")

    def __init__(self, name: str, *, backend: Backend | None = None) -> None:
        check_key(name, "name")
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        self.name = name
        self._backend = backend

    @property
    def backend(self) -> Backend:
        return self._backend or get_backend()

    def _names(self, backend: Backend) -> tuple[str, str]:
        return _keys.pause(backend._head(_keys.PAUSE_KIND), self.name)

    async def start(self, seconds: float) -> float:
        """Pause for ``seconds`` from now (the server's), unless a longer pause runs: that one
        is kept. Answers the seconds the pause now runs. Known in this process at once, in the
        others as soon as the message reaches them."""
        block_us = to_us(check_seconds(seconds, "seconds"))
        if block_us < 1:
            raise ValueError(f"seconds must be at least 1 µs, got {seconds!r}")
        backend = self.backend
        key, channel = self._names(backend)
        sent = clock()
        reply = await backend._run(
            _scripts.LIMITER_BLOCK, [key], (block_us, channel, backend._publish_command)
        )
        left = from_us(reply[0])
        _board(backend).learn(self.name, sent + left)
        return left

    async def lift(self) -> None:
        """End the pause now, in every process (one script; lifting none is harmless)."""
        backend = self.backend
        key, channel = self._names(backend)
        # Sent once: a copy arriving after someone else started a pause would lift theirs.
        await backend._run(_scripts.RATE_INVALIDATE, [key], (1, channel, backend._publish_command))
        _board(backend).learn(self.name, 0.0)

    async def remaining(self) -> float:
        """Seconds the pause still runs, read from the server (0.0: not paused)."""
        backend = self.backend
        key, _ = self._names(backend)
        reply = await backend._run_repeatable(_scripts.LIMITER_BLOCKED, [key], ())
        return from_us(reply[0])

    def known(self) -> float:
        """Seconds the pause still runs as this process knows it, without I/O (0.0: not
        paused, or not listened to yet: a limiter made with ``pause=`` starts listening)."""
        watch = _board(self.backend).watches.get(self.name)
        left = 0.0 if watch is None else watch.until - clock()
        return left if left > 0 else 0.0

    def __repr__(self) -> str:
        left = self.known()
        return f"<Pause {self.name!r} {f'{left:.3f}s left' if left else 'not paused'}>"


def as_pause(value: object) -> Pause | None:
    """A limiter's ``pause=``: a ``Pause``, a name (then a ``Pause`` of that name) or None."""
    if value is None or isinstance(value, Pause):
        return value
    if isinstance(value, str):
        return Pause(value)
    raise TypeError(f"pause must be a Pause, a str or None, not {type(value).__name__}")


def denial(pause: Pause, backend: Backend, limit: int) -> Decision | None:
    """The hot path: the denial a hit gets while ``pause`` runs (as this process knows it),
    or None (not paused, or not known yet: then ``ready``)."""
    watch = _board(backend).watches.get(pause.name)
    if watch is None:
        return None
    left = watch.until - clock()
    if left <= 0:
        return None
    return new_decision(False, limit, 0, left, left, "pause")


async def ready(pause: Pause, backend: Backend) -> None:
    """Listen to ``pause`` on ``backend`` if this process does not yet, and wait for its
    first read (at most the backend's ``timeout`` and a little more)."""
    watch = _board(backend).watch(pause.name)
    if not watch.read.done():
        await asyncio.wait((watch.read,), timeout=backend.timeout + RETRY)


class _Watch:
    """One name listened to: until when it is paused (``clock``), whether it has been read."""

    __slots__ = ("read", "task", "until")

    def __init__(self, read: asyncio.Future[None]) -> None:
        self.until = 0.0
        self.read = read
        self.task: asyncio.Task[None] | None = None


class _Board:
    """The pauses one process knows of on one backend, by name (an LRU)."""

    __slots__ = ("backend", "loop", "watches")

    def __init__(self, backend: Backend) -> None:
        self.backend = weakref.ref(backend)
        self.watches: OrderedDict[str, _Watch] = OrderedDict()
        self.loop: asyncio.AbstractEventLoop | None = None

    def learn(self, name: str, until: float) -> None:
        """What this process just did to ``name`` (``until`` on ``clock``; 0.0: lifted)."""
        watch = self.watches.get(name)
        if watch is not None:
            watch.until = until

    def watch(self, name: str) -> _Watch:
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # a new loop: the old one's listeners are gone with it
            self.clear()
            self.loop = loop
        watch = self.watches.get(name)
        if watch is not None:
            self.watches.move_to_end(name)
            return watch
        watch = self.watches[name] = _Watch(loop.create_future())
        watch.task = loop.create_task(self._listen(name, watch))
        if len(self.watches) > MAX_NAMES:
            _, old = self.watches.popitem(last=False)
            if old.task is not None:
                old.task.cancel()
        return watch

    def clear(self) -> None:
        watches, self.watches = self.watches, OrderedDict()
        for watch in watches.values():
            if watch.task is not None and not watch.task.done():
                watch.task.cancel()

    async def _listen(self, name: str, watch: _Watch) -> None:
        backend = self.backend()
        if backend is None:
            return
        notifier = backend._notifier
        key, channel = _keys.pause(backend._head(_keys.PAUSE_KIND), name)
        try:
            async with notifier.subscribe(channel) as sub:
                while not notifier.closed:
                    epoch = notifier.epoch
                    sent = clock()
                    try:
                        reply = await backend._run_repeatable(_scripts.LIMITER_BLOCKED, [key], ())
                    except Exception as exc:  # unknown: not paused, read again soon
                        log.warning("aioratelimit: pause %r could not be read: %s", name, exc)
                        _done(watch.read)
                        await asyncio.sleep(RETRY)
                        continue
                    if not sub.woken:  # (a message meanwhile is newer than the read)
                        watch.until = sent + reply[0] / US
                    _done(watch.read)
                    while notifier.epoch == epoch and not notifier.closed:
                        if await sub.wait(RETRY):  # something changed: read what holds
                            break
        finally:
            _done(watch.read)
            if self.watches.get(name) is watch:
                del self.watches[name]


def _done(read: asyncio.Future[None]) -> None:
    if not read.done():
        read.set_result(None)


#: One board per backend, gone with it.
_boards: weakref.WeakKeyDictionary[Backend, _Board] = weakref.WeakKeyDictionary()


def _board(backend: Backend) -> _Board:
    board = _boards.get(backend)
    if board is None:
        board = _boards[backend] = _Board(backend)
    return board
