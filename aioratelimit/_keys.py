"""Every Redis key aioratelimit writes is named here, and only here; so is every random
token stored in them (``new_token``: locks, semaphore slots, idempotency claims, one-shot
tokens).

Layout: ``<prefix>:<kind>[:<name>]:{<user key>}<suffix>``.

The part in braces is the Redis Cluster hash tag. It is always the caller's own key, so all
keys of one decision (several rates, a lock and its fence) share one slot while different
user keys spread over the whole cluster; a constant tag would pile every key onto one shard.
Braces and ``%`` inside user-supplied parts are percent-escaped, which keeps the tag intact
(``{`` or ``}`` in a user key cannot end it early) and the mapping injective (two different
user keys never share a Redis key). A part must be text UTF-8 can encode (no lone
surrogate): a Redis key is its UTF-8 bytes, and memory:// keeps the same rule, so a key
that one backend takes is never refused by another.
"""

from __future__ import annotations

import secrets

from ._args import check_text

_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


def new_token(nbytes: int = 16) -> str:
    """A fresh random token of ``nbytes`` bytes (128 bits by default), URL-safe base64:
    no ``:``, ``~``, braces or ``%``, which the lock values and key names use as markers.
    ``secrets`` draws from the OS (about 1 µs, under 1 % of a decision) and so can never
    repeat across a ``fork`` or follow ``random.seed``."""
    return secrets.token_urlsafe(nbytes)


def escape(part: str) -> str:
    """Make ``part`` safe inside a key: no braces, and reversible; ``ValueError`` for a
    part that is not text (``check_text``), before anything is sent."""
    if not part.isascii():
        check_text(part)
    if "{" in part or "}" in part or "%" in part:
        return part.translate(_ESCAPES)
    return part


def head(prefix: str, kind: str, name: str | None) -> str:
    """The constant start of a primitive's keys, up to and including the ``:`` before the tag."""
    if name:
        return f"{escape(prefix)}:{kind}:{escape(name)}:"
    return f"{escape(prefix)}:{kind}:"


def tagged(head: str, key: str, suffix: str = "") -> str:
    """One key: ``head`` + the hash tag made from the user's ``key`` + ``suffix``."""
    return f"{head}{{{escape(key)}}}{suffix}"


def rate_suffix(limit: int, window_us: int, extra: str = "") -> str:
    """The per-rate suffix: a limiter keeps one key per (user key, rate)."""
    return f":{limit}/{window_us // 1000 if window_us % 1000 == 0 else f'{window_us}us'}{extra}"


def block(limiter_head: str, key: str) -> str:
    """A limiter's block of one user key (``Limiter.block``), under that key's tag."""
    return tagged(limiter_head, key, ":block")


def rate_channel(head: str, key: str) -> str:
    """The channel a limiter's deny caches listen on for ``key`` (its keys' hash tag): told
    by ``lua/rate_invalidate.lua`` when a reset (or a refund, a block) changes the key."""
    return tagged(head, key, ":inv")


#: The kinds of records, the second part of their keys (``head(prefix, kind, name)``).
TOKEN_KIND = "tok"
IDEMPOTENCY_KIND = "idem"
LOCK_KIND = "lock"
SEMAPHORE_KIND = "sem"


def token(tok_head: str, digest: str) -> str:
    """A one-shot token's record, named and hash-tagged by the token's hash (``digest``):
    the raw token never reaches Redis. A hex digest needs no escaping."""
    return f"{tok_head}{{{digest}}}"


def idempotency(idem_head: str, key: str) -> tuple[str, str]:
    """An idempotency key's record and the pub/sub channel its waiters listen on (one tag)."""
    return tagged(idem_head, key), tagged(idem_head, key, ":wake")


def lock(lock_head: str, name: str) -> tuple[str, str]:
    """A lock's key (its value also keeps the last fence) and its wake-up channel (one tag)."""
    return tagged(lock_head, name), tagged(lock_head, name, ":wake")


def semaphore(sem_head: str, name: str) -> tuple[str, str, str]:
    """A semaphore's holders (ZSET), its fences (HASH) and its wake-up channel (one tag)."""
    return tagged(sem_head, name), tagged(sem_head, name, ":fence"), tagged(sem_head, name, ":wake")
