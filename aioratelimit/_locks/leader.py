"""Leader election: one process of a fleet leads a name at a time, with a fencing epoch.

A term is a lock with an identity (``lua/leader_claim.lua``): its value is
``"<token>:<epoch>:<who>"``, so the lock scripts renew it (``lock_extend``) and resign it
(``lock_release``: the tombstone keeps the last epoch and identity), and a ``Candidate`` is a
``Lock`` in everything else: its followers in one process stand in one line (``line``) whose
head sleeps on the name's channel until a resignation wakes it (a lost message, or a leader
that died, costs at most ``lock.FALLBACK_WAIT`` or the term's TTL); ``Hold`` renews the term
and cancels the block when it is lost. What a leader adds:

- **the epoch**: ``max(last epoch + 1, server clock in µs)``, taken in the claim's script:
  it strictly increases across leaders (pass it to what the leader writes, and have that
  refuse a lower one: a leader paused past its TTL is then fenced off);
- **the identity** it publishes (``identity=``, default ``hostname:pid``), which any process
  reads with the epoch and the TTL left (``current``, ``aioratelimit inspect leader``);
- **changes told**: a new term publishes its epoch on the name's channel, a resignation
  publishes too; ``wait_change`` and ``watch`` sleep on it (and, as a term that expires
  tells nobody, until the term's TTL has passed).

Leaving the ``async with`` block, by its end, an exception or a cancellation (an
application's signal handler that cancels its main task, Ctrl-C under ``asyncio.run``),
resigns at once: the followers are woken and one of them leads within a round trip or two,
not a TTL. A process killed outright (SIGKILL, a power cut) resigns nothing: its term runs
out after at most ``ttl``.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from .. import _keys, _observe, _scripts
from .._args import check_key, check_text, check_timeout
from .._backend import Backend, get_backend
from .._errors import LockLost
from .._public import NoPublicConstructor
from .._scripts import Arg, Reply
from .._stores.confirm import DEFAULT_REPLICAS_TIMEOUT
from .lease import Hold, Names
from .lock import FALLBACK_WAIT, MIN_WAIT, _Resource

#: The longest identity a leader publishes (characters).
MAX_IDENTITY = 256


def default_identity() -> str:
    """``hostname:pid`` of this process, read at each claim (a fork has a pid of its own)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _check_identity(identity: object) -> str | None:
    if identity is None:
        return None
    if not isinstance(identity, str):
        raise TypeError(f"identity must be a str, not {type(identity).__name__}")
    if not identity or len(identity) > MAX_IDENTITY:
        raise ValueError(f"identity must be 1 to {MAX_IDENTITY} characters, got {len(identity)}")
    check_text(identity, "identity")
    return identity


@dataclass(frozen=True, slots=True)
class Term:
    """One leader's term of a name, as a process saw it.

    ``epoch`` strictly increases from one leader to the next (a fencing token: have what
    the leader writes refuse an epoch lower than one it has seen); ``identity`` is what the
    leader published (``identity=``, default ``hostname:pid``); ``ttl`` the seconds its term
    had left without renewal when read (for the term ``async with`` entered: its full TTL).
    """

    name: str
    epoch: int
    identity: str
    ttl: float


class Candidate(_Resource):
    """A ``Lock`` whose holder leads: its claim publishes an identity and tells the change."""

    __slots__ = ("identity",)
    _kind = "leader"
    _exclusive = True
    _acquire_script = _scripts.LEADER_CLAIM
    _release_script = _scripts.LOCK_RELEASE
    _extend_script = _scripts.LOCK_EXTEND

    def __init__(
        self,
        name: str,
        ttl: float,
        backend: Backend | None,
        identity: str | None,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        aof: bool = False,
    ) -> None:
        super().__init__(name, ttl, backend, replicas, replicas_timeout, aof)
        self.identity = identity

    def _build_keys(self, backend: Backend) -> tuple[list[str], list[str], str]:
        key, channel = _keys.leader(backend._head(_keys.LEADER_KIND), self.name)
        return [key], [key], channel

    def _acquire_args(self, token: str, ttl_ms: int, waits: bool) -> tuple[Arg, ...]:
        # ``_acquire`` built the names of its backend just before (``_names``): the claim
        # tells the change on their channel.
        assert self._cache is not None
        names = self._cache[1]
        who = self.identity or default_identity()
        return (token, ttl_ms, who, names.channel, names.publish)

    def __repr__(self) -> str:
        return f"<Candidate {self.name!r} ttl={self.ttl}>"


def _term(name: str, reply: Reply) -> Term | None:
    """The term of a ``leader_state`` reply; None: nobody leads."""
    if int(reply[0]) != 1:
        return None
    who = reply[3]
    identity = who.decode("utf-8", "replace") if isinstance(who, bytes) else str(who)
    pttl = int(reply[2])
    return Term(name, int(reply[1]), identity, max(pttl, 0) / 1000)


def _changed(seen: Term | None, now: Term | None) -> bool:
    if seen is None or now is None:
        return (seen is None) != (now is None)
    return seen.epoch != now.epoch


class Leader(metaclass=NoPublicConstructor):
    """``async with arl.leader(name) as term:`` runs the block only while this process
    leads ``name``; ``current``, ``wait_change`` and ``watch`` tell who leads, from any
    process. Made by ``arl.leader`` (``Leader._create``)."""

    __slots__ = ("_candidate", "_hold", "_term", "_timeout")

    def __init__(self, candidate: Candidate, timeout: float | None) -> None:
        self._candidate = candidate
        self._timeout = timeout
        self._hold: Hold | None = None
        self._term: Term | None = None

    @property
    def name(self) -> str:
        return self._candidate.name

    @property
    def ttl(self) -> float:
        return self._candidate.ttl

    @property
    def identity(self) -> str:
        """What this process publishes while it leads."""
        return self._candidate.identity or default_identity()

    @property
    def term(self) -> Term | None:
        """The term this process leads under now (None: it does not lead)."""
        return self._term

    async def __aenter__(self) -> Term:
        if self._hold is not None:
            raise RuntimeError(f"{self!r} is already entered")
        # Taken before the wait: a second entry meanwhile is refused, not run beside it.
        hold = self._hold = Hold._create(self._candidate, self._timeout, True)
        try:
            lease = await hold.__aenter__()
        except BaseException:
            self._hold = None
            raise
        term = self._term = Term(self.name, lease.fencing_token, self.identity, lease.ttl)
        _observe.leader(self.name, _observe.ELECTED)
        return term

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold, self._hold, self._term = self._hold, None, None
        if hold is None:
            return
        renewal = hold._renewal
        lost = renewal is not None and renewal.lost
        try:
            await hold.__aexit__(exc_type, exc, tb)
        except LockLost:
            _observe.leader(self.name, _observe.LOST)
            raise
        _observe.leader(self.name, _observe.LOST if lost else _observe.RESIGNED)

    def _backend(self) -> tuple[Backend, Names]:
        candidate = self._candidate
        backend = candidate._backend or get_backend()
        return backend, candidate._names(backend)

    async def current(self) -> Term | None:
        """Who leads now (None: nobody), read on the server."""
        backend, names = self._backend()
        return _term(self.name, await backend._run(_scripts.LEADER_STATE, names.owner_keys, ()))

    async def wait_change(
        self, seen: Term | Literal["current"] | None = "current", *, timeout: float | None = None
    ) -> Term | None:
        """Wait until the leader is another than ``seen`` (a term read before; None: no
        leader; ``"current"``, the default: whoever leads when called) and return who leads
        then (None: nobody, the term resigned or ran out). ``timeout``: seconds, then
        ``TimeoutError``.

        Woken by the change itself (a new term and a resignation tell the name's channel);
        a term that runs out tells nobody, so it also reads again when the term it saw
        would end, and at least every ``FALLBACK_WAIT`` s while nobody leads (a lost
        message)."""
        timeout = check_timeout(timeout)
        if seen is not None and seen != "current" and not isinstance(seen, Term):
            raise TypeError(f"seen must be a Term, None or 'current', not {seen!r}")
        backend, names = self._backend()
        async with asyncio.timeout(timeout):
            # Subscribed (confirmed) before the first read: no change between is missed.
            async with backend._notifier.subscribe(names.channel) as sub:
                now = await self.current()
                was = now if seen == "current" else seen
                while not _changed(was, now):
                    wait = FALLBACK_WAIT if now is None else max(now.ttl + 0.001, MIN_WAIT)
                    await sub.wait(wait)
                    now = await self.current()
                return now

    async def watch(self) -> AsyncIterator[Term | None]:
        """Every change of leader, from whoever leads when it starts: an async iterator of
        terms (None: nobody leads). Changes that follow each other closer than a read may
        be seen as one (the latest)."""
        now = await self.current()
        while True:
            yield now
            now = await self.wait_change(now)

    def __repr__(self) -> str:
        state = f"leading epoch={self._term.epoch}" if self._term is not None else "following"
        return f"<Leader {self.name!r} ttl={self.ttl} {state}>"


def leader(
    name: str,
    *,
    ttl: float = 30.0,
    identity: str | None = None,
    timeout: float | None = None,
    backend: Backend | None = None,
    replicas: int = 0,
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    aof: bool = False,
) -> Leader:
    """``async with arl.leader(name) as term:`` waits until this process leads ``name``,
    then runs the block while it does, with ``term.epoch`` its fencing epoch.

    The term is renewed every ttl/3; if it is lost anyway (Redis unreachable until the
    term's TTL less a margin, or a pause past it), the block is cancelled and ``LockLost``
    raised out of the ``async with``. Leaving the block resigns at once and wakes the
    followers. ``ttl``: seconds a term lives without renewal (how long a leader that died
    holds its followers off). ``identity``: what the leader publishes (default
    ``hostname:pid``). ``timeout``: seconds to wait to lead (``None`` forever), then
    ``LockTimeout``. ``replicas=``, ``replicas_timeout=``, ``aof=``: each claim and renewal
    confirmed by replicas, as a lock's (a claim not confirmed is given back).
    """
    check_key(name, "name")
    who = _check_identity(identity)
    candidate = Candidate(name, ttl, backend, who, replicas, replicas_timeout, aof)
    return Leader._create(candidate, check_timeout(timeout))
