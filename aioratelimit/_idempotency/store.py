"""Idempotency keys: the store of claims that ``@idempotent`` and the HTTP middleware are
built on.

One Redis hash per idempotency key holds its state, and each transition is one script,
fenced by the random owner token the claim was given:

- ``lua/idem_claim.lua``: claim the key (missing, or in progress past its lease), or
  replay the stored result, or report a fingerprint mismatch, or the lease still running;
- ``lua/idem_renew.lua``: push the lease further, while this owner holds it;
- ``lua/idem_complete.lua``: store the result for ``ttl``, while this owner holds it;
- ``lua/idem_release.lua``: drop the record without a result, while this owner holds it.

Completion and release PUBLISH on the key's channel, which wakes ``wait()``-ers.

A cancelled or failed ``claim`` releases what its owner token may hold, so a claim whose
reply was lost does not keep the key until its lease passes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from types import TracebackType

from .. import _keys, _observe, _scripts
from .._aio import finish, finish_within
from .._args import check_int, check_key, check_seconds, check_timeout, from_us, to_us
from .._backend import Backend, get_backend
from .._errors import BackendUnavailable, IdempotencyKeyMismatch, NotReplicated, ResultTooLarge
from .._scripts import Claim, Reply
from .._stores import confirm
from .._stores.confirm import DEFAULT_REPLICAS_TIMEOUT, replicas_option

log = logging.getLogger("aioratelimit")

#: Default cap on one stored result, in bytes (after serialization).
MAX_RESULT_BYTES = 1 << 20

#: Longest sleep of a waiter between two claims when no wake-up arrives (a lost message).
FALLBACK_WAIT = 1.0


# -- outcomes of a claim -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replay:
    """The key's call completed earlier; ``payload`` is what it stored (read-only)."""

    key: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class InProgress:
    """Another owner holds the key; its lease ends in ``retry_after`` seconds (unless renewed)."""

    key: str
    retry_after: float


class Claimed:
    """This attempt holds the key: run the call, then ``complete`` or ``release``."""

    __slots__ = ("_backend", "_record", "_renewal", "_wake", "key", "lost", "owner", "settled")

    def __init__(self, backend: Backend, key: str, record: str, channel: str, owner: str) -> None:
        self._backend = backend
        self._record = record
        # The scripts' last two arguments: where and how completion and release wake waiters.
        self._wake = (channel, backend._publish_command)
        self.key = key
        #: the token, unique to this attempt, that fences every later script of it
        self.owner = owner
        #: True once complete() or release() has answered (the record is no longer ours)
        self.settled = False
        #: True if a renewal was refused: the lease passed and the key may be someone else's
        self.lost = False
        self._renewal: asyncio.Task[None] | None = None  # while in ``store.running``

    def _stop_renewal(self) -> None:
        # Before completing or releasing: a renewal answered after those would be refused
        # and taken for a lost lease.
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None

    def __repr__(self) -> str:
        return f"<Claimed {self.key!r} settled={self.settled} lost={self.lost}>"


Outcome = Claimed | Replay | InProgress


def _claimed(reply: Reply) -> bool:
    """Whether ``idem_claim`` claimed the key (what a confirmation must cover)."""
    return bool(reply[0] == Claim.CLAIMED)


def _one(reply: Reply) -> bool:
    """Whether ``idem_complete`` stored the result (1)."""
    return bool(reply == 1)


def _fingerprint(fingerprint: str | bytes | None) -> str:
    """A fixed-size stand-in for the request's fingerprint ('' for none)."""
    if fingerprint is None:
        return ""
    if isinstance(fingerprint, str):
        fingerprint = fingerprint.encode("utf-8", "surrogatepass")
    elif not isinstance(fingerprint, (bytes, bytearray, memoryview)):
        raise TypeError(f"a fingerprint must be str or bytes, not {type(fingerprint).__name__}")
    return hashlib.sha256(fingerprint).hexdigest()


# -- the store -----------------------------------------------------------------------------


class IdempotencyStore:
    """Claims, leases and stored results of idempotency keys (see the module docstring)."""

    __slots__ = (
        "_backend",
        "_lease_us",
        "_replicas",
        "_ttl_us",
        "lease",
        "max_bytes",
        "name",
        "ttl",
    )

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        ttl: float = 86400.0,
        lease: float = 30.0,
        name: str | None = None,
        max_bytes: int = MAX_RESULT_BYTES,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        aof: bool = False,
    ) -> None:
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
        # What a claim and a completion wait for (``_stores.confirm``; None: nothing):
        # an unconfirmed claim is released and raises NotReplicated; an unconfirmed
        # completion raises it too, and its result stands (see ``complete``).
        self._replicas = replicas_option(replicas, replicas_timeout, aof)
        if backend is not None:
            backend._check_replicas(self._replicas)
        if name is not None:
            check_key(name, "name")
        self._backend = backend
        self.ttl = check_seconds(ttl, "ttl")
        self.lease = check_seconds(lease, "lease")
        self._ttl_us = to_us(self.ttl)
        self._lease_us = to_us(self.lease)
        self.name = name
        self.max_bytes = check_int(max_bytes, "max_bytes")

    def _keys(self, backend: Backend, key: str) -> tuple[str, str]:
        """The key's record and wake-up channel on ``backend``."""
        return _keys.idempotency(backend._head(_keys.IDEMPOTENCY_KIND, self.name), key)

    @property
    def backend(self) -> Backend:
        return self._backend or get_backend()

    def __repr__(self) -> str:
        shown = f"<IdempotencyStore name={self.name!r} ttl={self.ttl} lease={self.lease}"
        return f"{shown}{confirm.shown(self._replicas)}>"

    async def claim(
        self, key: str, fingerprint: str | bytes | None = None, *, _until: float | None = None
    ) -> Outcome:
        """One attempt at the key: ``Claimed``, ``Replay`` or ``InProgress``.

        Raises ``IdempotencyKeyMismatch`` if the key holds a record of another fingerprint.
        """
        if type(key) is not str or not key:
            check_key(key)  # raises
        fp = "" if fingerprint is None else _fingerprint(fingerprint)
        backend = self._backend or get_backend()
        confirm = self._replicas
        if confirm is not None:
            backend._check_replicas(confirm)
        record, channel = self._keys(backend, key)
        owner = _keys.new_token()
        try:
            args = (owner, fp, self._lease_us)
            # Not confirmed: NotReplicated, and released below like a lost reply.
            reply = await backend._run_write(
                _scripts.IDEM_CLAIM, (record,), args, confirm, _claimed, f"claiming {key!r}"
            )
        except BaseException:
            # The script may have run before the reply was lost: give back whatever this
            # owner may hold, rather than keep the key until the lease passes. Waited for
            # at most the backend's timeout (or until ``_until``, the bound of ``wait``);
            # its resends run on by themselves after that.
            loop = asyncio.get_running_loop()
            left = backend.timeout if _until is None else _until - loop.time()
            cleanup = _release_quietly(Claimed(backend, key, record, channel, owner), True)
            await finish_within(cleanup, left)
            raise
        code = reply[0]
        if _observe.recorder is not None:
            _observe.claimed(self.name, code)
        if code == Claim.COMPLETED:  # first: the hot path
            payload = reply[1]
            if type(payload) is not bytes:
                payload = payload.encode() if isinstance(payload, str) else bytes(payload)
            return Replay(key, payload)
        if code == Claim.CLAIMED:
            return Claimed(backend, key, record, channel, owner)
        if code == Claim.IN_PROGRESS:
            return InProgress(key, from_us(reply[1]))
        raise IdempotencyKeyMismatch(key=key)

    async def wait(
        self, key: str, fingerprint: str | bytes | None = None, timeout: float | None = None
    ) -> Outcome:
        """``claim``, and while another owner holds the key, wait for its completion or
        release (woken by pub/sub) and claim again. ``InProgress`` only after ``timeout``.

        Returns or raises within ``timeout`` + the backend's timeout, whatever the network
        does (past it, ``BackendUnavailable``)."""
        timeout = check_timeout(timeout)
        backend = self._backend or get_backend()
        loop = asyncio.get_running_loop()
        until = None if timeout is None else loop.time() + timeout + backend.timeout
        bound = asyncio.timeout_at(until)
        try:
            async with bound:
                return await self._wait(backend, key, fingerprint, timeout, until)
        except TimeoutError as exc:
            if not bound.expired():
                raise
            raise BackendUnavailable(
                f"Redis did not answer in time: waiting for idempotency key {key!r} took"
                f" over timeout + the backend's timeout ({timeout} + {backend.timeout} s)"
            ) from exc

    async def _wait(
        self,
        backend: Backend,
        key: str,
        fingerprint: str | bytes | None,
        timeout: float | None,
        until: float | None,
    ) -> Outcome:
        outcome = await self.claim(key, fingerprint, _until=until)
        if not isinstance(outcome, InProgress):
            return outcome
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        _, channel = self._keys(backend, key)
        # Subscribed (and confirmed) before the claim it guards: a completion published
        # between that claim and the wait still wakes this waiter.
        async with backend._notifier.subscribe(channel) as sub:
            while True:
                outcome = await self.claim(key, fingerprint, _until=until)
                if not isinstance(outcome, InProgress):
                    return outcome
                delay = min(outcome.retry_after, FALLBACK_WAIT)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        return outcome
                    delay = min(delay, left)
                await sub.wait(max(delay, 0.001))

    async def renew(self, claimed: Claimed) -> bool:
        """Start a new full lease now; False if this owner no longer holds the key."""
        reply = await claimed._backend._run(
            _scripts.IDEM_RENEW, (claimed._record,), (claimed.owner, self._lease_us)
        )
        return bool(reply == 1)

    async def complete(self, claimed: Claimed, payload: bytes) -> bool:
        """Store ``payload`` as the key's result for ``ttl`` and wake the waiters.

        False if this owner had lost the key (nothing stored). ``ResultTooLarge`` (a
        ``ValueError``) before any I/O when ``payload`` is over ``max_bytes``.

        With ``replicas=``, ``NotReplicated`` if the result was stored on the master but
        not confirmed. It is never taken back (releasing it would let a retry run the call
        again): it stands, ``claimed`` counts as settled, and later claims replay it. A
        failover that promotes a replica without it may still let the key be claimed
        again once its lease passes (the call may then run twice).
        """
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        size = len(payload)
        if size > self.max_bytes:
            raise ResultTooLarge(key=claimed.key, size=size, limit=self.max_bytes)
        claimed._stop_renewal()
        args = (claimed.owner, bytes(payload), self._ttl_us, *claimed._wake)
        what = f"the result of {claimed.key!r} is stored on the master, not confirmed"
        try:
            reply = await claimed._backend._run_write(
                _scripts.IDEM_COMPLETE, (claimed._record,), args, self._replicas, _one, what
            )
        except NotReplicated:
            claimed.settled = True  # the result stands: never released (see above)
            raise
        claimed.settled = True
        return bool(reply == 1)

    async def release(self, claimed: Claimed) -> bool:
        """Drop the record without a result and wake the waiters; False if not held."""
        return await _release(claimed)

    def running(self, claimed: Claimed) -> Running:
        """``async with store.running(claimed):`` renew in the background; release unless
        completed when the block ends."""
        return Running(self, claimed)

    async def _keep(self, claimed: Claimed) -> None:
        """The renewal loop: a new lease every lease/3, until refused or cancelled."""
        loop = asyncio.get_running_loop()
        interval = self.lease / 3
        expires = loop.time() + self.lease  # a local, conservative view of the lease's end
        while True:
            await asyncio.sleep(min(interval, max(expires - loop.time(), 0.0)))
            sent = loop.time()
            try:
                ok = await self.renew(claimed)
            except BackendUnavailable as exc:
                if loop.time() < expires:
                    log.debug("aioratelimit: renewing %r failed, retrying: %r", claimed.key, exc)
                    interval = min(interval, max(self.lease / 10, 0.01))
                    continue
                ok = False
            if not ok:
                if not claimed.settled:
                    claimed.lost = True
                    log.warning(
                        "aioratelimit: lost the lease of idempotency key %r while its call ran"
                        " (another call may run it too; its result will not be stored)",
                        claimed.key,
                    )
                return
            interval = self.lease / 3
            expires = sent + self.lease


class Running:
    """The block a claim's call runs in: background renewal, and release unless completed."""

    __slots__ = ("_claimed", "_store")

    def __init__(self, store: IdempotencyStore, claimed: Claimed) -> None:
        self._store = store
        self._claimed = claimed

    async def __aenter__(self) -> Claimed:
        claimed = self._claimed
        claimed._renewal = asyncio.get_running_loop().create_task(self._store._keep(claimed))
        return claimed

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._claimed._stop_renewal()
        if not self._claimed.settled:
            # Even when the block was cancelled: the cancellation goes on once released.
            await finish(_release_quietly(self._claimed, False))


async def _release(claimed: Claimed) -> bool:
    claimed._stop_renewal()
    # Sent again if its reply is lost (a reset): a lost release would keep the key
    # "in progress" until its lease passes. Owner-fenced, so a repeat changes nothing.
    reply = await claimed._backend._run_repeatable(
        _scripts.IDEM_RELEASE, (claimed._record,), (claimed.owner, *claimed._wake)
    )
    claimed.settled = True
    return bool(reply == 1)


async def _release_quietly(claimed: Claimed, quiet: bool) -> None:
    """Release, logging a failure (the lease frees the key anyway). ``quiet``: at DEBUG
    only (after a failed claim, which most likely never reached the server)."""
    try:
        await _release(claimed)
    except Exception as exc:  # the lease frees the key anyway
        (log.debug if quiet else log.warning)(
            "aioratelimit: could not release idempotency key %r (%r); it frees itself when"
            " its lease passes",
            claimed.key,
            exc,
        )
