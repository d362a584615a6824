"""Every Redis key aioratelimit writes is named here, and only here.

Layout: ``<prefix>:<kind>[:<name>]:{<user key>}<suffix>``.

The part in braces is the Redis Cluster hash tag. It is always the caller's own key, so all
keys of one decision (several rates, a lock and its fence) share one slot while different
user keys spread over the whole cluster; a constant tag would pile every key onto one shard.
Braces and ``%`` inside user-supplied parts are percent-escaped, which keeps the tag intact
(``{`` or ``}`` in a user key cannot end it early) and the mapping injective (two different
user keys never share a Redis key).
"""

from __future__ import annotations

_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


def escape(part: str) -> str:
    """Make ``part`` safe inside a key: no braces, and reversible."""
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
