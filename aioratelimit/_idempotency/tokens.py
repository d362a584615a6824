"""One-shot tokens: ``issue_token``, ``consume_token`` and ``@consumes_token``.

A token is ``secrets.token_urlsafe`` of 24 bytes (192 random bits). Redis never sees it: the
record is named (and hash-tagged) by the SHA-256 of the token (192 random bits need no key:
no guess can be tested), and holds a digest of the subject it was issued for, keyed by the
backend's secret (``Backend._keyring``; a plain SHA-256 without one), so a dump of the
server holds neither usable tokens nor, with a secret, anything a guessed subject can be
tested against. ``lua/token_issue.lua`` stores the record with its TTL;
``lua/token_consume.lua`` deletes it only when it exists and the subject matches, in one
step, so of any number of concurrent consumers exactly one gets True, and a wrong subject
leaves the token usable.

While a secret is rotated (``secret=[new, old]``), a token is issued under the newest, and
consumed under whichever secret it was issued under: a consume whose digest under the
newest is answered "another subject" tries the next secret's, so a token issued before the
rotation stays usable as long as its secret is listed (one more round trip for it only).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from .. import _keys, _scripts
from .._args import binder, check_seconds, to_us
from .._backend import Backend, get_backend
from .._errors import AioRateLimitError, NotReplicated, TokenRejected
from .._keys import UNKEYED, Keyring
from .._scripts import Consumed, Reply
from .._stores.confirm import DEFAULT_REPLICAS_TIMEOUT, replicas_option

log = logging.getLogger("aioratelimit")

P = ParamSpec("P")
R = TypeVar("R")

#: Random bytes per token (192 bits; the contract asks for at least 128).
TOKEN_BYTES = 24

# What any token of ours looks like (with room for longer ones); anything else is answered
# False without a round trip.
_WELL_FORMED = re.compile(r"[A-Za-z0-9_-]{16,256}")


def _key(backend: Backend, token: str) -> str:
    """The record of ``token`` on ``backend``: named by the token's SHA-256."""
    head = backend._head(_keys.TOKEN_KIND)
    return _keys.token(head, hashlib.sha256(token.encode("ascii")).hexdigest())


def _check_subject(subject: object) -> str | None:
    if subject is not None and not isinstance(subject, str):
        raise TypeError(f"subject must be a str or None, not {type(subject).__name__}")
    return subject


def _subjects(keyring: Keyring, subject: str | None) -> tuple[str, ...]:
    """The stored stand-ins for a subject, newest secret first: ('',) for none, else its
    digest under each secret of ``keyring`` (one plain SHA-256 without a secret)."""
    if subject is None:
        return ("",)
    data = b"subject:" + subject.encode("utf-8", "surrogatepass")
    return keyring.digests("token-subject", data)


def _subject(subject: object, keyring: Keyring = UNKEYED) -> str:
    """The stand-in ``subject`` is stored as, under the newest secret of ``keyring``."""
    return _subjects(keyring, _check_subject(subject))[0]


def _backend(backend: Backend | None) -> Backend:
    if backend is None:
        return get_backend()
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Backend, not {type(backend).__name__}")
    return backend


def _stored(reply: Reply) -> bool:
    """Whether ``token_issue`` stored the record, or ``token_consume`` deleted it (1)."""
    return bool(reply == 1)


async def issue_token(
    ttl: float = 600.0,
    subject: str | None = None,
    backend: Backend | None = None,
    *,
    replicas: int = 0,
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    aof: bool = False,
) -> str:
    """A new one-shot token, valid for ``ttl`` seconds, bound to ``subject`` if given.

    Only ``consume_token`` with the same ``subject`` (``None`` matches only ``None``)
    accepts it, once.

    ``replicas=N`` (``aof=True``): the record must reach N replicas (and the AOF) within
    ``replicas_timeout`` seconds, else it is withdrawn and ``NotReplicated`` raised: no
    token is handed out that a failover could lose.
    """
    ttl_us = to_us(check_seconds(ttl, "ttl"))
    subject = _check_subject(subject)
    confirm = replicas_option(replicas, replicas_timeout, aof)
    b = _backend(backend)
    b._check_replicas(confirm)
    subject_hash = _subject(subject, b._keyring)  # under the newest secret
    for _ in range(3):
        token = _keys.new_token(TOKEN_BYTES)
        key = _key(b, token)
        args = (subject_hash, ttl_us)
        try:
            what = "the token was withdrawn, not issued"
            stored = await b._run_write(_scripts.TOKEN_ISSUE, (key,), args, confirm, _stored, what)
        except NotReplicated:
            # Withdrawn, and never handed out: nobody else knows its 192 bits, so even a
            # record a failed withdrawal leaves behind can never be consumed.
            try:
                await b._run(_scripts.DELETE, (key,), ())
            except AioRateLimitError as gone:
                log.debug("aioratelimit: withdrawing an unconfirmed token failed: %r", gone)
            raise
        if stored == 1:
            return token
        # A record with this hash exists: 2**-192 odds, but never hand out a used token.
    raise RuntimeError("could not store a new token: the store refused three fresh ones")


async def consume_token(
    token: object,
    subject: str | None = None,
    backend: Backend | None = None,
    *,
    replicas: int = 0,
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    aof: bool = False,
) -> bool:
    """True exactly once for a live token issued for ``subject``; False otherwise.

    False for an unknown, expired or used token and for one issued for another subject
    (which stays usable by its own subject). A malformed token (not a str, empty, huge,
    foreign characters) is False too, without a round trip; it never raises for one.

    ``replicas=N`` (``aof=True``): a consume that is not confirmed raises ``NotReplicated``
    instead of returning True. The token stays spent on the master (it is never put
    back): treat it as spent, and do not act on it. A failover that promotes a replica
    without the consume may let the token be consumed once more, by a caller that then
    acts on it once: never twice.
    """
    subject = _check_subject(subject)
    confirm = replicas_option(replicas, replicas_timeout, aof)
    b = get_backend() if backend is None else _backend(backend)
    b._check_replicas(confirm)
    if not isinstance(token, str) or _WELL_FORMED.fullmatch(token) is None:
        return False
    key = _key(b, token)
    # Under each secret in turn, only while the answer is "issued for another subject",
    # which burns nothing: a token issued before a rotation matches an older secret's.
    for subject_hash in _subjects(b._keyring, subject):
        args = (subject_hash,)
        what = "the token was consumed on the master but not confirmed: treat it as spent"
        answer = await b._run_write(_scripts.TOKEN_CONSUME, (key,), args, confirm, _stored, what)
        if answer != Consumed.WRONG_SUBJECT:
            return bool(answer == Consumed.CONSUMED)
    return False


def consumes_token(
    token: Callable[..., object],
    subject: str | Callable[..., str | None] | None = None,
    *,
    backend: Backend | None = None,
    replicas: int = 0,
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    aof: bool = False,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Decorate an async function to run only if its token is consumed now.

    ``token`` is given the call's arguments as the function receives them (defaults filled
    in) and returns the token presented; ``subject`` is ``None``, a string, or a callable
    given the same arguments. When the token is not consumed, the function does not run and
    ``TokenRejected`` is raised. A call the function would refuse raises its ``TypeError``
    before the token is consumed; a plain ``def`` is refused with ``TypeError`` here.
    ``replicas``, ``replicas_timeout`` and ``aof`` are ``consume_token``'s: a consume
    that is not confirmed raises ``NotReplicated`` and the function does not run.
    """
    if not callable(token):
        raise TypeError(f"token must be a callable, not {type(token).__name__}")
    if subject is not None and not (isinstance(subject, str) or callable(subject)):
        raise TypeError(f"subject must be a str, a callable or None, not {type(subject).__name__}")
    if backend is not None:
        _backend(backend)
    replicas_option(replicas, replicas_timeout, aof)  # checked at decoration
    subject_of, fixed_subject = (subject, None) if callable(subject) else (None, subject)

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@consumes_token decorates an async function, not {fn!r}")
        bind = binder(fn)

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            bound, named = bind(args, kwargs)
            who = fixed_subject if subject_of is None else subject_of(*bound, **named)
            presented = token(*bound, **named)
            if not await consume_token(
                presented,
                who,
                backend,
                replicas=replicas,
                replicas_timeout=replicas_timeout,
                aof=aof,
            ):
                raise TokenRejected("the token is unknown, expired, used or someone else's")
            return await fn(*args, **kwargs)

        return guarded

    return decorate
