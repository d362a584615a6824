"""Every Redis key aioratelimit writes is named here, and only here; so is every random
token stored in them (``new_token``: locks, semaphore slots, idempotency claims, one-shot
tokens), and the digest that stands in a key or a record for a value that must not be
stored as it is (``Keyring``: keyed by the deployment's secret).

Layout: ``<prefix>:<kind>[:<name>]:{<user key>}<suffix>``.

The part in braces is the Redis Cluster hash tag. It is always the caller's own key, so all
keys of one decision (several rates, a lock and its fence) share one slot while different
user keys spread over the whole cluster; a constant tag would pile every key onto one shard.
A limiter made with ``hash_tag=`` (a function of the user key) names the tag itself, so
the keys of several user keys can share one slot (a multi-key decision on a cluster):
``<prefix>:<kind>[:<name>]:{<tag>}{<user key>}<suffix>``. The key keeps braces of its own,
so it stays delimited: the first ``}`` ends the tag, and what follows it is ``{`` in a
tagged key but the suffix, ``:``, in an untagged one (``by_tag``).
Braces and ``%`` inside user-supplied parts are percent-escaped, which keeps the tag intact
(``{`` or ``}`` in a user key cannot end it early) and the mapping injective (two different
user keys never share a Redis key). A part must be text UTF-8 can encode (no lone
surrogate): a Redis key is its UTF-8 bytes, and memory:// keeps the same rule, so a key
that one backend takes is never refused by another.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence

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


#: A part of a client's key longer than this (a huge header, say) is stored as its digest,
#: so a client cannot make the store hold keys of arbitrary size.
MAX_KEY_PART = 128


def key_part(value: str) -> str:
    """One client-supplied part of a key (an address, a header value, a path parameter, a
    user id), bounded in size and injective: two different values never give one part.

    Up to ``MAX_KEY_PART`` characters it is the value itself, a leading ``#`` doubled; a
    longer value is ``#`` and its SHA-256 in hex. A kept value never starts with one ``#``
    and a single hex digit after it, so a short value that spells ``#<digest>`` keeps a
    counter of its own rather than sharing the long value's.
    """
    if len(value) > MAX_KEY_PART:
        return "#" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return "#" + value if value.startswith("#") else value


def head(prefix: str, kind: str, name: str | None) -> str:
    """The constant start of a primitive's keys, up to and including the ``:`` before the tag."""
    if name:
        return f"{escape(prefix)}:{kind}:{escape(name)}:"
    return f"{escape(prefix)}:{kind}:"


def tagged(head: str, key: str, suffix: str = "") -> str:
    """One key: ``head`` + the hash tag made from the user's ``key`` + ``suffix``."""
    return f"{head}{{{escape(key)}}}{suffix}"


def by_tag(head: str, tag: str, key: str, suffix: str = "") -> str:
    """One key under a tag the caller names (``hash_tag=``): ``head`` + ``{tag}`` + the
    user's ``key`` in braces + ``suffix``. A suffix here always starts with ``:`` (the
    rates', ``:block``, ``:inv``), never ``{``: such a key never equals a ``tagged`` one,
    and two of them are equal only for the same tag, key and suffix."""
    return f"{head}{{{escape(tag)}}}{{{escape(key)}}}{suffix}"


def rate_suffix(limit: int, window_us: int, extra: str = "") -> str:
    """The per-rate suffix: a limiter keeps one key per (user key, rate)."""
    return f":{limit}/{window_us // 1000 if window_us % 1000 == 0 else f'{window_us}us'}{extra}"


#: The kind of a limiter's policy store (``policies``).
POLICY_KIND = "pol"


def policies(pol_head: str, limiter: str) -> tuple[str, str, str]:
    """A limiter's policy store, under one tag (the limiter's name): its named policies
    (hash), its per-key overrides (hash) and the channel every process hears changes on."""
    return (
        tagged(pol_head, limiter),
        tagged(pol_head, limiter, ":keys"),
        tagged(pol_head, limiter, ":inv"),
    )


def policy_suffixes(positions: int) -> tuple[str, ...]:
    """The suffixes of a policy limiter's keys: the stamp (the rates last applied), then one
    counter per rate *position*: names without the rate values, so a change of rates keeps
    (and converts) the counts."""
    return (":stamp", *(f":p{i}" for i in range(positions)))


def quota_suffix(limit: int, period: str, tz: str) -> str:
    """A calendar quota's suffix (``Quota``): one key per (user key, quota), the same in
    every period. The script picks the period by the server's clock, after the KEYS are
    named (a cluster routes by them), so a key per period could not be named in advance;
    the key expires at its period's end, and the next period's first hit starts it anew."""
    return f":{limit}/{period}@{escape(tz)}"


def block(limiter_head: str, key: str, tag: str | None = None) -> str:
    """A limiter's block of one user key (``Limiter.block``), under that key's tag (or the
    ``tag`` its limiter names: ``by_tag``)."""
    if tag is not None:
        return by_tag(limiter_head, tag, key, ":block")
    return tagged(limiter_head, key, ":block")


def strikes(limiter_head: str, key: str, tag: str | None = None) -> str:
    """A limiter's strike record of one user key (``ban=``: ``lua/ban_common.lua``), beside
    its block, under the same tag."""
    if tag is not None:
        return by_tag(limiter_head, tag, key, ":strikes")
    return tagged(limiter_head, key, ":strikes")


def settlement(limiter_head: str, key: str, settle_id: str, tag: str | None = None) -> str:
    """The record of one settlement of a reservation (``Reservation.settle``) of a user key,
    under that key's tag (or its limiter's ``tag``): its script applies a settlement once,
    and a repeat finds it."""
    if tag is not None:
        return by_tag(limiter_head, tag, key, f":settle:{settle_id}")
    return tagged(limiter_head, key, f":settle:{settle_id}")


def ban_index(limiter_head: str) -> tuple[str, str]:
    """A limiter's ban index (``Limiter.bans``: one hash, a field per banned user key) and
    the channel ``lua/list_add.lua`` tells of a change (nobody listens), tagged by the
    limiter's own head: one slot per limiter. ``~`` right after the head keeps it apart
    from every user key's keys, which have ``{`` there."""
    index = f"{limiter_head}~bans{{{limiter_head}}}"
    return index, index + ":inv"


def rate_channel(head: str, key: str, tag: str | None = None) -> str:
    """The channel a limiter's deny caches listen on for ``key`` (its keys' hash tag): told
    by ``lua/rate_invalidate.lua`` when a reset (or a refund, a block) changes the key."""
    if tag is not None:
        return by_tag(head, tag, key, ":inv")
    return tagged(head, key, ":inv")


def hash_tag(key: str) -> str:
    """The Redis Cluster hash tag of a key this module built (``tagged``, ``by_tag``): what
    lies between its first ``{`` and the ``}`` after it (neither is ever escaped away)."""
    start = key.index("{") + 1
    return key[start : key.index("}", start)]


#: The kinds of records, the second part of their keys (``head(prefix, kind, name)``).
TOKEN_KIND = "tok"
IDEMPOTENCY_KIND = "idem"
LOCK_KIND = "lock"
SEMAPHORE_KIND = "sem"
LEADER_KIND = "leader"
EVERY_KIND = "every"
INFLIGHT_KIND = "inflight"
PAUSE_KIND = "pause"
LIST_KIND = "list"


def pause(pause_head: str, name: str) -> tuple[str, str]:
    """A named pause's block (``lua/limiter_block.lua``) and the channel every process
    hears it on (one tag: the pause's name)."""
    return tagged(pause_head, name), tagged(pause_head, name, ":inv")


RWLOCK_KIND = "rw"
FAIR_KIND = "fair"


def access_list(list_head: str, name: str) -> tuple[str, str]:
    """An access list's entries (one hash: every process holds it whole) and the channel
    every process hears it change on (one tag: the list's name)."""
    return tagged(list_head, name), tagged(list_head, name, ":inv")


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


def leader(leader_head: str, name: str) -> tuple[str, str]:
    """A leader election's term (its value keeps the last epoch and leader) and the channel
    its followers and watchers listen on (one tag)."""
    return tagged(leader_head, name), tagged(leader_head, name, ":wake")


def every(every_head: str, name: str) -> str:
    """A fleet-wide interval job's record of the last interval claimed (``arl.every``)."""
    return tagged(every_head, name)


def fair(fair_head: str, name: str) -> tuple[list[str], str]:
    """A fair lock's key, its queue of waiters (ZSET) and their heartbeats (ZSET), and the
    prefix of its waiters' wake-up channels (one tag; a waiter's is the prefix + its token)."""
    lock, queue = tagged(fair_head, name), tagged(fair_head, name, ":queue")
    return [lock, queue, tagged(fair_head, name, ":beat")], tagged(fair_head, name, ":wake:")


def rwlock(rw_head: str, name: str) -> tuple[list[str], str]:
    """A read/write lock's holders (ZSET), fences (HASH) and waiting writers' intents (ZSET),
    and its wake-up channel (one tag)."""
    keys = [
        tagged(rw_head, name),
        tagged(rw_head, name, ":fence"),
        tagged(rw_head, name, ":intent"),
    ]
    return keys, tagged(rw_head, name, ":wake")


def in_flight(inflight_head: str, key: str) -> tuple[str, str, str]:
    """An in-flight limit's slots of one client key: a semaphore's holders, fences and
    wake-up channel (``semaphore``), under the same tag as that key's rate counters
    (``tagged(limiter_head, key, ...)``), so one script decides both."""
    return semaphore(inflight_head, key)


# -- the deployment's secret ---------------------------------------------------------------
#
# What keys every digest the library stores of a value it must not store as it is (a
# token's subject, a credential header, a web request's credentials). Without a secret
# such a digest is a plain SHA-256: a long random value (an API key of 128 random bits, a
# session cookie) cannot be recovered from it, but a short or guessable one (a user id, an
# e-mail address, a 6-digit code) is found by hashing guesses, by anyone who can read the
# keys or records. With a secret it is an HMAC-SHA256 under that secret: without the
# secret, no guess can be tested. A ``Keyring`` holds the secrets newest first: a digest is
# written under the newest (``digest``), and one stored earlier is looked up or checked
# under each (``digests``), so a secret can be rotated: ``[new, old]`` until what was keyed
# by ``old`` has expired.

#: The environment variable a backend built without ``secret=`` takes its secret from:
#: one secret, or several separated by commas, newest first.
SECRET_ENV = "AIORATELIMIT_SECRET"
#: The shortest secret accepted (bytes): 128 bits, when it is random.
MIN_SECRET_BYTES = 16

Secret = str | bytes | Sequence[str | bytes]


class Keyring:
    """The secrets of one backend, newest first (none: digests are unkeyed)."""

    __slots__ = ("_heads", "_keys")

    def __init__(self, keys: tuple[bytes, ...] = ()) -> None:
        self._keys = keys
        # (secret, purpose) -> the HMAC with the purpose already fed: each digest copies one.
        self._heads: dict[tuple[int, str], hmac.HMAC] = {}

    @property
    def keyed(self) -> bool:
        """Whether a secret keys the digests."""
        return bool(self._keys)

    def digest(self, purpose: str, data: bytes) -> str:
        """The digest to write for ``data`` (hex, 64 digits): HMAC-SHA256 under the newest
        secret of ``purpose``, a NUL and ``data`` (so a digest made for one purpose never
        stands for another), or without a secret the SHA-256 of ``data``."""
        if not self._keys:
            return hashlib.sha256(data).hexdigest()
        return self._mac(0, purpose, data)

    def digests(self, purpose: str, data: bytes) -> tuple[str, ...]:
        """The digest of ``data`` under each secret, newest first (one without a secret):
        what a value stored before a rotation may have been written as."""
        if not self._keys:
            return (hashlib.sha256(data).hexdigest(),)
        return tuple(self._mac(i, purpose, data) for i in range(len(self._keys)))

    def _mac(self, index: int, purpose: str, data: bytes) -> str:
        head = self._heads.get((index, purpose))
        if head is None:
            head = hmac.new(self._keys[index], purpose.encode() + b"\0", hashlib.sha256)
            if len(self._heads) < 64:  # purposes are a handful of constants
                self._heads[index, purpose] = head
        mac = head.copy()
        mac.update(data)
        return mac.hexdigest()

    def __repr__(self) -> str:  # never the secrets themselves
        return f"<Keyring {len(self._keys)} secret{'s' if len(self._keys) != 1 else ''}>"


#: The keyring of a backend without a secret.
UNKEYED = Keyring()


def keyring(secret: object, what: str = "secret") -> Keyring:
    """A ``Keyring`` of ``secret``: a str (UTF-8) or bytes of at least ``MIN_SECRET_BYTES``,
    or a non-empty list or tuple of them, newest first; ``None``: no secret. ``TypeError``
    or ``ValueError`` (naming ``what``, never the value) for anything else."""
    if secret is None:
        return UNKEYED
    items = list(secret) if isinstance(secret, (list, tuple)) else [secret]
    if not items:
        raise ValueError(f"{what} must hold at least one secret (newest first)")
    keys = []
    for item in items:
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, bytes):
            raise TypeError(
                f"{what} must be a str or bytes, or a list of them (newest first),"
                f" not {type(item).__name__}"
            )
        if len(item) < MIN_SECRET_BYTES:
            raise ValueError(
                f"{what} must be at least {MIN_SECRET_BYTES} bytes, each of them: a random"
                " key, e.g. secrets.token_urlsafe(32)"
            )
        keys.append(item)
    return Keyring(tuple(keys))


def resolve_secret(secret: object) -> Keyring:
    """The keyring of a backend: ``secret`` if given, else ``AIORATELIMIT_SECRET`` from the
    environment (comma-separated, newest first), else none."""
    if secret is not None:
        return keyring(secret)
    env = os.environ.get(SECRET_ENV, "")
    if not env.strip():
        return UNKEYED
    return keyring([part.strip() for part in env.split(",") if part.strip()], SECRET_ENV)
